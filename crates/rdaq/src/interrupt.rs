//! Ctrl-C and SIGTERM (`kill`, `systemctl stop`) for the commands: one handler per process
//! that sets the acquisition's stop flag, says so on stderr, and wakes whoever waits for it
//! (a dashboard that shows the summary until the operator wants out).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// What an interrupt came to: whether one came, and a wait for the next.
pub struct Interrupts {
    seen: Arc<AtomicBool>,
    next: Mutex<mpsc::Receiver<()>>,
}

impl Interrupts {
    /// Whether Ctrl-C or SIGTERM came.
    pub fn seen(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }

    /// Waits for Ctrl-C or SIGTERM (at once when one came already).
    pub fn wait(&self) {
        if !self.seen() {
            let _ = self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
        }
    }
}

/// From now on Ctrl-C and SIGTERM call `stop` and say `"{who}: interrupted, {doing}"`.
pub fn on_interrupt(who: &'static str, doing: &'static str, stop: impl Fn() + Send + 'static) -> Interrupts {
    let (tx, rx) = mpsc::channel();
    let seen = Arc::new(AtomicBool::new(false));
    let flag = seen.clone();
    // a second handler cannot be set: each command sets its one, once
    let _ = ctrlc::set_handler(move || {
        eprintln!("{who}: interrupted, {doing}");
        stop();
        flag.store(true, Ordering::Relaxed);
        let _ = tx.send(());
    });
    Interrupts { seen, next: Mutex::new(rx) }
}
