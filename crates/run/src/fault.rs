//! A bug on purpose, for the tests of what the graphs do when one of their workers panics:
//! a process, GPU or assemble worker that meets frame [`PANIC_FRAME`] panics. Compiled into
//! the tests only; no other test feeds that frame number.

/// The frame number that makes a worker panic.
pub(crate) const PANIC_FRAME: u64 = 7_777_777;

/// Panics at [`PANIC_FRAME`].
pub(crate) fn bug_at(frame: u64) {
    assert_ne!(frame, PANIC_FRAME, "a bug met frame {frame}");
}
