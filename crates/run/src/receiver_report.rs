//! What an acquisition says of its receiver: the host's transport settings and the receive
//! buffer at start, and the check of the ring's guards at the end.

use anyhow::bail;
use rdaq_receiver::Receiver;

/// Prints the host's transport settings as the receiver found them, and a warning line for
/// each known-bad one.
pub fn report_tuning(command: &str, rx: &Receiver) {
    for f in rx.tuning() {
        eprintln!("{command}: tuning: {}: {}", f.setting, f.value);
        if let Some(w) = &f.warning {
            eprintln!("{command}: warning: {w}");
        }
    }
}

/// The socket receive buffer asked for and what the kernel granted (Linux reports twice the
/// request, half of it for its own bookkeeping). Whether that is a cap, and what to do, is
/// the tuning check's warning ([`report_tuning`]), printed after the start line.
pub fn recv_buffer_line(asked: usize, granted: usize) -> String {
    format!("receive buffer {} MiB asked, {} MiB granted", asked >> 20, granted >> 20)
}

/// Fails when a guard region around the receiver's ring was overwritten (a bug of rdaq's:
/// nothing may write outside its buffers).
pub fn check_guards(rx: &Receiver) -> anyhow::Result<()> {
    if !rx.guards_intact() {
        bail!("a guard region around the frame ring was overwritten: this is a bug");
    }
    Ok(())
}
