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
    /// ZeroMQ endpoint to bind, e.g. `tcp://*:31001`.
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
    /// Images dropped by the `Drop` policy (the queue was full).
    pub images_dropped: u64,
    /// Images that waited for a consumer under the `Block` policy.
    pub waits: u64,
    pub bytes_sent: u64,
    /// Whether the `start` and `end` messages went out.
    pub start_sent: bool,
    pub end_sent: bool,
}

pub struct Publisher {
    sock: zmq::Socket,
    /// Keeps the ZeroMQ context alive as long as the socket.
    _ctx: zmq::Context,
    policy: Policy,
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
        sock.bind(&cfg.endpoint).map_err(|source| StreamError::Bind { endpoint: cfg.endpoint.clone(), source })?;
        Ok(Publisher { sock, _ctx: ctx, policy: cfg.policy, endpoint: cfg.endpoint.clone(), stats: StreamStats::default() })
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
        let r = self.sock.send(msg, 0);
        self.sock.set_sndtimeo(-1)?;
        match r {
            Ok(()) => Ok(true),
            Err(zmq::Error::EAGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
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
        Ok(())
    }
}
