//! Every receive engine gets the same datagrams, whole and in order, header apart from
//! payload, payloads where the caller named, over a veth pair between two network
//! namespaces (AF_XDP needs an interface with a driver; the socket engines run there too).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rdaq_net::batch::Batch;
use rdaq_net::engine::{Engine, EngineKind, EngineSpec};
use rdaq_net::netns::VethPair;

const HDR: usize = 16;
const BODY: usize = 8192;
const N: usize = 600;

fn datagram(k: usize, port_index: usize) -> Vec<u8> {
    let mut d = vec![0u8; HDR + BODY];
    d[..8].copy_from_slice(&(k as u64).to_le_bytes());
    d[8] = port_index as u8;
    for (i, b) in d[HDR..].iter_mut().enumerate() {
        *b = (k * 7 + i / 64 + port_index) as u8;
    }
    d
}

fn run(kind: EngineKind) {
    let pair = match VethPair::create("eng", 9000) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipped: no veth pair between namespaces ({e})");
            return;
        }
    };
    let (rns, sns, rip) = (pair.receiver_ns.clone(), pair.sender_ns.clone(), pair.receiver_ip);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Vec<SocketAddr>>();
    let receiver = std::thread::spawn(move || {
        VethPair::enter(&rns).unwrap();
        let sockets: Vec<UdpSocket> = (0..2).map(|_| rdaq_net::socket::bind_receiver(SocketAddr::new(rip.into(), 0), 8 << 20).unwrap().0).collect();
        let spec = EngineSpec { sockets: &sockets, bind: rip.into(), batch: 32, hdr_len: HDR, landing_len: BODY, buffer_bytes: 16 << 20, roce: None };
        let mut engine = Engine::open(kind, &spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
        eprintln!("{}", engine.describe());
        ready_tx.send(sockets.iter().map(|s| s.local_addr().unwrap()).collect()).unwrap();
        let mut mem = vec![0u8; 2 * N * BODY];
        let mut got = [0usize; 2];
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.iter().sum::<usize>() < 2 * N && Instant::now() < deadline {
            for q in 0..engine.queues() {
                let base = mem.as_mut_ptr();
                let mut next = got;
                // SAFETY: each landing is the distinct BODY-byte place of the next datagram of
                // that channel inside `mem`, which outlives the call; past N, scratch.
                let n = unsafe {
                    engine.recv(q, |ch| {
                        let k = next[ch];
                        next[ch] += 1;
                        (k < N).then(|| base.add((ch * N + k) * BODY))
                    })
                }
                .unwrap();
                for i in 0..n {
                    let ch = engine.channel(i);
                    let h = engine.header(i);
                    assert_eq!(u64::from_le_bytes(h[..8].try_into().unwrap()) as usize, got[ch], "{kind}: in order on channel {ch}");
                    assert_eq!(h[8] as usize, ch, "{kind}: the datagram's channel is the port it was sent to");
                    assert_eq!(engine.datagram_len(i), HDR + BODY);
                    assert!(!engine.truncated(i));
                    assert_eq!(engine.payload(i).as_ptr(), mem[(ch * N + got[ch]) * BODY..].as_ptr(), "{kind}: landed where named");
                    got[ch] += 1;
                }
            }
        }
        assert_eq!(got, [N, N], "{kind}: every datagram");
        for ch in 0..2 {
            for k in 0..N {
                assert_eq!(&mem[(ch * N + k) * BODY..(ch * N + k + 1) * BODY], &datagram(k, ch)[HDR..], "{kind}: payload {k} of channel {ch}");
            }
        }
        assert_eq!(engine.drops_below(), 0);
    });
    let dests = ready_rx.recv().unwrap();
    let sender = std::thread::spawn(move || {
        VethPair::enter(&sns).unwrap();
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for k in 0..N {
            for (p, d) in dests.iter().enumerate() {
                s.send_to(&datagram(k, p), d).unwrap();
            }
            if k % 32 == 31 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    sender.join().unwrap();
    receiver.join().unwrap();
}

#[test]
fn recvmmsg_over_veth() {
    run(EngineKind::Recvmmsg);
}

#[test]
fn io_uring_over_veth() {
    run(EngineKind::IoUring);
}

#[test]
fn af_xdp_over_veth() {
    run(EngineKind::AfXdp);
}
