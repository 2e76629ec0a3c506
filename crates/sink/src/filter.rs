//! Bitshuffle (HDF5 filter 32008) registered in this process, from rdaq's own codec.
//!
//! Why rdaq registers it instead of leaving it to a plugin: HDF5 loads a filter plugin for an
//! unregistered filter from `HDF5_PLUGIN_PATH` (which the docs tell DIALS users to export).
//! The bitshuffle plugin's `set_local` then shifts the cd_values rdaq gives by three (it takes
//! them as user options), so the files would say `(0,4,2,0,4,2,0,2,0)` and no reader could
//! decode them; without a plugin they stay `(0,4,2,0,2,0)`. Registered here, the filter is
//! HDF5's whatever the environment: the values rdaq gives are written as given (no
//! `set_local`), and frames read through HDF5 (a master's virtual dataset, `rdaq process`,
//! the writer's check after closing a data file) decode without any plugin.
//!
//! cd_values as the bitshuffle library defines them: 0, 1 its version, 2 element size in
//! bytes, 3 block size in elements (0: the default), 4 compression (0 none, 2 LZ4, 3 Zstd),
//! 5 Zstd level.

use std::os::raw::{c_uint, c_void};
use std::sync::OnceLock;

use hdf5_sys::h5z::{H5Z_class2_t, H5Zregister, H5Z_CLASS_T_VERS, H5Z_FLAG_REVERSE};
use rdaq_process::bitshuffle::{decompress, unshuffle_block, Codec, Compressor, MAX_CHUNK_BYTES};
use rdaq_process::chunk_size;

/// HDF5 filter id of bitshuffle.
pub const BSHUF_FILTER: i32 = 32008;

const NAME: &[u8] = b"bitshuffle (rdaq)\0";

// HDF5 copies the class when it registers it; the name is a static string.
const CLASS: &H5Z_class2_t = &H5Z_class2_t {
    version: H5Z_CLASS_T_VERS as _,
    id: BSHUF_FILTER,
    encoder_present: 1,
    decoder_present: 1,
    name: NAME.as_ptr().cast(),
    can_apply: None,
    set_local: None,
    filter: Some(filter),
};

/// Registers the filter with HDF5 (once per process; later calls return the first result).
pub fn register() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: `CLASS` is a valid H5Z_class2_t (HDF5 copies it; its name is static and
        // its callback matches H5Z_func_t); HDF5's global lock is held (`sync`).
        let rc = hdf5::sync::sync(|| unsafe { H5Zregister((CLASS as *const H5Z_class2_t).cast()) });
        if rc < 0 {
            Err("HDF5 refused to register rdaq's bitshuffle filter (32008)".to_string())
        } else {
            Ok(())
        }
    })
    .clone()
}

thread_local! {
    /// Why the filter last failed on this thread: HDF5 only says that it did.
    static REFUSAL: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Why the filter last failed on this thread, once.
pub fn take_refusal() -> Option<String> {
    REFUSAL.with(|r| r.take())
}

/// The filter's settings, from its cd_values.
#[derive(Debug, PartialEq, Eq)]
struct Params {
    elem_size: usize,
    block_elems: usize,
    /// `None`: bitshuffle without compression.
    codec: Option<Codec>,
}

fn params(cd: &[c_uint]) -> Result<Params, String> {
    let elem_size = *cd.get(2).ok_or("fewer than 3 cd_values")? as usize;
    if !matches!(elem_size, 1 | 2 | 4 | 8) {
        return Err(format!("element size {elem_size} (cd_values[2])"));
    }
    let block_elems = cd.get(3).copied().unwrap_or(0) as usize;
    if block_elems % 8 != 0 {
        return Err(format!("block size {block_elems} is not a multiple of 8 (cd_values[3])"));
    }
    let codec = match cd.get(4).copied().unwrap_or(0) {
        0 => None,
        2 => Some(Codec::Lz4),
        3 => Some(Codec::Zstd(cd.get(5).copied().unwrap_or(0) as i32)),
        c => return Err(format!("compression {c} (cd_values[4]: 0, 2 or 3)")),
    };
    Ok(Params { elem_size, block_elems, codec })
}

/// Decodes one stored chunk of `want` bytes (the dataset's chunk: HDF5 takes what the
/// filter returns as a whole chunk, so anything else is refused before it is decoded).
fn decode(p: &Params, chunk: &[u8], want: usize) -> Result<Vec<u8>, String> {
    let Some(codec) = p.codec else {
        return if chunk.len() == want { Ok(unshuffle_all(p, chunk)) } else { Err(format!("an unshuffled chunk of {} bytes, the dataset's chunks hold {want}", chunk.len())) };
    };
    let total = chunk.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
    if total != want as u64 || total > MAX_CHUNK_BYTES || total % p.elem_size as u64 != 0 {
        return Err(format!("chunk header says {total} bytes, the dataset's chunks hold {want}"));
    }
    decompress(chunk, p.elem_size, codec).map_err(|e| e.to_string())
}

/// Bitshuffle without compression: whole blocks transposed, the last partial block rounded
/// down to 8 elements, the rest as it is.
fn unshuffle_all(p: &Params, data: &[u8]) -> Vec<u8> {
    let es = p.elem_size;
    let be = if p.block_elems == 0 { rdaq_process::bitshuffle::default_block_elems(es) } else { p.block_elems };
    let n = data.len() / es;
    let mut out = data.to_vec();
    let mut at = 0;
    while n - at / es >= 8 {
        let elems = be.min((n - at / es) / 8 * 8);
        unshuffle_block(&data[at..at + elems * es], &mut out[at..at + elems * es], es);
        at += elems * es;
    }
    out
}

/// Encodes one chunk (for writes through HDF5; rdaq's writers compress themselves and write
/// chunks directly).
fn encode(p: &Params, data: &[u8]) -> Result<Vec<u8>, String> {
    let codec = p.codec.ok_or("rdaq writes bitshuffle with LZ4 or Zstd only")?;
    if data.len() % p.elem_size != 0 {
        return Err(format!("{} bytes are not whole {}-byte elements", data.len(), p.elem_size));
    }
    let mut out = Vec::new();
    Compressor::new(p.elem_size, p.block_elems, codec).compress(data, &mut out);
    Ok(out)
}

/// The H5Z_func_t: decodes (H5Z_FLAG_REVERSE) or encodes `*buf` in place, replacing the
/// buffer; returns the new size, 0 on failure (HDF5 then fails the read or write).
unsafe extern "C" fn filter(flags: c_uint, cd_nelmts: usize, cd_values: *const c_uint, nbytes: usize, buf_size: *mut usize, buf: *mut *mut c_void) -> usize {
    // SAFETY: HDF5 passes `cd_nelmts` values at `cd_values` (or none) and a live buffer
    // `*buf` of at least `nbytes` bytes, both valid for this call.
    let (cd, input) = unsafe {
        let cd = if cd_values.is_null() { &[][..] } else { std::slice::from_raw_parts(cd_values, cd_nelmts) };
        (cd, std::slice::from_raw_parts((*buf).cast::<u8>(), nbytes))
    };
    // a panic must not unwind into C
    let out = std::panic::catch_unwind(|| {
        let p = params(cd)?;
        if flags & H5Z_FLAG_REVERSE != 0 {
            let want = chunk_size::expected().ok_or("a chunk read without its dataset's chunk size (rdaq_process::chunk_size::reading)")?;
            decode(&p, input, want)
        } else {
            encode(&p, input)
        }
    });
    let out = match out {
        Ok(Ok(out)) => out,
        Ok(Err(why)) => {
            REFUSAL.with(|r| r.replace(Some(why)));
            return 0;
        }
        Err(_) => return 0,
    };
    // SAFETY: HDF5 owns `*buf` and takes back a buffer of its own allocator, of the size
    // reported in `*buf_size`; `new` holds `out.len()` bytes.
    unsafe {
        let new = hdf5_sys::h5::H5allocate_memory(out.len().max(1), 0);
        if new.is_null() {
            return 0;
        }
        std::ptr::copy_nonoverlapping(out.as_ptr(), new.cast::<u8>(), out.len());
        hdf5_sys::h5::H5free_memory(*buf);
        *buf = new;
        *buf_size = out.len().max(1);
    }
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_process::bitshuffle::shuffle_block;

    #[test]
    fn cd_values_are_read_as_the_bitshuffle_library_defines_them() {
        assert_eq!(params(&[0, 4, 2, 0, 2, 0]).unwrap(), Params { elem_size: 2, block_elems: 0, codec: Some(Codec::Lz4) });
        assert_eq!(params(&[0, 4, 4, 1024, 3, 5]).unwrap(), Params { elem_size: 4, block_elems: 1024, codec: Some(Codec::Zstd(5)) });
        assert_eq!(params(&[0, 4, 1]).unwrap().codec, None);
        // what a bitshuffle plugin's set_local made of rdaq's values: refused, not misread
        let e = params(&[0, 4, 2, 0, 4, 2, 0, 2, 0]).unwrap_err();
        assert!(e.contains("compression 4"), "{e}");
        assert!(params(&[0, 4, 3, 0, 2]).is_err());
        assert!(params(&[0, 4]).is_err());
    }

    #[test]
    fn chunks_roundtrip_and_lies_are_refused() {
        let data: Vec<u8> = (0..4000u32).flat_map(|i| (((i * 7) % 300) as u16).to_le_bytes()).collect();
        for codec in [2, 3] {
            let p = params(&[0, 4, 2, 0, codec, 1]).unwrap();
            let chunk = encode(&p, &data).unwrap();
            assert_eq!(decode(&p, &chunk, data.len()).unwrap(), data);
            assert!(decode(&p, &chunk, data.len() + 2).is_err(), "a chunk of another size than the dataset's");
            let mut lie = chunk.clone();
            lie[..8].copy_from_slice(&u64::MAX.to_be_bytes());
            assert!(decode(&p, &lie, data.len()).is_err());
            assert!(decode(&p, &chunk[..chunk.len() / 2], data.len()).is_err());
        }
    }

    #[test]
    fn uncompressed_bitshuffle_is_unshuffled_block_by_block() {
        let p = Params { elem_size: 2, block_elems: 16, codec: None };
        let data: Vec<u8> = (0..45u8).flat_map(|i| [i, i ^ 0x5a]).collect();
        // as the bitshuffle library stores it: blocks of 16, then 8, then 5 elements as they are
        let mut stored = data.clone();
        for (a, n) in [(0, 16), (16, 16), (32, 8)] {
            shuffle_block(&data[a * 2..(a + n) * 2], &mut stored[a * 2..(a + n) * 2], 2);
        }
        assert_eq!(decode(&p, &stored, data.len()).unwrap(), data);
        assert!(decode(&p, &stored[2..], data.len()).is_err());
    }
}
