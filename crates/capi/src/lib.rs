//! librdaq: rdaq inside a C or C++ application (the RASHPA seed's LIBRASHPA role). A
//! receiver: open it from a TOML configuration, wait for raw frames, read them in place,
//! release them, read the counters, close. An acquisition (`rdaq_acquisition_*`): the one
//! `rdaq run` and `rdaq receive` run, configured by rdaq.example.toml's sections, its
//! processed frames read in place the same way. docs/api.md has the ownership rules and a
//! C++ example; `include/rdaq.h` is generated from this crate by cbindgen.
//!
//! Receivers and frames are named by integer handles, never by pointers into librdaq, so
//! a wrong, stale or doubly used handle is an error code, not undefined behaviour. Every
//! call is thread-safe; every call returns an [`RdaqStatus`], and `rdaq_last_error` gives
//! the calling thread's message for the last one.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

mod acquisition;
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

/// A processed frame of an acquisition handed to the caller: valid from
/// `rdaq_acquisition_next` until `rdaq_acquisition_release` of its `id` (or
/// `rdaq_acquisition_close`).
#[repr(C)]
pub struct RdaqImage {
    /// What to release it with.
    pub id: u64,
    /// The frame number.
    pub number: u64,
    /// The pixels as the files hold them: 0, int16 photon counts; 1, int32 photon counts;
    /// 2, float32 keV (with the files' saturation and no-data markers); a counting
    /// detector's counts: 3, uint8; 4, uint16; 5, uint32 (little-endian, maybe unaligned).
    pub pixel: i32,
    /// `height` rows of `width` pixels, row-major, native-endian, in the acquisition's
    /// buffer (read-only); `len` bytes.
    pub data: *const u8,
    pub len: usize,
    pub width: u32,
    pub height: u32,
    /// 1 when the frame has enough Bragg spots to be a hit; the spots found.
    pub hit: i32,
    pub spots: u32,
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
        let text = unsafe { text(config, "config") }?;
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
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_out(&json, buf, len, needed, "buffer map") }
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

/// The NUL-terminated UTF-8 text at `p` (`what` names it in errors).
///
/// # Safety
/// `p` is non-null and NUL-terminated.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Failure::new(RdaqStatus::Config, format!("{what}: not UTF-8")))
}

/// Copies `s` and a NUL into `buf` (`len` bytes); `*needed` (when not null) gets the size
/// it takes. `RDAQ_STATUS_BUFFER` when `len` is too small (nothing but `*needed` written).
///
/// # Safety
/// `buf` is null or points to `len` writable bytes; `needed` is null or writable.
unsafe fn copy_out(s: &str, buf: *mut c_char, len: usize, needed: *mut usize, what: &str) -> Result<(), Failure> {
    if !needed.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *needed = s.len() + 1 };
    }
    if buf.is_null() {
        return Err(null("buf"));
    }
    if len < s.len() + 1 {
        return Err(Failure::new(RdaqStatus::Buffer, format!("buf: {len} bytes, the {what} needs {}", s.len() + 1)));
    }
    // SAFETY: `buf` holds `len` >= s.len() + 1 writable bytes (caller's contract, checked
    // length); the source is a distinct Rust allocation.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Starts an acquisition configured by `config` (TOML: the sections of rdaq.example.toml,
/// over the defaults of `rdaq run`, or of `rdaq receive` with a source) and stores its
/// handle in `*handle`. `source` null: the emulated detector of `rdaq run`, in this
/// process; otherwise TOML fields of what a detector outside sends (`format`, `detector`,
/// `interfaces`, `read_rows`, `bit_depth`, `link`, `frames`, ...), whose packets come to
/// the ports `rdaq_acquisition_ports` gives. Its frames are processed (a calibration is
/// needed for a detector outside): `RDAQ_STATUS_CONFIG` names the field that is wrong.
///
/// # Safety
/// `config` is null or NUL-terminated; `source` is null or NUL-terminated; `handle` is
/// null or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn rdaq_acquisition_open(config: *const c_char, source: *const c_char, handle: *mut u64) -> RdaqStatus {
    guarded(|| {
        if config.is_null() {
            return Err(null("config"));
        }
        if handle.is_null() {
            return Err(null("handle"));
        }
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let config = unsafe { text(config, "config") }?;
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let source = if source.is_null() { None } else { Some(unsafe { text(source, "source") }?) };
        let h = acquisition::open(config, source)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *handle = h };
        Ok(())
    })
}

/// Copies the data ports a detector outside sends to into `ports` (`len` entries);
/// `*count` gets their number (0 for the emulated detector).
///
/// # Safety
/// `ports` is null or points to `len` writable `uint16_t`; `count` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn rdaq_acquisition_ports(handle: u64, ports: *mut u16, len: usize, count: *mut usize) -> RdaqStatus {
    guarded(|| {
        let run = acquisition::run(handle)?;
        if !count.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { *count = run.ports.len() };
        }
        if ports.is_null() {
            return Err(null("ports"));
        }
        if len < run.ports.len() {
            return Err(Failure::new(RdaqStatus::Buffer, format!("ports: {len} entries, the acquisition has {}", run.ports.len())));
        }
        // SAFETY: `ports` holds `len` >= ports.len() writable entries (caller's contract,
        // checked length); the source is a distinct Rust allocation.
        unsafe { std::ptr::copy_nonoverlapping(run.ports.as_ptr(), ports, run.ports.len()) };
        Ok(())
    })
}

/// Waits for the acquisition's next processed frame, at most `timeout_ms` milliseconds
/// (negative: until it ends), and describes it in `*image`. `RDAQ_STATUS_TIMEOUT`: none
/// came in time; `RDAQ_STATUS_FINISHED`: the acquisition ended and handed every frame (its
/// summary is ready); `RDAQ_STATUS_FAILED`: it ended with an error (the message).
///
/// # Safety
/// `image` is null or points to a writable `RdaqImage`.
#[no_mangle]
pub unsafe extern "C" fn rdaq_acquisition_next(handle: u64, timeout_ms: i64, image: *mut RdaqImage) -> RdaqStatus {
    guarded(|| {
        if image.is_null() {
            return Err(null("image"));
        }
        let i = acquisition::run(handle)?.next(timeout_ms)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *image = i };
        Ok(())
    })
}

/// Gives frame `id`'s buffer back to the processing graph; its `data` must not be read
/// afterwards. A program that holds frames holds the graph's buffers, which then waits.
#[no_mangle]
pub extern "C" fn rdaq_acquisition_release(handle: u64, id: u64) -> RdaqStatus {
    guarded(|| acquisition::run(handle)?.release(id))
}

/// Stops the acquisition early (the emulated detector stops sending, a receiver stops
/// receiving); the frames on their way still come.
#[no_mangle]
pub extern "C" fn rdaq_acquisition_stop(handle: u64) -> RdaqStatus {
    guarded(|| {
        acquisition::run(handle)?.stop();
        Ok(())
    })
}

/// Copies the summary of an acquisition that ended (JSON, as `--summary-json` writes it)
/// into `buf`; `*needed` gets its size. `RDAQ_STATUS_RUNNING` before
/// `rdaq_acquisition_next` said `RDAQ_STATUS_FINISHED`.
///
/// # Safety
/// `buf` is null or points to `len` writable bytes; `needed` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn rdaq_acquisition_summary(handle: u64, buf: *mut c_char, len: usize, needed: *mut usize) -> RdaqStatus {
    guarded(|| {
        let s = acquisition::run(handle)?.summary()?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_out(&s, buf, len, needed, "summary") }
    })
}

/// Closes the acquisition: stops it, releases every frame still held (their `data` becomes
/// invalid), lets the frames still coming go and waits for its end. The handle is invalid
/// afterwards.
#[no_mangle]
pub extern "C" fn rdaq_acquisition_close(handle: u64) -> RdaqStatus {
    guarded(|| acquisition::close(handle))
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
