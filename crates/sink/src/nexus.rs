//! NeXus building blocks over the HDF5 library: classed groups, scalar fields with units,
//! transformation axes, the bitshuffle frame stack and its direct chunk write.

use hdf5::types::VarLenUnicode;
use hdf5::{Dataset, Group};
use rdaq_process::bitshuffle::Codec;

use crate::filter::BSHUF_FILTER;

pub(crate) fn str_attr(loc: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    loc.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
}

pub(crate) fn nx_group(parent: &Group, name: &str, class: &str) -> hdf5::Result<Group> {
    let g = parent.create_group(name)?;
    str_attr(&g, "NX_class", class)?;
    Ok(g)
}

pub(crate) fn str_ds(g: &Group, name: &str, value: &str) -> hdf5::Result<Dataset> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    let d = g.new_dataset::<VarLenUnicode>().create(name)?;
    d.write_scalar(&v)?;
    Ok(d)
}

pub(crate) fn f64_ds(g: &Group, name: &str, value: f64, units: &str) -> hdf5::Result<Dataset> {
    let d = g.new_dataset::<f64>().create(name)?;
    d.write_scalar(&value)?;
    if !units.is_empty() {
        str_attr(&d, "units", units)?;
    }
    Ok(d)
}

/// One axis of an NXtransformations chain.
pub(crate) struct Axis<'a> {
    pub kind: &'a str,
    pub value: f64,
    pub units: &'a str,
    pub vector: [f64; 3],
    pub depends_on: &'a str,
    pub offset: Option<[f64; 3]>,
}

/// Writes `axis` as the field `name` of `g`.
pub(crate) fn axis(g: &Group, name: &str, a: &Axis) -> hdf5::Result<Dataset> {
    let d = f64_ds(g, name, a.value, a.units)?;
    str_attr(&d, "transformation_type", a.kind)?;
    str_attr(&d, "depends_on", a.depends_on)?;
    d.new_attr::<f64>().shape(3).create("vector")?.write(&a.vector)?;
    if let Some(o) = a.offset {
        d.new_attr::<f64>().shape(3).create("offset")?.write(&o)?;
        str_attr(&d, "offset_units", "m")?;
    }
    Ok(d)
}

#[allow(non_camel_case_types)]
type libc_uint = std::os::raw::c_uint;

/// A chunked, resizable 3-D dataset with bitshuffle in its filter pipeline (rdaq's own
/// registration, [`crate::filter`]: the cd_values are stored as given, whatever plugins the
/// environment offers).
pub fn frame_stack<T: hdf5::H5Type>(g: &Group, name: &str, h: usize, w: usize, codec: Codec) -> hdf5::Result<Dataset> {
    crate::filter::register().map_err(hdf5::Error::from)?;
    let dcpl = hdf5::plist::DatasetCreate::try_new()?;
    // 0, 4: bitshuffle version fields (informational), element size, block size 0 (auto),
    // codec (2 LZ4, 3 Zstd) and level.
    let [c, level] = codec.cd_values();
    let cd: [libc_uint; 6] = [0, 4, std::mem::size_of::<T>() as libc_uint, 0, c, level];
    // SAFETY: `dcpl` is a live dataset-creation property list for the call, and `cd` holds
    // the `cd.len()` values the call reads; HDF5's global lock is held (`sync`).
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5p::H5Pset_filter(dcpl.id(), BSHUF_FILTER, hdf5_sys::h5z::H5Z_FLAG_OPTIONAL, cd.len(), cd.as_ptr())
    });
    if rc < 0 {
        return Err("H5Pset_filter(bitshuffle) failed".into());
    }
    g.new_dataset::<T>().set_dcpl(&dcpl).chunk((1, h, w)).shape((0.., h, w)).create(name)
}

/// Rows of a frame stack (one chunk per row) from the first on whose chunks HDF5 holds: after
/// a failed write or a crash, the rows past them read as zeros, not as frames.
pub(crate) fn rows_with_chunks(ds: &Dataset) -> usize {
    let rows = ds.shape()[0];
    let mut have = vec![false; rows];
    for i in 0..ds.num_chunks().unwrap_or(0) {
        if let Some(h) = ds.chunk_info(i).and_then(|c| have.get_mut(c.offset[0] as usize)) {
            *h = true;
        }
    }
    have.iter().position(|h| !h).unwrap_or(rows)
}

/// Writes one pre-compressed chunk at frame index `index` of a frame stack. On failure the
/// error carries HDF5's error stack (see [`os_error`]).
pub fn write_chunk(ds: &Dataset, index: usize, chunk: &[u8]) -> hdf5::Result<()> {
    write_chunk_at(ds, &[index as _, 0, 0], chunk)
}

/// Writes one pre-compressed chunk at `offset` (one entry per dimension of `ds`).
pub(crate) fn write_chunk_at(ds: &Dataset, offset: &[hdf5_sys::h5::hsize_t], chunk: &[u8]) -> hdf5::Result<()> {
    if offset.len() != ds.ndim() {
        return Err(format!("a chunk offset of {} dimensions for a dataset of {}", offset.len(), ds.ndim()).into());
    }
    hdf5::sync::sync(|| {
        // SAFETY: `offset` has one entry per dataset dimension (checked above) and `chunk`
        // is a live buffer of the given size; filter mask 0 says every filter was applied.
        let rc = unsafe {
            hdf5_sys::h5d::H5Dwrite_chunk(ds.id(), hdf5_sys::h5p::H5P_DEFAULT, 0, offset.as_ptr(), chunk.len(), chunk.as_ptr().cast())
        };
        // the stack is read under the same lock, before another call can replace it
        hdf5::h5check(rc).map(drop)
    })
}

/// An HDF5 error in one line: the operating system's error where HDF5's file driver recorded
/// one (a full disk says "No space left on device"), else HDF5's message on one line.
pub fn brief(e: &hdf5::Error) -> String {
    match os_error(e) {
        Some(o) => o.to_string(),
        None => e.to_string().split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// The operating system's error behind an HDF5 error, where HDF5's file driver recorded
/// one (its messages say `errno = 28, error message = 'No space left on device'`).
pub fn os_error(e: &hdf5::Error) -> Option<std::io::Error> {
    let stack = e.stack()?;
    stack.iter().find_map(|f| {
        let at = f.desc().find("errno = ")? + "errno = ".len();
        let digits: String = f.desc()[at..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok().map(std::io::Error::from_raw_os_error)
    })
}

