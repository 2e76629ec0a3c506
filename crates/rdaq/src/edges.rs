//! A property test of the command line: every numeric option of every command, found in the
//! parser itself (a new option is covered without being listed), gets the values at the
//! edges of the number types (0, negative, NaN, the infinities, the largest) on a command
//! that is otherwise quick. The program must answer, with a result or a one-line error, and
//! never panic or hang. Each case runs in a child process of this test binary (the same
//! code as `main`), so that a panic in any thread, an abort or a hang is seen.

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::builder::ValueParser;
use clap::{CommandFactory, Parser};

use super::{dispatch, Cli};

const EDGES: [&str; 7] = ["0", "-1", "NaN", "inf", "-inf", "1e308", "18446744073709551615"];
/// The environment variable that hands a child its command line (arguments joined by 0x1f).
const CHILD: &str = "RDAQ_EDGE_ARGS";
/// A case still running after this long (a value that asks for a long run, 2^64 frames say)
/// is interrupted as an operator would interrupt it, and must then end within `GRACE`.
const RUNNING: Duration = Duration::from_secs(4);
const GRACE: Duration = Duration::from_secs(20);
const PARALLEL: usize = 4;

/// Whether the option's value is parsed into a number.
fn numeric(p: &ValueParser) -> bool {
    use std::any::TypeId as T;
    let t = p.type_id();
    [T::of::<f64>(), T::of::<f32>(), T::of::<u64>(), T::of::<u32>(), T::of::<u16>(), T::of::<u8>(), T::of::<usize>(), T::of::<i64>(), T::of::<i32>()]
        .iter()
        .any(|x| t == *x)
}

/// (the subcommand's path, the option's long name) of every numeric option.
fn numeric_options(c: &clap::Command, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
    for a in c.get_arguments().filter(|a| numeric(a.get_value_parser())) {
        out.push((path.to_vec(), a.get_long().expect("numeric options are long options").to_string()));
    }
    for s in c.get_subcommands() {
        numeric_options(s, &[path, &[s.get_name().to_string()]].concat(), out);
    }
}

/// A quick, harmless command line of the subcommand at `path` (in `dir`, holding the
/// fixtures); `case` keeps outputs apart.
fn base(path: &[String], case: usize) -> Option<Vec<String>> {
    let out = format!("out/{case}");
    let line = match path.join(" ").as_str() {
        "run" => format!("run --config c.toml --frames 2 --rate 100 --out {out} --stream none --preview none"),
        "write" => format!("write --from tcp://127.0.0.1:1 --out {out} --idle-timeout-s 1"),
        "preview" => format!("preview --file proc/rdaq_run_master.h5 --png {out}.png"),
        "emulate" => "emulate --buffers bm.json --frames 2 --rate 100".into(),
        "receive" => format!("receive --config c.toml --port 0 --frames 1 --timeout-s 1 --out {out}.h5"),
        "manage" => format!("manage --topology topo.toml --frames 2 --timeout-s 2 --out {out}"),
        "process convert" => format!("process convert --input raw/rdaq_run_master.h5 --calibration cal.h5 --output {out}.h5"),
        "process pedestal" => format!("process pedestal --input raw/rdaq_run_master.h5 --output {out}.h5 --min-frames 1"),
        "process spots" => format!("process spots --input proc/rdaq_run_master.h5 --output {out}.h5"),
        "bench ingest" => "bench ingest --datagrams 20000 --probe 20000 --seconds 0.2 --frame-rates 100".into(),
        "bench hosts" => "bench hosts --modules 1 --frames 100 --pool 1 --memory-mib 64".into(),
        "bench soak" => "bench soak --frames 100 --baseline-frames 0 --slots 64 --history-frames 64".into(),
        "bench process" => "bench process --frames 1 --seconds 0.1".into(),
        "bench pipeline" => "bench pipeline --modules 1 --seconds 0.2 --workers 1".into(),
        "bench gpu" => "bench gpu --frames 2 --workers 1".into(),
        "bench stream" => "bench stream --images 10 --rounds 1".into(),
        "bench join" => "bench join --images 2 --modules 2 --receivers 1".into(),
        "bench transport" => "bench transport --net loopback --engines recvmmsg --sizes 64 --bytes-per-size 20000 --datagrams 20000 --probe 20000 --latency-count 10 --breakdown-frames 0 --no-lossless".into(),
        "bench roce" => "bench roce --frames 2 --icrc-packets 10".into(),
        "bench write" => format!("bench write --images 4 --frames 2 --rounds 1 --dir {out}"),
        "bench api" => "bench api --frames 10 --drain-frames 4 --rounds 1".into(),
        _ => return None,
    };
    Some(line.split(' ').map(String::from).collect())
}

/// `line` with `--option=value` in place of the option's value there (`=`: a negative
/// value is a value, not an option).
fn with_value(mut line: Vec<String>, option: &str, value: &str) -> Vec<String> {
    let flag = format!("--{option}");
    if let Some(i) = line.iter().position(|a| *a == flag) {
        line.drain(i..i + 2);
    }
    line.push(format!("{flag}={value}"));
    line
}

/// A child of this test binary running `args` as `rdaq` would, its stderr into `err`.
fn spawn(dir: &Path, args: &[String], err: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    // SAFETY: between fork and exec the closure only calls signal(2), which is
    // async-signal-safe. A test started in the background of a shell inherits SIGINT
    // ignored; the child gets what an operator's Ctrl-C meets.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    command
        .args(["--exact", "edges::edge_case", "--include-ignored", "--nocapture", "--test-threads=1", "-q"])
        .env(CHILD, args.join("\x1f"))
        .env("RUST_BACKTRACE", "0")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(err).expect("stderr file"))
        .spawn()
        .expect("a child of the test binary")
}

/// What went wrong with one case, if anything: a panic, an abort, a hang.
fn verdict(dir: &Path, args: &[String], err: &Path) -> Option<String> {
    let mut child = spawn(dir, args, err);
    let start = Instant::now();
    let mut interrupted = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if !interrupted && start.elapsed() > RUNNING {
            // SAFETY: kill has no memory preconditions; the pid is our live child's.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            interrupted = true;
        }
        if start.elapsed() > RUNNING + GRACE {
            let _ = child.kill();
            let _ = child.wait();
            return Some(format!("rdaq {}: still running {GRACE:?} after SIGINT", args.join(" ")));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(err).unwrap_or_default();
    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
    let bad = status.code() == Some(101) || stderr.contains("panicked") || signal.is_some_and(|s| s != libc::SIGINT);
    bad.then(|| format!("rdaq {}: {status}: {}", args.join(" "), stderr.lines().find(|l| l.contains("panicked")).unwrap_or_else(|| stderr.lines().last().unwrap_or(""))))
}

/// Runs `args` to make a fixture; it must succeed.
fn fixture(dir: &Path, line: &str) {
    let args: Vec<String> = line.split(' ').map(String::from).collect();
    let err = dir.join("fixture.err");
    let status = spawn(dir, &args, &err).wait().expect("wait");
    assert!(status.success(), "fixture rdaq {line}: {status}: {}", std::fs::read_to_string(&err).unwrap_or_default());
}

/// The files the quick commands read: a small ring, a raw and a processed run, a
/// calibration, a buffer map, a topology whose daemons are not there.
fn fixtures(dir: &Path) {
    std::fs::create_dir_all(dir.join("out")).expect("fixture dir");
    std::fs::write(dir.join("c.toml"), "[receiver]\nring_mib = 16\n").expect("config");
    let nobody = "control = \"127.0.0.1:1\"\n";
    std::fs::write(dir.join("topo.toml"), format!("[detector]\nmodules = 1\n{nobody}[[receivers]]\nname = \"r\"\n{nobody}data = \"127.0.0.1\"\n")).expect("topology");
    fixture(dir, "run --config c.toml --raw --frames 4 --out raw --stream none --preview none");
    fixture(dir, "run --config c.toml --frames 4 --out proc --stream none --preview none");
    fixture(dir, "process pedestal --input raw/rdaq_run_master.h5 --output cal.h5 --min-frames 1");
    // the receiver stops after its timeout, exit 1 (nothing came), having written the map
    let _ = spawn(dir, &"receive --config c.toml --port 0 --frames 1 --timeout-s 0.2 --buffers-out bm.json".split(' ').map(String::from).collect::<Vec<_>>(), &dir.join("fixture.err")).wait();
    assert!(dir.join("bm.json").exists(), "the buffer map fixture");
}

/// Runs the cases, `PARALLEL` at once; what went wrong with each that failed.
fn run_cases(dir: &Path, cases: VecDeque<(usize, Vec<String>)>) -> Vec<String> {
    let queue = Mutex::new(cases);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let Some((case, args)) = queue.lock().unwrap().pop_front() else { break };
                if let Some(f) = verdict(dir, &args, &dir.join(format!("out/{case}.err"))) {
                    failures.lock().unwrap().push(f);
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

#[test]
fn numeric_options_at_their_edges_answer_without_panic_or_hang() {
    let dir = std::env::temp_dir().join(format!("rdaq-edges-{}", std::process::id()));
    fixtures(&dir);
    let mut options = Vec::new();
    numeric_options(&Cli::command(), &[], &mut options);
    assert!(options.len() > 100, "the parser lists {} numeric options", options.len());
    let mut cases = VecDeque::new();
    for (path, option) in &options {
        for value in EDGES {
            let line = base(path, cases.len()).unwrap_or_else(|| panic!("no quick command line of `rdaq {}` for its --{option}: add one to base()", path.join(" ")));
            cases.push_back((cases.len(), with_value(line, option, value)));
        }
    }
    let failures = run_cases(&dir, cases);
    assert!(failures.is_empty(), "{} of the cases panicked or hung:\n{}", failures.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dotted path of every number in `v` (a number in a list counts as the list's).
fn numeric_fields(v: &toml::Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        toml::Value::Integer(_) | toml::Value::Float(_) => {
            out.insert(path.to_string());
        }
        toml::Value::Array(a) if a.iter().any(|x| x.is_integer() || x.is_float()) => {
            out.insert(path.to_string());
        }
        toml::Value::Table(t) => {
            for (k, x) in t {
                numeric_fields(x, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
            }
        }
        _ => {}
    }
}

/// A configuration text setting `field` (section.name) to `value` (TOML), with the small
/// ring of the quick runs unless that is the field.
fn config_with(field: &str, value: &str, list: bool) -> String {
    let (section, name) = field.split_once('.').expect("fields are in sections");
    let value = if list { format!("[{value}]") } else { value.to_string() };
    match (section, name) {
        ("receiver", "ring_mib") => format!("[receiver]\nring_mib = {value}\n"),
        ("receiver", _) => format!("[receiver]\nring_mib = 16\n{name} = {value}\n"),
        _ => format!("[receiver]\nring_mib = 16\n[{section}]\n{name} = {value}\n"),
    }
}

/// Every number of the configuration (the defaults' and the example file's, which names the
/// optional ones) at the edges: the configuration refuses it with an error, or `rdaq run`
/// with it answers without panic or hang.
#[test]
fn configuration_numbers_at_their_edges_are_refused_or_run_without_panic() {
    let dir = std::env::temp_dir().join(format!("rdaq-config-edges-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("out")).expect("dir");
    let base = rdaq_run::config::Config::default();
    let mut fields = BTreeSet::new();
    numeric_fields(&toml::Value::try_from(&base).expect("the defaults serialize"), "", &mut fields);
    numeric_fields(&include_str!("../../../rdaq.example.toml").parse::<toml::Value>().expect("the example parses"), "", &mut fields);
    assert!(fields.len() > 30, "{} numeric fields", fields.len());
    let defaults = toml::Value::try_from(&base).expect("the defaults serialize");
    let example = include_str!("../../../rdaq.example.toml").parse::<toml::Value>().expect("the example parses");
    let mut cases = VecDeque::new();
    let (mut refused, mut panicked) = (0, Vec::new());
    for field in &fields {
        let list = [&defaults, &example].iter().any(|v| field.split('.').try_fold(*v, |v, k| v.get(k)).is_some_and(toml::Value::is_array));
        for value in ["0", "-1", "9223372036854775807", "0.0", "-1.0", "nan", "inf", "-inf", "1e308"] {
            let text = config_with(field, value, list);
            let Ok(accepted) = std::panic::catch_unwind(|| rdaq_run::config::Config::parse_over(base.clone(), &text, "edge").and_then(|c| c.check()).is_ok()) else {
                panicked.push(format!("{field} = {value}: reading the configuration panicked"));
                continue;
            };
            if !accepted {
                refused += 1;
                continue;
            }
            let case = cases.len();
            let file = format!("out/{case}.toml");
            std::fs::write(dir.join(&file), &text).expect("config file");
            let line = format!("run --config {file} --frames 2 --rate 100 --out out/{case} --stream none --preview none");
            cases.push_back((case, line.split(' ').map(String::from).collect()));
        }
    }
    eprintln!("{} numeric fields: {refused} edge values refused, {} run", fields.len(), cases.len());
    let failures = [panicked, run_cases(&dir, cases)].concat();
    assert!(failures.is_empty(), "{} of the cases panicked or hung:\n{}", failures.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One case, in a child process: the command line from the parent, run as `main` runs it.
#[test]
#[ignore = "a case of numeric_options_at_their_edges_answer_without_panic_or_hang, in its child process"]
fn edge_case() {
    let Ok(args) = std::env::var(CHILD) else { return };
    let argv = std::iter::once("rdaq".to_string()).chain(args.split('\x1f').map(String::from));
    let code = match Cli::try_parse_from(argv) {
        Ok(cli) => dispatch(cli),
        Err(e) => {
            let _ = e.print();
            ExitCode::from(e.exit_code() as u8)
        }
    };
    let status = [0u8, 1, 2, 3].into_iter().find(|&n| code == ExitCode::from(n)).unwrap_or(2);
    std::process::exit(i32::from(status));
}
