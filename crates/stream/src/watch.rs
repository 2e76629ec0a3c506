//! Who reads the stream: the publisher's ZeroMQ socket monitor reports each consumer whose
//! handshake succeeded and each that went away. A consumer counts as having taken images
//! when it was connected while images went out; on a PUSH socket, two such consumers each
//! have only part of the series (ZeroMQ shares the images round-robin), which the summary
//! must say instead of "every image sent".
//!
//! The monitor is read between sends (every [`DRAIN_EVERY`] images, around `start` and
//! `end`, and before each image when the publisher asks whether anyone reads), so a
//! consumer that connects and leaves between two reads while images went out counts as
//! having taken some (it may have taken none): the count errs towards more readers, never
//! fewer.

use std::sync::atomic::{AtomicU64, Ordering};

/// Images sent between two reads of the monitor.
pub const DRAIN_EVERY: u64 = 64;

/// Distinguishes the monitor endpoints of the publishers of one process.
static NEXT_MONITOR: AtomicU64 = AtomicU64::new(0);

/// Counts of the consumers, for [`crate::StreamStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readers {
    /// Consumers that completed the ZeroMQ handshake.
    pub connected: u64,
    /// Consumers connected while images went out.
    pub took_images: u64,
    /// The most consumers connected at once.
    pub most_at_once: u64,
}

/// One open connection: its file descriptor (the monitor's name for it) and whether it
/// already counts in `took_images`.
struct Open {
    fd: u32,
    took: bool,
}

pub struct Watch {
    monitor: zmq::Socket,
    open: Vec<Open>,
    pub readers: Readers,
}

impl Watch {
    /// Starts the monitor of `sock` (a socket of `ctx`) and connects to it.
    pub fn start(ctx: &zmq::Context, sock: &zmq::Socket) -> Result<Watch, zmq::Error> {
        let endpoint = format!("inproc://rdaq-stream-monitor-{}", NEXT_MONITOR.fetch_add(1, Ordering::Relaxed));
        let events = zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32 | zmq::SocketEvent::DISCONNECTED as i32;
        sock.monitor(&endpoint, events)?;
        let monitor = ctx.socket(zmq::PAIR)?;
        monitor.connect(&endpoint)?;
        Ok(Watch { monitor, open: Vec::new(), readers: Readers::default() })
    }

    /// Reads the events that arrived; `images_went_out`: images were sent since the last call.
    pub fn drain(&mut self, images_went_out: bool) {
        if images_went_out {
            self.open.iter_mut().for_each(|o| self.readers.took_images += u64::from(!std::mem::replace(&mut o.took, true)));
        }
        while let Some((event, fd)) = self.next_event() {
            if event == zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16 {
                self.readers.connected += 1;
                self.readers.took_images += u64::from(images_went_out);
                self.open.push(Open { fd, took: images_went_out });
                self.readers.most_at_once = self.readers.most_at_once.max(self.open.len() as u64);
            } else if event == zmq::SocketEvent::DISCONNECTED as u16 {
                self.open.retain(|o| o.fd != fd);
            }
        }
    }

    /// Whether a consumer is connected (as of the last drain).
    pub fn is_read(&self) -> bool {
        !self.open.is_empty()
    }

    /// The next event waiting, as (event, value): ZeroMQ 4's two frames, the first 6 bytes
    /// (the event, u16, and its value, u32, both little-endian), the second the address.
    fn next_event(&self) -> Option<(u16, u32)> {
        let first = self.monitor.recv_bytes(zmq::DONTWAIT).ok()?;
        while self.monitor.get_rcvmore().unwrap_or(false) {
            if self.monitor.recv_bytes(zmq::DONTWAIT).is_err() {
                break;
            }
        }
        let head: [u8; 6] = first.get(..6)?.try_into().ok()?;
        Some((u16::from_le_bytes([head[0], head[1]]), u32::from_le_bytes([head[2], head[3], head[4], head[5]])))
    }
}
