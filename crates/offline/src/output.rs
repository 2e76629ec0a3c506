//! The file a processing stage writes: refused early when it exists (unless overwriting) or
//! is a link, and made under a staging name renamed into place only once it is complete.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rdaq_sink::claim;

/// The file a stage writes.
pub struct Output {
    pub path: PathBuf,
    /// Replace `path` if it exists.
    pub overwrite: bool,
}

impl Output {
    /// Refuses, before any work, an output that exists (unless overwriting) or is a link.
    pub fn check(&self) -> anyhow::Result<()> {
        Ok(claim::refuse_existing([self.path.as_path()], self.overwrite)?)
    }

    /// Makes the output with `make`, which creates the file at the path it is given: a hidden
    /// staging name beside the output, renamed to it once `make` succeeded and removed when it
    /// failed. A failed stage leaves no output, and an output it was to overwrite as it was.
    /// The output's name is claimed first when it is new (never through a link).
    pub fn make<T>(&self, make: impl FnOnce(&Path) -> anyhow::Result<T>) -> anyhow::Result<T> {
        if self.overwrite {
            if claim::is_link(&self.path) {
                return Err(claim::ClaimError::Link(self.path.clone()).into());
            }
        } else {
            claim::claim(&self.path, false)?;
        }
        let tmp = claim::claim_staging(&self.path)?;
        match make(&tmp) {
            Ok(v) => {
                std::fs::rename(&tmp, &self.path).with_context(|| format!("cannot rename {} to {}", tmp.display(), self.path.display()))?;
                Ok(v)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if !self.overwrite {
                    let _ = std::fs::remove_file(&self.path);
                }
                Err(e)
            }
        }
    }
}
