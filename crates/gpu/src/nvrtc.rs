//! NVRTC, the compiler library the kernels are built with at run time, loaded by rdaq itself
//! so that it picks the library in the right order and says exactly what is missing: CUDA 13
//! hosts ship `libnvrtc.so.13` (and often an unversioned `libnvrtc.so` that points to it),
//! CUDA 12 hosts and the `nvidia-cuda-nvrtc-cu12` wheel `libnvrtc.so.12`. Any of them will
//! do as long as it is not newer than the driver: PTX from a newer NVRTC does not load.
//!
//! Only the calls that every NVRTC since CUDA 11 has are used (create, compile, log, PTX,
//! destroy, version), so CUDA 12's and 13's libraries serve alike.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use crate::error::GpuError;

/// The library names tried, in order, after `RDAQ_NVRTC` (a path) when it is set.
pub const NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

type Program = *mut std::ffi::c_void;
type CreateFn = unsafe extern "C" fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// A loaded NVRTC.
pub struct Nvrtc {
    /// The name or path it was loaded by.
    pub name: String,
    /// Its CUDA version (major, minor).
    pub version: (i32, i32),
    create: CreateFn,
    compile: CompileFn,
    ptx_size: SizeFn,
    ptx: GetFn,
    log_size: SizeFn,
    log: GetFn,
    destroy: DestroyFn,
    /// Keeps the functions above loaded.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (CUDA {}.{})", self.name, self.version.0, self.version.1)
    }
}

/// The names to try: `RDAQ_NVRTC` first when set, then [`NAMES`].
fn candidates() -> Vec<String> {
    let own = std::env::var("RDAQ_NVRTC").ok().filter(|p| !p.is_empty());
    own.into_iter().chain(NAMES.iter().map(|n| n.to_string())).collect()
}

impl Nvrtc {
    /// Loads the library `name` and the functions rdaq calls; `None` if it cannot be
    /// loaded or lacks one of them.
    fn open(name: &str) -> Option<Nvrtc> {
        // SAFETY: loading NVRTC runs no initialisers beyond the library's own; each symbol is
        // read with the C signature NVRTC's header gives it, and the library is kept loaded
        // in `_lib` for as long as the function pointers are.
        unsafe {
            let lib = libloading::Library::new(name).ok()?;
            let version: VersionFn = *lib.get(b"nvrtcVersion\0").ok()?;
            let (mut major, mut minor) = (0, 0);
            if version(&mut major, &mut minor) != 0 {
                return None;
            }
            Some(Nvrtc {
                name: name.to_string(),
                version: (major, minor),
                create: *lib.get(b"nvrtcCreateProgram\0").ok()?,
                compile: *lib.get(b"nvrtcCompileProgram\0").ok()?,
                ptx_size: *lib.get(b"nvrtcGetPTXSize\0").ok()?,
                ptx: *lib.get(b"nvrtcGetPTX\0").ok()?,
                log_size: *lib.get(b"nvrtcGetProgramLogSize\0").ok()?,
                log: *lib.get(b"nvrtcGetProgramLog\0").ok()?,
                destroy: *lib.get(b"nvrtcDestroyProgram\0").ok()?,
                _lib: lib,
            })
        }
    }

    /// Compiles CUDA C `source` (named `name` in messages) with `options` to PTX.
    pub fn compile(&self, source: &str, name: &str, options: &[String]) -> Result<String, String> {
        let src = CString::new(source).map_err(|_| "a NUL byte in the source".to_string())?;
        let file = CString::new(name).map_err(|_| "a NUL byte in the name".to_string())?;
        let opts: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).map_err(|_| format!("a NUL byte in option {o}"))).collect::<Result<_, _>>()?;
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: NVRTC's documented calls on one program: every pointer passed is valid for
        // the call (NUL-terminated strings that outlive it, an options array of `ptrs.len()`
        // entries, out-parameters on the stack, buffers of the size NVRTC reported), and the
        // program is destroyed once, on every path after it was created.
        unsafe {
            check((self.create)(&mut prog, src.as_ptr(), file.as_ptr(), 0, std::ptr::null(), std::ptr::null()), "nvrtcCreateProgram")?;
            let compiled = (self.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let out = if compiled != 0 { Err(format!("{}\n{}", code_name(compiled), self.text(prog, self.log_size, self.log))) } else { Ok(self.text(prog, self.ptx_size, self.ptx)) };
            (self.destroy)(&mut prog);
            out
        }
    }

    /// The program's log or PTX, read with its size and get calls.
    ///
    /// # Safety
    /// `prog` is a live program of this library.
    unsafe fn text(&self, prog: Program, size: SizeFn, get: GetFn) -> String {
        let mut n = 0usize;
        if size(prog, &mut n) != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        if get(prog, buf.as_mut_ptr().cast()) != 0 {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

fn code_name(code: c_int) -> String {
    match code {
        1 => "out of memory".into(),
        3 => "invalid input".into(),
        5 => "invalid option".into(),
        6 => "compilation failed".into(),
        c => format!("NVRTC error {c}"),
    }
}

fn check(code: c_int, call: &str) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{call}: {}", code_name(code)))
    }
}

/// What [`load`] found, decided once per process.
static LOADED: OnceLock<Result<Nvrtc, String>> = OnceLock::new();

/// The CUDA version of the driver as (major, minor), e.g. (13, 0).
pub type CudaVersion = (i32, i32);

/// NVRTC, loaded on first use: the first candidate that loads and is not newer than the
/// driver (`driver`: the driver's CUDA version, `None` where there is no driver and only
/// compiling is wanted).
pub fn load(driver: Option<CudaVersion>) -> Result<&'static Nvrtc, GpuError> {
    let found = LOADED.get_or_init(|| choose(driver)).as_ref().map_err(|e| GpuError::NoNvrtc(e.clone()))?;
    match driver {
        Some(d) if found.version > d => Err(GpuError::NvrtcTooNew { nvrtc: format!("{found:?}"), driver: format!("{}.{}", d.0, d.1) }),
        _ => Ok(found),
    }
}

fn choose(driver: Option<CudaVersion>) -> Result<Nvrtc, String> {
    let names = candidates();
    let mut newer = None;
    for name in &names {
        let Some(n) = Nvrtc::open(name) else { continue };
        match driver {
            Some(d) if n.version > d => newer = newer.or(Some(n)),
            _ => return Ok(n),
        }
    }
    // only libraries newer than the driver: report the first, `load` names both versions
    newer.ok_or_else(|| format!("none of {} could be loaded", names.join(", ")))
}
