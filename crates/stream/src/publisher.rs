//! The ZeroMQ end of the stream: a PUSH socket (several PULL consumers share the images
//! round-robin) or a PUB socket (every subscriber sees every image), bound to an endpoint,
//! with a high-water mark that bounds the images queued. When the queue is full the policy
//! decides: `Block` waits for a consumer (the wait reaches the frame ring upstream: counted
//! as waits) and loses nothing the publisher sees; `Drop` drops the image (counted). A PUB
//! socket drops at its high-water mark whatever the policy (ZeroMQ's rule for PUB).
//!
//! Images already queued to a consumer that dies are lost with it: ZeroMQ does not hand
//! them back. `start` and `end` wait at most [`CONTROL_WAIT`] for a consumer under `Block`,
//! [`CONTROL_WAIT_DROP`] under `Drop` (enough for a consumer that connected first to finish
//! its handshake; a run without a consumer does not wait for one).

use std::time::Duration;

use thiserror::Error;

use crate::watch::{Watch, DRAIN_EVERY};

/// How long `start` and `end` wait for a consumer before they count as not sent (`Block`).
pub const CONTROL_WAIT: Duration = Duration::from_secs(2);
/// The same under `Drop`.
pub const CONTROL_WAIT_DROP: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketKind {
    Push,
    Pub,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Wait for a consumer: nothing is dropped, acquisition slows down instead.
    Block,
    /// Drop the image when the queue is full: acquisition never waits for the stream.
    Drop,
}

#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// ZeroMQ endpoint to bind, e.g. `tcp://127.0.0.1:31001`.
    pub endpoint: String,
    pub socket: SocketKind,
    /// Images queued at most (ZeroMQ's send high-water mark).
    pub hwm: i32,
    pub policy: Policy,
}

#[derive(Debug, Error)]
pub enum StreamError {
    #[error("stream endpoint {endpoint}: {source}")]
    Bind { endpoint: String, source: zmq::Error },
    #[error("stream: {0}")]
    Zmq(#[from] zmq::Error),
}

/// What the publisher did, for the summary, `/status` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamStats {
    pub images_sent: u64,
    /// Images dropped by the `Drop` policy (no consumer, or the queue was full).
    pub images_dropped: u64,
    /// Images that waited for a consumer under the `Block` policy.
    pub waits: u64,
    pub bytes_sent: u64,
    /// Whether the `start` and `end` messages went out.
    pub start_sent: bool,
    pub end_sent: bool,
    /// Consumers connected while images went out ([`crate::watch`]).
    #[serde(default)]
    pub consumers: u64,
    /// The most consumers connected at once.
    #[serde(default)]
    pub consumers_at_once: u64,
}

pub struct Publisher {
    sock: zmq::Socket,
    watch: Watch,
    /// Images sent when the monitor was last read.
    watched: u64,
    /// Keeps the ZeroMQ context alive as long as the socket.
    _ctx: zmq::Context,
    policy: Policy,
    kind: SocketKind,
    endpoint: String,
    pub stats: StreamStats,
}

impl Publisher {
    /// Binds the socket; fails naming the endpoint (in use, malformed).
    pub fn bind(cfg: &StreamConfig) -> Result<Publisher, StreamError> {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(match cfg.socket {
            SocketKind::Push => zmq::PUSH,
            SocketKind::Pub => zmq::PUB,
        })?;
        sock.set_sndhwm(cfg.hwm)?;
        // at the end, queued messages get this long to leave before the socket closes
        sock.set_linger(CONTROL_WAIT.as_millis() as i32)?;
        let watch = Watch::start(&ctx, &sock)?;
        sock.bind(&cfg.endpoint).map_err(|source| StreamError::Bind { endpoint: cfg.endpoint.clone(), source })?;
        Ok(Publisher { sock, watch, watched: 0, _ctx: ctx, policy: cfg.policy, kind: cfg.socket, endpoint: cfg.endpoint.clone(), stats: StreamStats::default() })
    }

    /// Whether hosts other than this one can connect: the socket is bound to a network
    /// address, not the loopback or a local transport (`ipc://`, `inproc://`).
    pub fn exposed(&self) -> bool {
        exposed(&self.endpoint)
    }

    /// Whether several consumers shared the images (PUSH, more than one at once): each
    /// has only part of the series.
    pub fn split(&self) -> bool {
        self.kind == SocketKind::Push && self.stats.consumers_at_once > 1
    }

    /// Reads the consumers' comings and goings into the stats.
    fn watch(&mut self) {
        self.watch.drain(self.stats.images_sent > self.watched);
        self.watched = self.stats.images_sent;
        self.stats.consumers = self.watch.readers.took_images;
        self.stats.consumers_at_once = self.watch.readers.most_at_once;
    }

    /// The endpoint the socket is bound to (a `tcp://*:0` endpoint says its port here).
    pub fn endpoint(&self) -> String {
        self.sock.get_last_endpoint().ok().and_then(|e| e.ok()).unwrap_or_else(|| self.endpoint.clone())
    }

    /// Sends `start` or `end`, waiting at most [`CONTROL_WAIT`] (or [`CONTROL_WAIT_DROP`])
    /// for a consumer.
    pub fn control(&mut self, msg: &[u8]) -> Result<bool, StreamError> {
        let wait = if self.policy == Policy::Drop { CONTROL_WAIT_DROP } else { CONTROL_WAIT };
        self.sock.set_sndtimeo(wait.as_millis() as i32)?;
        self.watch();
        let r = self.sock.send(msg, 0);
        self.sock.set_sndtimeo(-1)?;
        self.watch();
        match r {
            Ok(()) => Ok(true),
            Err(zmq::Error::EAGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether an image sent now would be taken, or waited for: a consumer is connected, or
    /// the policy waits for one (`Block`). Reads the monitor.
    pub fn wants_images(&mut self) -> bool {
        if self.policy == Policy::Block {
            return true;
        }
        self.watch();
        self.watch.is_read()
    }

    /// An image nobody would take (see [`Publisher::wants_images`]): counted as dropped, as
    /// [`Publisher::image`] would have, without being made or sent.
    pub fn pass(&mut self) {
        self.stats.images_dropped += 1;
    }

    /// Sends an image under the policy; counts it as sent or dropped.
    pub fn image(&mut self, msg: &[u8]) -> Result<(), StreamError> {
        match self.sock.send(msg, zmq::DONTWAIT) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) if self.policy == Policy::Drop => {
                self.stats.images_dropped += 1;
                return Ok(());
            }
            Err(zmq::Error::EAGAIN) => {
                self.stats.waits += 1;
                self.sock.send(msg, 0)?;
            }
            Err(e) => return Err(e.into()),
        }
        self.stats.images_sent += 1;
        self.stats.bytes_sent += msg.len() as u64;
        if self.stats.images_sent - self.watched >= DRAIN_EVERY {
            self.watch();
        }
        Ok(())
    }
}

/// Whether an endpoint lets other hosts connect: `tcp://` on any address but the loopback
/// (`127.0.0.0/8`, `::1`, `localhost`); every other transport is local to the host.
pub fn exposed(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    !(host == "localhost" || host == "::1" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_loopback_and_local_transports_are_private() {
        for e in ["tcp://*:31001", "tcp://0.0.0.0:31001", "tcp://10.0.0.5:31001", "tcp://[::]:31001", "tcp://eth0:31001", "tcp://receiver-host:1"] {
            assert!(exposed(e), "{e}");
        }
        for e in ["tcp://127.0.0.1:31001", "tcp://127.1.2.3:0", "tcp://localhost:31001", "tcp://[::1]:31001", "ipc:///tmp/s", "inproc://s"] {
            assert!(!exposed(e), "{e}");
        }
    }

    /// Two PULL consumers on a PUSH stream each take part of the images: the stats say two.
    #[test]
    fn counts_the_consumers_that_took_images() {
        let cfg = StreamConfig { endpoint: "tcp://127.0.0.1:0".into(), socket: SocketKind::Push, hwm: 1000, policy: Policy::Block };
        let mut p = Publisher::bind(&cfg).unwrap();
        let ctx = zmq::Context::new();
        let pulls: Vec<zmq::Socket> = (0..2).map(|_| ctx.socket(zmq::PULL).unwrap()).collect();
        for s in &pulls {
            s.connect(&p.endpoint()).unwrap();
        }
        let t = std::time::Instant::now();
        while p.watch.readers.connected < 2 && t.elapsed() < Duration::from_secs(10) {
            p.watch();
            std::thread::sleep(Duration::from_millis(5));
        }
        for _ in 0..10 {
            p.image(b"image").unwrap();
        }
        p.watch();
        assert_eq!((p.stats.consumers, p.stats.consumers_at_once), (2, 2));
        for s in &pulls {
            assert_eq!(s.recv_bytes(0).unwrap(), b"image", "each consumer got some of the images");
        }
    }

    /// CURVE needs libzmq built with libsodium; the zmq crate's vendored libzmq is built
    /// without, so rdaq cannot offer it (docs/operations.md#security-model says so).
    #[test]
    fn this_build_has_no_curve() {
        assert_eq!(zmq::has("curve"), Some(false));
    }
}
