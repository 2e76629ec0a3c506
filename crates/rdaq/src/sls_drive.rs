//! `rdaq receive --sls-detector HOST`: the options of a detector the receiver drives itself
//! ([`rdaq_run::drive`]).

use clap::Args;
use rdaq_run::drive::Driver;

#[derive(Args, Clone, Default)]
pub struct SlsArgs {
    /// Drive this PSI detector (its hostname; modules joined by +) through PSI's slsdet:
    /// point its UDP destinations at this receiver (--bind, --port, --interfaces), set
    /// --frames, the trigger mode (--trigger-mode), and --frame-time-s and --count-time-s
    /// when given; start it once listening, and end when it is done; with --pedestal-run,
    /// PSI's pedestal procedure (--frames / 3 frames each in dynamic, forced G1 and forced
    /// G2 gain). The service (--data-root) drives it for each trigger the same way. Needs
    /// rdaq's Python package with slsdet (pip install "rdaq[sls]").
    #[arg(long, value_name = "HOST")]
    pub sls_detector: Option<String>,
    /// The MAC address of this receiver's data interface (the detector's udp_dstmac;
    /// default: that of the interface holding --bind).
    #[arg(long, requires = "sls_detector")]
    pub receiver_mac: Option<String>,
    /// The Python that runs slsdet (the environment rdaq's Python package is installed in).
    #[arg(long, env = "RDAQ_PYTHON", default_value = "python3", requires = "sls_detector")]
    pub python: String,
}

impl SlsArgs {
    pub fn driver(&self) -> Driver {
        Driver { sls_detector: self.sls_detector.clone(), receiver_mac: self.receiver_mac.clone(), python: self.python.clone() }
    }
}
