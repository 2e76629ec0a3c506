//! The commit `rdaq --version` names: the short hash of HEAD in the repository the crate is
//! built in; `RDAQ_COMMIT` when it is built outside one (a source package); otherwise
//! "unknown commit".

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-env-changed=RDAQ_COMMIT");
    let commit = match (std::env::var("RDAQ_COMMIT"), git(dir, &["rev-parse", "--short=12", "HEAD"])) {
        (Ok(c), _) if !c.is_empty() => c,
        (_, Some(c)) => {
            // tracked files changed since the commit: the binary is not that commit's
            let dirty = git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            watch_git(dir);
            if dirty { format!("{c}-dirty") } else { c }
        }
        _ => "unknown commit".to_string(),
    };
    println!("cargo:rustc-env=RDAQ_VERSION_LONG={} ({commit})", env!("CARGO_PKG_VERSION"));
}

/// Builds again when HEAD moves or the index changes (a commit, a checkout, an add).
fn watch_git(dir: &Path) {
    let Some(git_dir) = git(dir, &["rev-parse", "--absolute-git-dir"]) else { return };
    let git_dir = Path::new(&git_dir);
    let branch = git(dir, &["symbolic-ref", "-q", "HEAD"]);
    // a file that does not exist would make cargo run this script on every build
    let files = ["HEAD", "index", "packed-refs"].into_iter().map(|f| git_dir.join(f)).chain(branch.map(|r| git_dir.join(r)));
    for f in files.filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
}
