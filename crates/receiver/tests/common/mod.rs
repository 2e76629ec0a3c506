//! Runs a receiver test once per receive engine: the socket engines over loopback, AF_XDP
//! over a veth pair between two network namespaces (loopback has no driver-mode XDP). The
//! test body opens the receiver on `receiver_ip` while the thread is on the receiver's side
//! (the receive thread stays there), then sends from the sender's side.

use std::net::{IpAddr, Ipv4Addr};

use rdaq_net::engine::EngineKind;
use rdaq_net::netns::VethPair;

pub struct Net {
    pub engine: EngineKind,
    pair: Option<VethPair>,
}

impl Net {
    pub fn receiver_ip(&self) -> IpAddr {
        self.pair.as_ref().map_or(Ipv4Addr::LOCALHOST, |p| p.receiver_ip).into()
    }

    pub fn sender_ip(&self) -> IpAddr {
        self.pair.as_ref().map_or(Ipv4Addr::LOCALHOST, |p| p.sender_ip).into()
    }

    /// A second sending host (all of 127/8 is loopback; on the veth pair, an added address).
    #[allow(dead_code)] // each test file uses part of this module
    pub fn stranger_ip(&self) -> IpAddr {
        self.pair.as_ref().map_or(Ipv4Addr::new(127, 0, 0, 2), |_| STRANGER).into()
    }

    /// Moves the calling thread to the receiver's side.
    pub fn as_receiver(&self) {
        if let Some(p) = &self.pair {
            VethPair::enter(&p.receiver_ns).unwrap();
        }
    }

    /// Moves the calling thread to the senders' side.
    pub fn as_sender(&self) {
        if let Some(p) = &self.pair {
            VethPair::enter(&p.sender_ns).unwrap();
        }
    }
}

const STRANGER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);

/// Runs `body` for `engine` in a thread of its own (it may change namespaces). AF_XDP is
/// skipped, saying why, where no veth pair can be made (not root, no iproute2).
pub fn on(engine: EngineKind, body: fn(&Net)) {
    let pair = match engine {
        EngineKind::AfXdp => match VethPair::create("rtest", 9000) {
            Ok(p) => {
                p.add_sender_ip(STRANGER).unwrap();
                Some(p)
            }
            Err(e) => {
                eprintln!("skipped: AF_XDP needs a veth pair between namespaces: {e}");
                return;
            }
        },
        _ => None,
    };
    let net = Net { engine, pair };
    std::thread::scope(|s| s.spawn(|| body(&net)).join()).unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// One test per engine: `engines!(body)` makes `body::recvmmsg`, `body::io_uring` and
/// `body::af_xdp`.
#[macro_export]
macro_rules! engines {
    ($body:ident) => {
        mod $body {
            use rdaq_net::engine::EngineKind;
            #[test]
            fn recvmmsg() {
                super::common::on(EngineKind::Recvmmsg, super::$body)
            }
            #[test]
            fn io_uring() {
                super::common::on(EngineKind::IoUring, super::$body)
            }
            #[test]
            fn af_xdp() {
                super::common::on(EngineKind::AfXdp, super::$body)
            }
        }
    };
}
