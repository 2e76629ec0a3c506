//! Stream V2 (Dectris SIMPLON, `docs/formats.md` section 5): every image of a series as one
//! CBOR message over ZeroMQ, between a `start` with the series' metadata and an `end`.
//!
//! - [`message`]: the messages, encoded without I/O (sans-I/O: testable byte for byte).
//! - [`consumer`]: the receiving socket.
//! - [`decode`]: the messages read back (sans-I/O), for the file writer.
//! - [`publisher`]: the ZeroMQ socket, its high-water mark and what happens when consumers
//!   are slower (block or drop, counted).
//! - [`watch`]: who reads the stream (the socket monitor's consumers).

pub mod consumer;
pub mod decode;
pub mod message;
pub mod publisher;
pub mod watch;

pub use zmq::Message as Buffer;

pub use consumer::Consumer;
pub use decode::{decode, DecodeError, Image, Message};
pub use message::{Encoder, ImageInfo};
pub use publisher::{exposed, Policy, Publisher, SocketKind, StreamConfig, StreamError, StreamStats};
