//! `rdaq bench stream`: images through the Stream V2 publisher to a consumer over loopback
//! TCP, beside a bare ZeroMQ PUSH/PULL pair sending messages of the same size in the same run
//! (same high-water mark, same blocking sends, one message per image, the consumer receiving
//! into one reused message). The images are real chunks: one JUNGFRAU module frame of the
//! synthetic detector, raw (uint16) and converted to photon counts (int32), bitshuffle-LZ4
//! compressed. The publisher's rows add what rdaq does per image: encoding the CBOR message
//! around the chunk (one copy of it); the last row adds decoding at the consumer, as
//! `rdaq write` does.

use std::process::ExitCode;
use std::time::Instant;

use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};
use rdaq_sink::{NxmxMeta, PixelType};
use rdaq_stream::{decode, Encoder, ImageInfo, Policy, Publisher, SocketKind, StreamConfig};

#[derive(clap::Args)]
pub struct StreamBenchArgs {
    /// Images per measurement.
    #[arg(long, default_value_t = 5000)]
    images: u64,
    /// The high-water mark of both sides.
    #[arg(long, default_value_t = 100)]
    hwm: i32,
    /// Measurements of each row, in turn; the table shows the best of each.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

/// What the consumer does with a message.
#[derive(Clone, Copy, PartialEq)]
enum Consume {
    Receive,
    Decode,
}

/// Receives `n` messages (after one handshake message) on a PULL socket connected to
/// `endpoint`; returns when the last came.
fn consumer(endpoint: String, n: u64, hwm: i32, what: Consume) -> std::thread::JoinHandle<Instant> {
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::PULL).expect("socket");
        s.set_rcvhwm(hwm).expect("hwm");
        s.connect(&endpoint).expect("connect");
        let mut m = zmq::Message::new();
        s.recv(&mut m, 0).expect("handshake");
        for _ in 0..n {
            s.recv(&mut m, 0).expect("recv");
            if what == Consume::Decode {
                std::hint::black_box(decode(&m).expect("a Stream V2 message"));
            }
        }
        Instant::now()
    })
}

/// Seconds for `n` messages of `msg`'s size through a bare PUSH/PULL pair.
fn bare(msg: &[u8], n: u64, hwm: i32) -> f64 {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::PUSH).expect("socket");
    s.set_sndhwm(hwm).expect("hwm");
    s.bind("tcp://127.0.0.1:*").expect("bind");
    let endpoint = s.get_last_endpoint().expect("endpoint").expect("utf-8");
    let done = consumer(endpoint, n, hwm, Consume::Receive);
    s.send(&b"go"[..], 0).expect("handshake");
    let t0 = Instant::now();
    for _ in 0..n {
        s.send(msg, 0).expect("send");
    }
    (done.join().expect("consumer") - t0).as_secs_f64()
}

/// Seconds for `n` images of `chunk` through rdaq's publisher.
fn published(meta: &NxmxMeta, chunk: &[u8], n: u64, hwm: i32, what: Consume) -> f64 {
    let cfg = StreamConfig { endpoint: "tcp://127.0.0.1:*".into(), socket: SocketKind::Push, hwm, policy: Policy::Block };
    let mut p = Publisher::bind(&cfg).expect("bind");
    let done = consumer(p.endpoint(), n, hwm, what);
    let mut enc = Encoder::new(meta, 1);
    p.image(&b"go"[..]).expect("handshake");
    let t0 = Instant::now();
    for i in 0..n {
        let info = ImageInfo { image_id: i, frame_number: i, missing: &[], spots: None, time_ns: (0, 0) };
        p.image(enc.image(&info, chunk)).expect("send");
    }
    (done.join().expect("consumer") - t0).as_secs_f64()
}

/// One module frame, raw and as photon counts, each compressed.
fn chunks() -> anyhow::Result<[(PixelType, Vec<u8>); 2]> {
    let cfg = SynthConfig::default();
    let e = cfg.photon_energy_kev;
    let mut synth = ModuleSynth::new(cfg, 0);
    let mc = synth.calibration();
    let conv = Converter::new(Calibration::unmasked(mc), InvalidGain::Error)?;
    let (mut raw, mut kev, mut photons) = (vec![0u16; MODULE_PIXELS], vec![0f32; MODULE_PIXELS], vec![0i32; MODULE_PIXELS]);
    synth.frame(1, &mut raw);
    conv.to_kev(&raw, &mut kev);
    kev_to_photons(&kev, e, &mut photons);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    Compressor::new(2, 0, Codec::Lz4).compress(bytes_of(&raw), &mut a);
    Compressor::new(4, 0, Codec::Lz4).compress(bytes_of(&photons), &mut b);
    Ok([(PixelType::Raw, a), (PixelType::Photons32, b)])
}

pub fn bench(a: StreamBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.images > 0 && a.hwm > 0 && a.rounds > 0, "--images, --hwm and --rounds must be positive");
    println!(
        "rdaq bench stream: {} images per row over loopback TCP, high-water mark {}, one JUNGFRAU module frame per image, best of {} rounds (rows in turn)",
        a.images, a.hwm, a.rounds
    );
    println!("{:<44} {:>10} {:>12} {:>9} {:>8}", "row", "msg bytes", "images/s", "GB/s", "vs bare");
    for (pixel, chunk) in chunks()? {
        let mut meta = NxmxMeta::jungfrau(Geometry::new(1, 1, 0, 0).expect("one module"), 12.4, 0.001);
        meta.pixel = pixel;
        let size = Encoder::new(&meta, 1).image(&ImageInfo { image_id: 0, frame_number: 0, missing: &[], spots: None, time_ns: (0, 0) }, &chunk).len();
        let msg = vec![7u8; size];
        let mut best = [f64::MAX; 3];
        for _ in 0..a.rounds {
            best[0] = best[0].min(bare(&msg, a.images, a.hwm));
            best[1] = best[1].min(published(&meta, &chunk, a.images, a.hwm, Consume::Receive));
            best[2] = best[2].min(published(&meta, &chunk, a.images, a.hwm, Consume::Decode));
        }
        let base = best[0];
        let rows = [
            ("bare ZeroMQ PUSH/PULL, same message size", best[0]),
            ("rdaq publisher (CBOR encode + send)", best[1]),
            ("rdaq publisher, consumer decodes (rdaq write)", best[2]),
        ];
        println!("-- {} image: {} -> {} bytes compressed", pixel.dtype(), MODULE_PIXELS * pixel.bytes(), chunk.len());
        for (name, secs) in rows {
            let rate = a.images as f64 / secs;
            println!("{name:<44} {size:>10} {rate:>12.0} {:>9.2} {:>7.0}%", rate * size as f64 / 1e9, 100.0 * base / secs);
        }
    }
    Ok(ExitCode::SUCCESS)
}
