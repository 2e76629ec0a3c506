//! librdaq: rdaq's receiver inside a C or C++ application (the RASHPA seed's LIBRASHPA
//! role). Open a receiver from a TOML configuration, wait for frames, read them in place,
//! release them, read the counters, close. docs/api.md has the ownership rules and a C++
//! example; `include/rdaq.h` is generated from this file by cbindgen.
//!
//! Receivers and frames are named by integer handles, never by pointers into librdaq, so
//! a wrong, stale or doubly used handle is an error code, not undefined behaviour. Every
//! call is thread-safe; every call returns an [`RdaqStatus`], and `rdaq_last_error` gives
//! the calling thread's message for the last one.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

mod config;
mod error;
mod registry;

pub use error::RdaqStatus;
use error::{report, Failure};

/// A frame handed to the caller: valid from `rdaq_next_frame` until `rdaq_release` of its
/// `id` (or `rdaq_receiver_close`).
#[repr(C)]
pub struct RdaqFrame {
    /// What to release it with.
    pub id: u64,
    /// The frame number the modules sent.
    pub number: u64,
    /// 0: complete; 1: incomplete (missing pixels hold 0xFFFF, see `rdaq_frame_missing`);
    /// 2: discarded (no data; `data` is null).
    pub status: i32,
    /// The modules' raw 16-bit words, `modules` x 512 rows x 1024 columns, little-endian,
    /// in the receiver's ring (read-only).
    pub data: *const u8,
    pub len: usize,
    pub modules: u16,
    /// Datagram cells that never arrived.
    pub missing_cells: u32,
}

/// The receiver's counters (at most about 10 ms old).
#[repr(C)]
#[derive(Default)]
pub struct RdaqCounters {
    pub datagrams: u64,
    pub placed: u64,
    pub bytes_placed: u64,
    pub frames_complete: u64,
    pub frames_incomplete: u64,
    pub frames_discarded: u64,
    /// Frames refused whole because every slot was held (the consumer was behind).
    pub frames_refused: u64,
    pub dropped: u64,
    pub nacks_sent: u64,
    pub placed_retransmitted: u64,
    pub frames_recovered: u64,
}

/// Runs `f`, turning a panic into [`RdaqStatus::Internal`], and records the outcome.
fn guarded(f: impl FnOnce() -> Result<(), Failure>) -> RdaqStatus {
    report(catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
        Err(Failure::new(RdaqStatus::Internal, format!("internal error (a bug of librdaq): {what}")))
    }))
}

fn null(what: &str) -> Failure {
    Failure::new(RdaqStatus::Null, format!("{what} is a null pointer"))
}

/// The calling thread's message for its last librdaq call ("" after a success). The text
/// is valid until the thread's next librdaq call.
#[no_mangle]
pub extern "C" fn rdaq_last_error() -> *const c_char {
    error::last()
}

/// Opens a receiver described by `config` (TOML: `modules`, `bind`, `port`, `slots`,
/// `frames`, `frame_timeout_ms`, `policy`, `engine`; all optional) and stores its handle
/// in `*handle`.
///
/// # Safety
/// `config` is null or a NUL-terminated string; `handle` is null or points to a writable
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdaq_receiver_open(config: *const c_char, handle: *mut u64) -> RdaqStatus {
    guarded(|| {
        if config.is_null() {
            return Err(null("config"));
        }
        if handle.is_null() {
            return Err(null("handle"));
        }
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let text = unsafe { CStr::from_ptr(config) }.to_str().map_err(|_| Failure::new(RdaqStatus::Config, "config: not UTF-8"))?;
        let cfg = config::parse(text).map_err(|e| Failure::new(RdaqStatus::Config, format!("config: {e}")))?;
        let h = registry::open(cfg)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *handle = h };
        Ok(())
    })
}

/// Copies the receiver's buffer map (JSON, what `rdaq emulate --buffers` reads) into
/// `buf` (`len` bytes, NUL-terminated); `*needed` gets the size it takes. `RDAQ_STATUS_BUFFER`
/// when `len` is too small (nothing is written then but `*needed`).
///
/// # Safety
/// `buf` is null or points to `len` writable bytes; `needed` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn rdaq_receiver_buffer_map(handle: u64, buf: *mut c_char, len: usize, needed: *mut usize) -> RdaqStatus {
    guarded(|| {
        let st = registry::station(handle)?;
        let json = serde_json::to_string(st.rx.buffer_map()).expect("a buffer map serializes");
        if !needed.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { *needed = json.len() + 1 };
        }
        if buf.is_null() {
            return Err(null("buf"));
        }
        if len < json.len() + 1 {
            return Err(Failure::new(RdaqStatus::Buffer, format!("buf: {len} bytes, the buffer map needs {}", json.len() + 1)));
        }
        // SAFETY: `buf` holds `len` >= json.len() + 1 writable bytes (caller's contract,
        // checked length); the source is a distinct Rust allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf as *mut u8, json.len());
            *buf.add(json.len()) = 0;
        }
        Ok(())
    })
}

/// Waits for the next frame, at most `timeout_ms` milliseconds (negative: until the
/// receiver finishes), and describes it in `*frame`. `RDAQ_STATUS_TIMEOUT`: none came in
/// time; `RDAQ_STATUS_FINISHED`: the receiver has finished and handed every frame.
///
/// # Safety
/// `frame` is null or points to a writable `RdaqFrame`.
#[no_mangle]
pub unsafe extern "C" fn rdaq_next_frame(handle: u64, timeout_ms: i64, frame: *mut RdaqFrame) -> RdaqStatus {
    guarded(|| {
        if frame.is_null() {
            return Err(null("frame"));
        }
        let st = registry::station(handle)?;
        let f = st.next(timeout_ms)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *frame = f };
        Ok(())
    })
}

/// Marks in `mask` (`len` bytes, one per pixel, at least `modules` x 512 x 1024) the
/// pixels of frame `id` whose datagram never arrived (1), the others 0.
///
/// # Safety
/// `mask` is null or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn rdaq_frame_missing(handle: u64, id: u64, mask: *mut u8, len: usize) -> RdaqStatus {
    guarded(|| {
        if mask.is_null() {
            return Err(null("mask"));
        }
        let st = registry::station(handle)?;
        // SAFETY: non-null, `len` writable bytes by the caller's contract; no other
        // reference to them exists in librdaq.
        let out = unsafe { std::slice::from_raw_parts_mut(mask, len) };
        st.missing(id, out)
    })
}

/// Gives frame `id` back to the receiver; its `data` must not be read afterwards.
/// `RDAQ_STATUS_BAD_FRAME` for an id never handed out or released already.
#[no_mangle]
pub extern "C" fn rdaq_release(handle: u64, id: u64) -> RdaqStatus {
    guarded(|| registry::station(handle)?.release(id))
}

/// The receiver's counters.
///
/// # Safety
/// `out` is null or points to a writable `RdaqCounters`.
#[no_mangle]
pub unsafe extern "C" fn rdaq_counters(handle: u64, out: *mut RdaqCounters) -> RdaqStatus {
    guarded(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = registry::station(handle)?.counters();
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = c };
        Ok(())
    })
}

/// Asks the receiver to finish: it receives until its ports are quiet, finishes the
/// frames in progress, and `rdaq_next_frame` says `RDAQ_STATUS_FINISHED` after the last.
#[no_mangle]
pub extern "C" fn rdaq_receiver_stop(handle: u64) -> RdaqStatus {
    guarded(|| {
        registry::station(handle)?.rx.stop();
        Ok(())
    })
}

/// Closes the receiver: stops it, releases every frame still held (their `data` becomes
/// invalid) and frees it once no call on it is running. The handle is invalid afterwards.
#[no_mangle]
pub extern "C" fn rdaq_receiver_close(handle: u64) -> RdaqStatus {
    guarded(|| registry::close(handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(config: &std::ffi::CStr) -> u64 {
        let mut h = 0;
        // SAFETY: a NUL-terminated string and a writable handle.
        assert_eq!(unsafe { rdaq_receiver_open(config.as_ptr(), &mut h) }, RdaqStatus::Ok);
        h
    }

    fn message() -> String {
        // SAFETY: librdaq's own NUL-terminated message, read before the next call.
        unsafe { CStr::from_ptr(rdaq_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn closing_ends_a_wait_in_another_thread_and_handles_go_stale() {
        let h = open(c"modules = 1\nslots = 2\n");
        let waiter = std::thread::spawn(move || {
            let mut f = std::mem::MaybeUninit::<RdaqFrame>::uninit();
            // SAFETY: a writable frame.
            unsafe { rdaq_next_frame(h, -1, f.as_mut_ptr()) }
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(rdaq_receiver_close(h), RdaqStatus::Ok);
        assert_eq!(waiter.join().unwrap(), RdaqStatus::Finished);
        assert_eq!(rdaq_release(h, 1), RdaqStatus::BadHandle);
        assert!(message().contains(&format!("handle {h}")), "{}", message());
        let mut c = RdaqCounters::default();
        // SAFETY: a writable counters struct.
        assert_eq!(unsafe { rdaq_counters(h, &mut c) }, RdaqStatus::BadHandle);
    }

    #[test]
    fn frames_never_handed_out_are_refused() {
        let h = open(c"");
        assert_eq!(rdaq_release(h, 42), RdaqStatus::BadFrame);
        assert!(message().contains("frame id 42"));
        let mut mask = [0u8; 4];
        // SAFETY: 4 writable bytes.
        assert_eq!(unsafe { rdaq_frame_missing(h, 42, mask.as_mut_ptr(), mask.len()) }, RdaqStatus::BadFrame);
        assert_eq!(rdaq_receiver_stop(h), RdaqStatus::Ok);
        assert_eq!(rdaq_receiver_close(h), RdaqStatus::Ok);
        assert_eq!(message(), "");
    }
}
