//! `rdaq manage --data-root DIR --serve ADDR`: the acquisition service over a system of
//! daemons ([`crate::service`]). The system is configured once from the topology; each
//! dataset's triggers then run the detector daemon, and the receivers write under the data
//! root (`datasets`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod datasets;

use datasets::Worker;
use crate::dashboard::ProcessView;
use crate::http::lock;
use crate::manager::{Board, ManageArgs, Session};
use crate::service::{self, Backend, Image, Live, Serving};
use rdaq_manager::service::ArmRequest;

/// Serves the acquisition service until Ctrl-C: checks the system, then carries out the
/// datasets the API asks for, one at a time.
pub fn serve(a: &ManageArgs) -> anyhow::Result<ExitCode> {
    let root = service::data_root(a.data_root.as_deref().expect("--data-root given"))?;
    let access = a.access.access()?;
    let s = Session::connect(a, &access, 0)?;
    datasets::check_topology(&s)?;
    wait_for_daemons(&s)?;
    let receivers = s.plan.receivers.iter().map(|rp| s.t.receivers[rp.receiver].name.clone()).collect();
    let g = s.t.geometry();
    let access = Arc::new(access);
    let backend = Arc::new(System { board: s.shared.clone(), receivers });
    let serving = Serving {
        addr: a.serve.expect("--serve given with --data-root"),
        access: access.clone(),
        root,
        image: Image { height: g.height(), width: g.width() },
        backend,
        extra: crate::manager::board_router(s.shared.clone(), access),
        extra_described: crate::manager::board_described(),
        what: "manage",
    };
    service::serve(serving, |hub| Worker::new(s, hub))?;
    Ok(ExitCode::SUCCESS)
}

/// How long the service waits at start for daemons started with it (by a script, or by
/// systemd all at once).
const DAEMONS_WAIT: Duration = Duration::from_secs(30);

/// Checks the daemons against the topology, waiting up to [`DAEMONS_WAIT`] for those that
/// do not answer yet.
fn wait_for_daemons(s: &Session) -> anyhow::Result<()> {
    let deadline = Instant::now() + DAEMONS_WAIT;
    let mut said = false;
    loop {
        match s.check_telegrams() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline && format!("{e:#}").contains("Connection refused") => {
                if !said {
                    tracing::info!("waiting for the daemons ({e:#})");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The system as the service's API sees it: the manager's board, which the receivers'
/// answers fill.
struct System {
    board: Arc<Mutex<Board>>,
    /// The receivers' names (their files are `<prefix>_<name>_master.h5`).
    receivers: Vec<String>,
}

impl Backend for System {
    fn live(&self) -> (Live, u64) {
        let b = lock(&self.board);
        let base = |name: &str, k: &str| b.counters_base.get(name).and_then(|c| c[k].as_u64()).unwrap_or(0);
        let counted = |k: &str| b.receivers.iter().filter_map(|(name, (_, c))| Some(c.as_ref()?[k].as_u64()?.saturating_sub(base(name, k)))).sum();
        let live = Live { processing: ProcessView::sum(b.processing.values()), datagrams_dropped: counted("dropped"), frames_incomplete: counted("frames_incomplete"), threads: None };
        // the worker clears these between datasets
        (live, b.to_writer.values().sum())
    }

    /// The manager's files of the dataset, and the receivers' masters beside them.
    fn files(&self, dir: &Path, req: &ArmRequest) -> Vec<PathBuf> {
        let prefix = &req.prefix;
        let f = datasets::dataset_files(dir, prefix);
        let mut paths = vec![f.report, f.events, f.manifest, f.master];
        paths.extend(self.receivers.iter().map(|name| dir.join(format!("{prefix}_{name}_master.h5"))));
        paths
    }

    fn refuses(&self, req: &ArmRequest) -> Option<(&'static str, String)> {
        req.pedestal.then(|| ("pedestal", "a pedestal dataset is taken by the service of one receiver (rdaq receive --data-root --serve), not by the system's".into()))
    }

    fn stop_trigger(&self) {
        // the worker's watch stops the detector, as the dashboard's stop does
        lock(&self.board).stop_requested = true;
    }
}
