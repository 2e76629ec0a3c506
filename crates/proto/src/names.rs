//! The file and directory names a request carries (an output, a prefix, a directory), as
//! every API checks them where it reads them: what a client names stays inside the place
//! the daemon writes, and no name can forge a log line.

use std::path::{Component, Path};

/// A plain file name: not empty, no `/`, not hidden (no leading `.`, so neither `.` nor
/// `..`), no control characters.
pub fn is_plain_file_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name.starts_with('.') || name.chars().any(char::is_control))
}

/// A directory below a root: relative, without `..` (only plain components and `.`), no
/// control characters. Empty is the root itself.
pub fn is_relative_dir(dir: &str) -> bool {
    Path::new(dir).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) && !dir.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_where_they_are_put() {
        for ok in ["run1.h5", "a..b", "x_master.h5"] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "/etc", "x\ny", "x\u{7}"] {
            assert!(!is_plain_file_name(bad), "{bad:?}");
        }
        for ok in ["", ".", "a", "a/./b", "run1/scan2/"] {
            assert!(is_relative_dir(ok), "{ok:?}");
        }
        for bad in ["..", "../x", "a/../../b", "/etc", "a\nb"] {
            assert!(!is_relative_dir(bad), "{bad:?}");
        }
    }
}
