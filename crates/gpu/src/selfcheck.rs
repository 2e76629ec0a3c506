//! The exactness checks built into the binary: every kernel on this GPU against the CPU
//! stage it replaces, on the synthetic detector's frames, bit for bit. `rdaq check` prints
//! them as a table, so that copying rdaq to a GPU host and running it is the whole check of
//! that host; the crate's tests run the same checks.

use std::time::Instant;

use rdaq_detector::geometry::{DEFAULT_GAP_X, DEFAULT_GAP_Y, MASK_GAP};
use rdaq_detector::jungfrau::MODULE_PIXELS;
use rdaq_detector::synth::{ModuleSynth, SynthConfig};
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{default_block_elems, shuffle_block, shuffle_blocks};
use rdaq_process::pedestal::Pedestal;
use rdaq_process::sparse::Csr;
use rdaq_process::spots::{LocalSnr, LocalSnrParams};
use rdaq_process::{bytes_of, kev_to_photons, Calibration, Converter, InvalidGain};

use crate::chain::{self, ChainSetup, Counts, Found};
use crate::pedestal::{DevicePedestal, DARK_IN_FLIGHT};
use crate::probe::{Device, GpuError};
use crate::{GpuConverter, GpuCsr, GpuPedestal, GpuShuffle};

/// One check: what it compared, and `Ok(what was equal)` or `Err(the first difference)`.
pub struct Check {
    pub name: &'static str,
    pub result: Result<String, String>,
    pub ms: f64,
}

/// Every check, in order (a device error is that check's failure; the others still run).
pub fn all(dev: &Device) -> Vec<Check> {
    let data = Data::new();
    let checks: [(&'static str, CheckFn); 6] = [
        ("assembly + conversion to keV, 3 lanes in flight", chain_kev),
        ("strong pixels and spots (local SNR), 3 lanes", chain_spots),
        ("pedestal tracking of dark frames (from module words)", pedestal),
        ("photon counts (int16, int32) from keV, 3 lanes, bitshuffled", photons),
        ("bitshuffle transposition (int16, float32)", bitshuffle),
        ("CSR compaction (float32, int32)", csr),
    ];
    checks
        .into_iter()
        .map(|(name, f)| {
            let t = Instant::now();
            let result = f(dev, &data).unwrap_or_else(|e| Err(format!("device error: {e}")));
            Check { name, result, ms: t.elapsed().as_secs_f64() * 1e3 }
        })
        .collect()
}

/// A check's answer, or the device error that stopped it.
type Outcome = Result<Result<String, String>, GpuError>;

type CheckFn = fn(&Device, &Data) -> Outcome;

/// Two modules side by side with their gaps, a few frames of the synthetic detector with
/// every special word, and the image's calibration (gap pixels masked).
struct Data {
    g: Geometry,
    frames: Vec<Vec<u16>>,
    cal: Calibration,
    finder: LocalSnrParams,
    photon_kev: f32,
}

impl Data {
    fn new() -> Data {
        let g = Geometry::new(2, 2, DEFAULT_GAP_X, DEFAULT_GAP_Y).expect("two modules side by side");
        let cfg = SynthConfig { spots_per_frame: 40.0, hit_fraction: 1.0, ..SynthConfig::default() };
        let e = cfg.photon_energy_kev;
        let mut synths: Vec<ModuleSynth> = (0..2).map(|m| ModuleSynth::new(cfg.clone(), m)).collect();
        let px = g.height() * g.width();
        let mut cal = Calibration { pedestal: [vec![0.0; px], vec![0.0; px], vec![0.0; px]], gain: [vec![1.0; px], vec![1.0; px], vec![1.0; px]], mask: g.gap_mask() };
        for (m, s) in synths.iter().enumerate() {
            let mc = s.calibration();
            g.module_runs(m as u16, |from, at, run| {
                for k in 0..3 {
                    cal.pedestal[k][at..at + run].copy_from_slice(&mc.pedestal[k][from..from + run]);
                    cal.gain[k][at..at + run].copy_from_slice(&mc.gain[k][from..from + run]);
                }
            });
        }
        cal.mask[px / 2 + 7] |= 1;
        let frames = (0..5u64)
            .map(|f| {
                let mut words = vec![0u16; 2 * MODULE_PIXELS];
                for (m, s) in synths.iter_mut().enumerate() {
                    s.frame(f, &mut words[m * MODULE_PIXELS..(m + 1) * MODULE_PIXELS]);
                }
                // every special word and gain code, and a saturated pixel inside a spot's box
                words[..6].copy_from_slice(&[0xffff, 0xc000, 0x4000, 0x8123, 0x4567, 0xc321]);
                words[MODULE_PIXELS + 300 * 1024 + 500] = 0xc000;
                words
            })
            .collect();
        Data { g, frames, cal, finder: LocalSnrParams::for_photon_energy(e), photon_kev: e }
    }

    fn pixels(&self) -> usize {
        self.g.height() * self.g.width()
    }

    /// The CPU's keV image of frame `f` with `cal` (gaps NaN).
    fn kev(&self, cal: &Calibration, f: usize) -> Vec<f32> {
        let conv = Converter::new(cal.clone(), InvalidGain::Error).expect("a valid calibration");
        let mut image = vec![f32::NAN; self.pixels()];
        conv.to_kev_runs(&self.g.runs_in_image_order(), &self.frames[f], &mut image);
        image
    }
}

/// The raw image of module words `words` along `map` (gaps: the error word), as the device's
/// `assemble_words` makes it.
fn assembled(map: &[i32], words: &[u16]) -> Vec<u16> {
    map.iter().map(|&s| if s < 0 { 0xffff } else { words[s as usize] }).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())
}

/// The frames through a chain of 3 lanes, all in flight before the first is collected;
/// `each(frame, lane)` checks one.
fn through_lanes(dev: &Device, d: &Data, mut each: impl FnMut(usize, &mut chain::Lane) -> Result<Option<String>, GpuError>) -> Outcome {
    let map = d.g.pixel_map();
    let setup = ChainSetup { width: d.g.width(), height: d.g.height(), words: 2 * MODULE_PIXELS, src_of: &map, calibration: &d.cal, invalid: InvalidGain::Error, finder: d.finder };
    let mut lanes = chain::lanes(dev, &setup, 3)?;
    for (k, frames) in d.frames.chunks(3).enumerate() {
        for (lane, words) in lanes.iter_mut().zip(frames) {
            // SAFETY: `d.frames` outlives the lanes' waits below and is not written
            unsafe { lane.submit(words) }?;
        }
        for (i, lane) in lanes.iter_mut().take(frames.len()).enumerate() {
            if let Some(diff) = each(3 * k + i, lane)? {
                return Ok(Err(diff));
            }
        }
    }
    Ok(Ok(format!("{} frames of {} x {} pixels equal", d.frames.len(), d.g.height(), d.g.width())))
}

fn chain_kev(dev: &Device, d: &Data) -> Outcome {
    let mut got = vec![0f32; d.pixels()];
    let out = through_lanes(dev, d, |f, lane| {
        lane.strong_pixels(&mut Vec::new())?;
        lane.image_into(&mut got)?;
        Ok(same_bits(&d.kev(&d.cal, f), &got).map(|p| format!("frame {f}: pixel {p} differs")))
    })?;
    if out.is_err() {
        return Ok(out);
    }
    // a published pedestal: the lane takes it before its next frame
    let mut cal = d.cal.clone();
    cal.pedestal[0].iter_mut().enumerate().for_each(|(i, p)| *p += (i % 7) as f32 * 0.37);
    let map = d.g.pixel_map();
    let setup = ChainSetup { width: d.g.width(), height: d.g.height(), words: 2 * MODULE_PIXELS, src_of: &map, calibration: &d.cal, invalid: InvalidGain::Error, finder: d.finder };
    let mut lane = chain::lanes(dev, &setup, 1)?.pop().expect("one lane");
    lane.set_pedestal(&cal.pedestal[0], 1)?;
    // SAFETY: `d.frames` outlives the lane's wait below and is not written
    unsafe { lane.submit(&d.frames[1]) }?;
    lane.strong_pixels(&mut Vec::new())?;
    lane.image_into(&mut got)?;
    if let Some(p) = same_bits(&d.kev(&cal, 1), &got) {
        return Ok(Err(format!("after a new pedestal: pixel {p} differs")));
    }
    // another, left on the device by the tracker's stream: the lane copies it there
    cal.pedestal[0].iter_mut().enumerate().for_each(|(i, p)| *p -= (i % 5) as f32 * 0.61);
    let s = dev.ctx.new_stream()?;
    let on_device = DevicePedestal(std::sync::Arc::new(s.clone_htod(&cal.pedestal[0])?));
    s.synchronize()?;
    lane.set_pedestal_device(&on_device, 2)?;
    // SAFETY: as above
    unsafe { lane.submit(&d.frames[2]) }?;
    lane.strong_pixels(&mut Vec::new())?;
    lane.image_into(&mut got)?;
    if let Some(p) = same_bits(&d.kev(&cal, 2), &got) {
        return Ok(Err(format!("after a new pedestal on the device: pixel {p} differs")));
    }
    Ok(out.map(|s| format!("{s}, and after new pedestals from the host and the device")))
}

fn chain_spots(dev: &Device, d: &Data) -> Outcome {
    let (mut cpu, mut host) = (LocalSnr::new(d.finder), LocalSnr::new(d.finder));
    let (mut want, mut got, mut strong, mut total) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let out = through_lanes(dev, d, |f, lane| {
        if let Found::TooMany(n) = lane.strong_pixels(&mut strong)? {
            return Ok(Some(format!("frame {f}: {n} strong pixels, more than the lanes list")));
        }
        let kev = d.kev(&d.cal, f);
        cpu.find(&kev, d.g.width(), d.g.height(), &mut want);
        if !cpu.last_strong().eq(strong.iter().copied()) {
            return Ok(Some(format!("frame {f}: strong pixels differ")));
        }
        host.group_strong_pixels(d.g.width(), strong.iter().copied(), &mut got);
        total += want.len();
        Ok((got != want).then(|| format!("frame {f}: spots differ")))
    })?;
    Ok(out.map(|s| format!("{s}, {total} spots")))
}

fn pedestal(dev: &Device, d: &Data) -> Outcome {
    let px = d.pixels();
    let map = d.g.pixel_map();
    let mut gpu = GpuPedestal::new(dev, px, 0, 3)?.assembling(dev, &map, 2 * MODULE_PIXELS)?;
    let mut cpu = Pedestal::<f64>::new(px, 0, 3);
    // the frames twice over, one waited for, then more queued at once than the tracker holds
    let (first, rest) = d.frames.split_first().expect("frames to check with");
    gpu.push_words(first)?;
    for words in rest.iter().chain(&d.frames) {
        // SAFETY: `d.frames` outlives the tracker, and nothing writes them.
        unsafe { gpu.submit_words(words) }?;
    }
    if gpu.reading(0)? != 0 {
        return Ok(Err("dark frames still being copied after waiting for them".into()));
    }
    for words in d.frames.iter().chain(&d.frames) {
        cpu.push(&assembled(&map, words));
    }
    let mut want = vec![0f32; px];
    cpu.mean_into(&mut want);
    let got = gpu.mean()?;
    if let Some(p) = same_bits(&want, &got) {
        return Ok(Err(format!("pedestal of pixel {p} differs")));
    }
    if gpu.wrong_gain()? != cpu.wrong_gain() {
        return Ok(Err("wrong-gain counts differ".into()));
    }
    Ok(Ok(format!("{} dark frames (up to {DARK_IN_FLIGHT} in flight), window 3, equal", 2 * d.frames.len())))
}

fn photons(dev: &Device, d: &Data) -> Outcome {
    let px = d.pixels();
    let conv = GpuConverter::new(dev, &d.cal, InvalidGain::Error)?;
    let map = d.g.pixel_map();
    for (f, words) in d.frames.iter().enumerate() {
        let raw = assembled(&map, words);
        let mut want = vec![0i32; px];
        kev_to_photons(&d.kev(&d.cal, f), d.photon_kev, &mut want);
        if conv.to_photons(&raw, d.photon_kev)? != want {
            return Ok(Err(format!("frame {f}: counts differ")));
        }
    }
    let (mut got16, mut got32, mut want16, mut want32) = (vec![0i16; px], vec![0i32; px], vec![0i16; px], vec![0i32; px]);
    let (mut shuffled16, mut shuffled32) = (vec![0u8; 2 * px], vec![0u8; 4 * px]);
    let out = through_lanes(dev, d, |f, lane| {
        lane.strong_pixels(&mut Vec::new())?;
        let kev = d.kev(&d.cal, f);
        kev_to_photons(&kev, d.photon_kev, &mut want16);
        kev_to_photons(&kev, d.photon_kev, &mut want32);
        lane.photons_into(d.photon_kev, None, Counts::I16(&mut got16))?;
        lane.photons_into(d.photon_kev, None, Counts::I32(&mut got32))?;
        if got16 != want16 || got32 != want32 {
            return Ok(Some(format!("frame {f}: a lane's counts differ")));
        }
        // the chunk writer's blocks, and a block that leaves a short last one and a tail
        for block in [default_block_elems(2), 1000] {
            shuffle_blocks(bytes_of(&want16), 2, block, &mut shuffled16);
            shuffle_blocks(bytes_of(&want32), 4, block, &mut shuffled32);
            lane.photons_into(d.photon_kev, Some(block), Counts::I16(&mut got16))?;
            lane.photons_into(d.photon_kev, Some(block), Counts::I32(&mut got32))?;
            if bytes_of(&got16) != shuffled16 || bytes_of(&got32) != shuffled32 {
                return Ok(Some(format!("frame {f}: a lane's bitshuffled counts differ (blocks of {block})")));
            }
        }
        Ok(None)
    })?;
    Ok(out.map(|s| format!("{s}, by the converter and the lanes, plain and bitshuffled")))
}

fn bitshuffle(dev: &Device, _: &Data) -> Outcome {
    let gpu = GpuShuffle::new(dev)?;
    for (size, n) in [(2usize, MODULE_PIXELS), (4, MODULE_PIXELS), (4, 5000 * 8 + 5)] {
        let data: Vec<u8> = (0..n * size).map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8).collect();
        let block = default_block_elems(size);
        let mut want = vec![0u8; data.len()];
        for b0 in (0..n).step_by(block) {
            let whole = (n - b0).min(block) / 8 * 8;
            let (s, e) = (b0 * size, (b0 + whole) * size);
            shuffle_block(&data[s..e], &mut want[s..e], size);
        }
        let tail = n / 8 * 8 * size;
        want[tail..].copy_from_slice(&data[tail..]);
        if gpu.shuffle(&data, size, block)? != want {
            return Ok(Err(format!("{n} elements of {size} bytes differ")));
        }
    }
    Ok(Ok("3 arrays equal".into()))
}

fn csr(dev: &Device, d: &Data) -> Outcome {
    let gpu = GpuCsr::new(dev)?;
    let (rows, cols) = (d.g.height(), d.g.width());
    let kev: Vec<f32> = d.kev(&d.cal, 0).iter().zip(&d.cal.mask).map(|(&v, &m)| if m & MASK_GAP != 0 { 0.0 } else { v }).collect();
    let (mut want, mut got) = (Csr::default(), Csr::default());
    want.fill(&kev, rows, cols, 12.0);
    gpu.fill_host(&kev, rows, cols, 12.0, &mut got)?;
    if got.row_ptr != want.row_ptr || got.cols != want.cols || same_bits(&got.values, &want.values).is_some() {
        return Ok(Err("float32 entries differ".into()));
    }
    let floats = want.values.len();
    let counts: Vec<i32> = kev.iter().map(|v| if v.is_finite() { *v as i32 } else { -1 }).collect();
    let (mut want, mut got) = (Csr::default(), Csr::default());
    want.fill(&counts, rows, cols, 0);
    gpu.fill_host(&counts, rows, cols, 0, &mut got)?;
    if got != want {
        return Ok(Err("int32 entries differ".into()));
    }
    Ok(Ok(format!("{floats} float32 and {} int32 entries equal", want.values.len())))
}
