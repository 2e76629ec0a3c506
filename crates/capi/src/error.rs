//! Status codes and the calling thread's last error message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

/// What every call returns: 0, or a negative code; `rdaq_last_error` says more.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdaqStatus {
    Ok = 0,
    /// A pointer argument was null.
    Null = -1,
    /// The configuration is invalid (the message names the field).
    Config = -2,
    /// The receiver could not start (ports, memory).
    Start = -3,
    /// No frame arrived within the timeout.
    Timeout = -4,
    /// The receiver has finished: no more frames will come.
    Finished = -5,
    /// No such frame: never handed out, or released already.
    BadFrame = -6,
    /// No such receiver: never opened, or closed already.
    BadHandle = -7,
    /// The caller's buffer is too small (the message says how large it must be).
    Buffer = -8,
    /// A bug of librdaq's caught at the boundary (a panic); the message says where.
    Internal = -9,
    /// The acquisition failed while it ran (the message says why).
    Failed = -10,
    /// The acquisition has not finished yet: its summary is not there.
    Running = -11,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: its status and message.
pub struct Failure(pub RdaqStatus, pub String);

impl Failure {
    pub fn new(status: RdaqStatus, msg: impl Into<String>) -> Failure {
        Failure(status, msg.into())
    }
}

/// Records the outcome of a call as the thread's last error and returns its status.
pub fn report(r: Result<(), Failure>) -> RdaqStatus {
    let (status, msg) = match r {
        Ok(()) => (RdaqStatus::Ok, String::new()),
        Err(Failure(s, m)) => (s, m),
    };
    // a message with a NUL inside is cut there rather than lost
    let msg = CString::new(msg).unwrap_or_else(|e| CString::new(&e.into_vec()[..0]).expect("empty"));
    LAST.with(|l| *l.borrow_mut() = msg);
    status
}

/// The last error message of this thread (empty after a successful call). Valid until the
/// thread's next librdaq call.
pub fn last() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
