//! Data files' chunks written by I/O threads, outside HDF5's lock.
//!
//! HDF5 runs one call at a time in a process, and a data file writer spends nearly all of its
//! time in the kernel's copy of the chunks into the page cache, under that lock. The data files
//! are therefore opened with rdaq's own file driver (`csrc/deferred_vfd.c`, a POSIX file like
//! HDF5's sec2): when the writer writes a [`SharedChunk`], HDF5 still allocates its place and
//! records it, but the driver hands the bytes to one of [`IO_THREADS`] I/O threads and returns. The chunk
//! cannot be changed until its write is done ([`SharedChunk::make_mut`] waits), every other
//! write or read of the file waits for the file's chunks first (so metadata never reaches the
//! disk before the chunks it points to, as SWMR readers need), and flush, truncate and close
//! report the first chunk write that failed.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Chunk writes of one file in flight at most; the writer waits beyond (counted).
const MAX_IN_FLIGHT: usize = 64;
/// Jobs queued for the I/O threads at most (of all files).
const QUEUE: usize = 256;

/// A chunk buffer that a data file's I/O thread may still be writing out after the writer has
/// moved on. Clones share the bytes.
#[derive(Clone, Default)]
pub struct SharedChunk(Arc<RwLock<Vec<u8>>>);

impl SharedChunk {
    pub fn new(bytes: Vec<u8>) -> SharedChunk {
        SharedChunk(Arc::new(RwLock::new(bytes)))
    }

    /// The bytes to change, once no write of them is in flight (waits for it).
    pub fn make_mut(&mut self) -> RwLockWriteGuard<'_, Vec<u8>> {
        self.0.write()
    }

    /// The bytes to read.
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<u8>> {
        self.0.read_recursive()
    }
}

thread_local! {
    /// The chunk whose bytes the HDF5 call under way on this thread writes: the driver may
    /// keep it until its write is done.
    static LENT: RefCell<Option<Arc<RwLock<Vec<u8>>>>> = const { RefCell::new(None) };
    /// Chunks this thread handed to the I/O threads, and its waits for a place (see
    /// [`Handed`]).
    static MINE: Cell<Handed> = const { Cell::new(Handed { chunks: 0, waits: 0 }) };
}

/// What a writing thread's lent writes came to: chunks handed to the I/O threads, and the
/// times it waited for a place among a file's writes in flight or in their queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handed {
    pub chunks: u64,
    pub waits: u64,
}

/// Runs `write` with the chunk's bytes lent to the data files' driver: a raw-data write of
/// exactly these bytes inside it may be handed to an I/O thread. Also returns what it came to.
pub(crate) fn lend<T>(chunk: &SharedChunk, write: impl FnOnce(&[u8]) -> T) -> (T, Handed) {
    let bytes = chunk.read();
    MINE.set(Handed::default());
    LENT.with(|l| *l.borrow_mut() = Some(chunk.0.clone()));
    let r = write(&bytes);
    LENT.with(|l| l.borrow_mut().take());
    (r, MINE.take())
}

/// Counts handed-on chunks and waits, for the process ([`counters`]) and for the writing
/// thread's lent write ([`lend`]).
fn count(chunks: u64, waits: u64) {
    HANDED_ON.fetch_add(chunks, Ordering::Relaxed);
    WAITED.fetch_add(waits, Ordering::Relaxed);
    let m = MINE.get();
    MINE.set(Handed {
        chunks: m.chunks + chunks,
        waits: m.waits + waits,
    });
}

/// How many chunk writes went to the I/O threads, and how often a writer waited for a free
/// place among a file's writes in flight.
pub fn counters() -> (u64, u64) {
    (
        HANDED_ON.load(Ordering::Relaxed),
        WAITED.load(Ordering::Relaxed),
    )
}

/// Whether chunks are handed to the I/O threads (the default); off, the driver writes them
/// under HDF5's lock as HDF5's own would. For benchmarks that compare the two in one run.
pub fn set_handing_on(on: bool) {
    HANDING_ON.store(on, Ordering::Relaxed);
}

/// Bytes handed to the I/O threads and not yet written, of every file in the process. A
/// writer's free-space check counts them as taken: they take their room on the disk only
/// when copied (of another file system's files too, which errs on the safe side).
pub fn bytes_in_flight() -> u64 {
    IN_FLIGHT.load(Ordering::Acquire)
}

static HANDING_ON: AtomicBool = AtomicBool::new(true);
static HANDED_ON: AtomicU64 = AtomicU64::new(0);
static WAITED: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

/// One open data file's chunk writes in flight.
#[derive(Default)]
struct Pending {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Byte ranges (start, end) being written.
    in_flight: Vec<(u64, u64)>,
    /// The errno of the first write that failed; 0 if none.
    error: i32,
}

impl Pending {
    /// Claims a place for a write of `range`, after any write in flight that overlaps it.
    fn start(&self, range: (u64, u64)) {
        let mut st = self.state.lock().expect("not poisoned");
        let mut waited = false;
        while st.in_flight.len() >= MAX_IN_FLIGHT
            || st
                .in_flight
                .iter()
                .any(|&(a, b)| a < range.1 && range.0 < b)
        {
            waited = true;
            st = self.changed.wait(st).expect("not poisoned");
        }
        if waited {
            count(0, 1);
        }
        st.in_flight.push(range);
    }

    fn finish(&self, range: (u64, u64), error: i32) {
        let mut st = self.state.lock().expect("not poisoned");
        if let Some(k) = st.in_flight.iter().position(|&r| r == range) {
            st.in_flight.swap_remove(k);
        }
        if st.error == 0 {
            st.error = error;
        }
        self.changed.notify_all();
    }

    /// Waits for every write in flight; the errno of the first failed one, or 0.
    fn drain(&self) -> i32 {
        let mut st = self.state.lock().expect("not poisoned");
        while !st.in_flight.is_empty() {
            st = self.changed.wait(st).expect("not poisoned");
        }
        st.error
    }

    fn failed(&self) -> bool {
        self.state.lock().expect("not poisoned").error != 0
    }
}

struct Job {
    pending: Arc<Pending>,
    fd: c_int,
    addr: u64,
    bytes: ArcRwLockReadGuard<RawRwLock, Vec<u8>>,
}

impl Job {
    /// A write of `bytes` at `addr`, counted in [`bytes_in_flight`] until it has run.
    fn new(pending: Arc<Pending>, fd: c_int, addr: u64, bytes: ArcRwLockReadGuard<RawRwLock, Vec<u8>>) -> Job {
        IN_FLIGHT.fetch_add(bytes.len() as u64, Ordering::AcqRel);
        Job { pending, fd, addr, bytes }
    }

    fn run(self) {
        let range = (self.addr, self.addr + self.bytes.len() as u64);
        let error = match write_all_at(self.fd, &self.bytes, self.addr) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        };
        IN_FLIGHT.fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
        drop(self.bytes);
        self.pending.finish(range, error);
    }
}

fn write_all_at(fd: c_int, bytes: &[u8], at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::FromRawFd;
    // SAFETY: `fd` stays open until the file's writes are drained (the driver's close drains
    // before it closes it), and the File is never dropped, so it never closes the driver's fd.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    file.write_all_at(bytes, at)
}

/// The I/O threads: two, so that one chunk's copy follows another's without a pause. More
/// would not copy faster into one file: the kernel takes a file's buffered writes one at a
/// time (its inode lock), and a series writes one data file at a time.
pub const IO_THREADS: usize = 2;

/// The I/O threads' queue, and the process they run in: a child forked after they started
/// has none of them, and writes its chunks itself.
fn queue() -> Option<&'static mpsc::SyncSender<Job>> {
    static QUEUE_TX: OnceLock<(u32, mpsc::SyncSender<Job>)> = OnceLock::new();
    let (pid, tx) = QUEUE_TX.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for k in 0..IO_THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("rdaq-io-{k}"))
                .spawn(move || loop {
                    let job = rx.lock().expect("not poisoned").recv();
                    match job {
                        Ok(job) => job.run(),
                        Err(_) => return,
                    }
                })
                .expect("an I/O thread starts");
        }
        (std::process::id(), tx)
    });
    (*pid == std::process::id()).then_some(tx)
}

#[no_mangle]
extern "C" fn rdaq_deferred_open() -> *mut c_void {
    Arc::into_raw(Arc::new(Pending::default())) as *mut c_void
}

/// Hands a raw-data write to an I/O thread when its bytes are those of the lent chunk: 1 if
/// it did, 0 if the driver writes them itself, -1 if an earlier write of the file failed.
#[no_mangle]
extern "C" fn rdaq_deferred_submit(
    pending: *mut c_void,
    fd: c_int,
    addr: u64,
    buf: *const c_void,
    size: usize,
) -> c_int {
    // SAFETY: `pending` comes from rdaq_deferred_open and is released only by
    // rdaq_deferred_close, after which the driver no longer calls with it.
    let p = unsafe { &*(pending as *const Pending) };
    if p.failed() {
        return -1;
    }
    if !HANDING_ON.load(Ordering::Relaxed) {
        return 0;
    }
    let Some(lent) = LENT.with(|l| l.borrow().clone()) else {
        return 0;
    };
    let Some(queue) = queue() else { return 0 };
    let bytes = lent.read_arc_recursive();
    if bytes.as_ptr().cast::<c_void>() != buf || bytes.len() != size {
        return 0;
    }
    // SAFETY: as above; the clone keeps the Pending alive for the job.
    let pending = unsafe {
        Arc::increment_strong_count(pending as *const Pending);
        Arc::from_raw(pending as *const Pending)
    };
    pending.start((addr, addr + size as u64));
    count(1, 0);
    let job = match queue.try_send(Job::new(pending, fd, addr, bytes)) {
        Ok(()) => return 1,
        Err(mpsc::TrySendError::Full(job)) => {
            count(0, 1);
            queue.send(job)
        }
        Err(mpsc::TrySendError::Disconnected(job)) => Err(mpsc::SendError(job)),
    };
    // the I/O threads are gone only if they all panicked: this thread writes it then
    if let Err(mpsc::SendError(job)) = job {
        job.run();
    }
    1
}

/// Waits for the file's writes in flight: 0, or the errno of the first that failed.
#[no_mangle]
extern "C" fn rdaq_deferred_drain(pending: *mut c_void) -> c_int {
    // SAFETY: as in rdaq_deferred_submit.
    unsafe { &*(pending as *const Pending) }.drain()
}

/// Drains the file's writes and releases its record: 0, or the errno of the first write
/// that failed.
#[no_mangle]
extern "C" fn rdaq_deferred_close(pending: *mut c_void) -> c_int {
    // SAFETY: from rdaq_deferred_open; the driver calls this once, at the file's close.
    let p = unsafe { Arc::from_raw(pending as *const Pending) };
    p.drain()
}

extern "C" {
    fn rdaq_deferred_driver() -> hdf5_sys::h5i::hid_t;
}

/// Creates (truncating) an HDF5 file with the deferred driver and the 1.10 file format.
pub(crate) fn create(path: &std::path::Path) -> hdf5::Result<hdf5::File> {
    use hdf5_sys::h5f::{H5Fcreate, H5F_ACC_TRUNC};
    use hdf5_sys::h5p::{H5Pset_driver, H5P_DEFAULT};
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| hdf5::Error::from(format!("{}: a NUL in the name", path.display())))?;
    let fapl = hdf5::file::FileAccess::build().libver_v110().finish()?;
    hdf5::sync::sync(|| {
        // SAFETY: called under the bindings' HDF5 lock; the driver table lives as long as the
        // process (a static in the C file).
        let driver = unsafe { rdaq_deferred_driver() };
        if driver < 0 {
            return Err(hdf5::Error::from("cannot register rdaq's HDF5 file driver"));
        }
        // SAFETY: `fapl` is a live file access list; the driver takes no driver info.
        hdf5::h5check(unsafe { H5Pset_driver(fapl.id(), driver, std::ptr::null()) })?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let id = hdf5::h5check(unsafe {
            H5Fcreate(name.as_ptr(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id())
        })?;
        // SAFETY: a new file id from H5Fcreate, owned by the File from here on.
        unsafe { hdf5::from_id::<hdf5::File>(id) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn job(pending: &Arc<Pending>, fd: c_int, addr: u64, bytes: &[u8]) -> Job {
        Job::new(pending.clone(), fd, addr, Arc::new(RwLock::new(bytes.to_vec())).read_arc_recursive())
    }

    #[test]
    fn a_failed_write_is_reported_by_every_later_drain() {
        let path = std::env::temp_dir().join(format!("rdaq-deferred-ro-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let read_only = std::fs::File::open(&path).unwrap();
        let p = Arc::new(Pending::default());
        p.start((0, 4));
        job(&p, read_only.as_raw_fd(), 0, b"abcd").run();
        assert_eq!(p.drain(), libc::EBADF);
        assert!(p.failed());
        assert_eq!(p.drain(), libc::EBADF, "the first error stays");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn writes_land_at_their_addresses_and_overlapping_ones_wait() {
        let path = std::env::temp_dir().join(format!("rdaq-deferred-rw-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let p = Arc::new(Pending::default());
        p.start((4, 8));
        let first = job(&p, file.as_raw_fd(), 4, b"efgh");
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                // overlaps the first: claims its place only once the first is done
                p.start((6, 10));
                job(&p, file.as_raw_fd(), 6, b"XYZW").run();
                file
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            p.state.lock().unwrap().in_flight,
            [(4, 8)],
            "the overlapping write waits"
        );
        first.run();
        let _file = waiter.join().unwrap();
        assert_eq!(p.drain(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), b"\0\0\0\0efXYZW");
        std::fs::remove_file(&path).unwrap();
    }
}
