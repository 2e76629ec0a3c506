//! The receiving end: a PULL socket (one of the consumers sharing a PUSH stream) or a SUB
//! socket (every image of a PUB stream), connected to a publisher's endpoint.

use std::time::Duration;

use crate::publisher::{SocketKind, StreamError};

pub struct Consumer {
    sock: zmq::Socket,
    _ctx: zmq::Context,
}

impl Consumer {
    /// Connects to `endpoint` (`kind` names the publisher's socket: PUSH or PUB). ZeroMQ
    /// connects in the background: a publisher that starts later is found.
    pub fn connect(endpoint: &str, kind: SocketKind, hwm: i32) -> Result<Consumer, StreamError> {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(match kind {
            SocketKind::Push => zmq::PULL,
            SocketKind::Pub => zmq::SUB,
        })?;
        if kind == SocketKind::Pub {
            sock.set_subscribe(b"")?;
        }
        sock.set_rcvhwm(hwm)?;
        sock.connect(endpoint).map_err(|source| StreamError::Bind { endpoint: endpoint.into(), source })?;
        Ok(Consumer { sock, _ctx: ctx })
    }

    /// The next message into `buf`; false when none came within `wait`.
    pub fn recv(&mut self, buf: &mut zmq::Message, wait: Duration) -> Result<bool, StreamError> {
        self.sock.set_rcvtimeo(wait.as_millis() as i32)?;
        match self.sock.recv(buf, 0) {
            Ok(()) => Ok(true),
            Err(zmq::Error::EAGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
