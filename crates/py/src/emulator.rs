//! `rdaq.Emulator`: emulated JUNGFRAU modules sending synthetic frames to a receiver's
//! buffers (as `rdaq emulate`), in a thread of their own.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rdaq_emulator::{Control, EmulatorConfig, EmulatorReport};
use rdaq_proto::telegram::BufferMap;

type Outcome = Result<EmulatorReport, rdaq_emulator::EmulatorError>;

/// Emulated modules sending `frames` frames at `rate` Hz (0: as fast as possible) to the
/// receiver whose `buffer_map` (JSON) is given, at `target`. `pool` > 0 synthesizes that
/// many frames once and sends them in turn (for throughput tests; the manifest records
/// what was sent); 0 synthesizes every frame. For tests: `loss` drops that fraction of
/// datagrams on purpose, and `retransmit=False` keeps no history to resend them from.
#[pyclass(module = "rdaq._rdaq")]
pub struct Emulator {
    cfg: EmulatorConfig,
    map: BufferMap,
    target: IpAddr,
    control: Arc<Control>,
    thread: Option<JoinHandle<Outcome>>,
}

#[pymethods]
impl Emulator {
    #[new]
    #[pyo3(signature = (buffer_map, frames=10, rate=100.0, seed=1, target="127.0.0.1", pool=0, loss=0.0, retransmit=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(buffer_map: &str, frames: u64, rate: f64, seed: u64, target: &str, pool: usize, loss: f64, retransmit: bool) -> PyResult<Emulator> {
        let map: BufferMap = serde_json::from_str(buffer_map).map_err(|e| PyValueError::new_err(format!("buffer_map: {e}")))?;
        let target = target.parse().map_err(|_| PyValueError::new_err(format!("target: {target:?} is not an IP address")))?;
        if !(rate >= 0.0 && rate.is_finite()) {
            return Err(PyValueError::new_err(format!("rate: {rate} is not 0 (full speed) or a positive number of frames per second")));
        }
        let mut cfg = EmulatorConfig { modules: map.modules, frames, rate_hz: (rate > 0.0).then_some(rate), frame_pool: pool, ..EmulatorConfig::default() };
        cfg.synth.seed = seed;
        if loss != 0.0 {
            let f = rdaq_emulator::FaultConfig { seed, loss, ..rdaq_emulator::FaultConfig::default() };
            f.check().map_err(|e| PyValueError::new_err(format!("loss: {e}")))?;
            cfg.faults = Some(f);
        }
        if !retransmit {
            cfg.history_bytes = 0;
        }
        Ok(Emulator { cfg, map, target, control: Arc::default(), thread: None })
    }

    /// Starts sending in the background.
    fn start(&mut self) -> PyResult<()> {
        if self.thread.is_some() {
            return Err(PyRuntimeError::new_err("the emulator was started already"));
        }
        let dtps: Vec<_> = (0..self.map.modules).map(|m| rdaq_proto::telegram::ModuleDtp::single(&self.map, m, SocketAddr::new(self.target, self.map.data_ports[m as usize]))).collect();
        let (cfg, control) = (self.cfg.clone(), self.control.clone());
        self.thread = Some(std::thread::Builder::new().name("rdaq-emulator".into()).spawn(move || rdaq_emulator::run(&cfg, &dtps, control)).map_err(|e| PyRuntimeError::new_err(e.to_string()))?);
        Ok(())
    }

    /// Stops sending after the frame in progress.
    fn stop(&self) {
        self.control.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits until everything was sent; returns the manifest: (frame, module, xxh3-64 of
    /// the raw module frame) for every module frame sent.
    fn join(&mut self, py: Python<'_>) -> PyResult<Vec<(u64, u16, u64)>> {
        let t = self.thread.take().ok_or_else(|| PyRuntimeError::new_err("the emulator was not started"))?;
        let report = py.detach(|| t.join()).map_err(|_| PyRuntimeError::new_err("the emulator thread panicked"))?;
        let report = report.map_err(|e| PyRuntimeError::new_err(format!("emulator: {e}")))?;
        Ok(report.manifest.iter().map(|e| (e.frame, e.module, e.xxh3)).collect())
    }

    /// Sends everything and returns the manifest (`start` then `join`).
    fn run(&mut self, py: Python<'_>) -> PyResult<Vec<(u64, u16, u64)>> {
        self.start()?;
        self.join(py)
    }
}
