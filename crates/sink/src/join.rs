//! One master file over several series (the receivers of one acquisition): its virtual
//! datasets read every frame of every receiver's data files once, in frame order, so that a
//! reader (DIALS, h5py, XDS through the links) opens the whole acquisition as one series,
//! as Dectris and odin-data users do. Nothing is copied: the data files stay where their
//! receivers wrote them. The series must be whole frames of one detector (temporal
//! receivers); receivers that hold parts of the image (spatial) cannot be joined this way.

use std::path::{Component, Path, PathBuf};

use thiserror::Error;

use crate::instrument::MaskChunk;
use crate::master::{data_file_name, read_meta, write_layout, Layout, Piece};

#[derive(Debug, Error)]
pub enum JoinError {
    #[error("{path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("{0}: the series differ in {1} (only series of whole frames of one detector can be joined)")]
    Differ(PathBuf, &'static str),
    #[error("frame {frame} is in {first} and in {second}")]
    Twice { frame: u64, first: PathBuf, second: PathBuf },
    #[error(transparent)]
    Claim(#[from] crate::claim::ClaimError),
    #[error("nothing to join: {0}")]
    Empty(String),
}

/// What a joined master holds.
#[derive(Debug, Default)]
pub struct Joined {
    pub frames: u64,
    pub data_files: usize,
}

/// One row of a data file: its frame number, the file, and the row in it.
struct Row {
    frame: u64,
    file: usize,
    row: usize,
}

/// Writes `out`, a master over the series of `masters` (refused if it exists, unless
/// `overwrite`).
pub fn join(out: &Path, masters: &[PathBuf], overwrite: bool) -> Result<Joined, JoinError> {
    let first = masters.first().ok_or_else(|| JoinError::Empty("no master files given".into()))?;
    let meta = read_meta(first).map_err(|source| JoinError::Hdf5 { path: first.clone(), source })?;
    let (mut files, mut rows, mut masks) = (Vec::new(), Vec::new(), Vec::new());
    for m in masters {
        let other = read_meta(m).map_err(|source| JoinError::Hdf5 { path: m.clone(), source })?;
        if (other.geometry.height(), other.geometry.width(), other.geometry.modules) != (meta.geometry.height(), meta.geometry.width(), meta.geometry.modules) {
            return Err(JoinError::Differ(m.clone(), "their images"));
        }
        if other.pixel != meta.pixel || other.max_spots != meta.max_spots {
            return Err(JoinError::Differ(m.clone(), "their pixel type or spot lists"));
        }
        for path in (1..).map(|k| m.with_file_name(data_file_name(m, k))).take_while(|p| crate::claim::taken(p)) {
            let (numbers, incomplete) = tables(&path).map_err(|source| JoinError::Hdf5 { path: path.clone(), source })?;
            let file = files.len();
            rows.extend(numbers.iter().enumerate().map(|(row, &frame)| Row { frame, file, row }));
            masks.extend(incomplete.iter().enumerate().map(|(row, &frame)| Row { frame, file, row }));
            files.push(path);
        }
    }
    if rows.is_empty() {
        return Err(JoinError::Empty(format!("the data files of {} hold no frame", masters.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", "))));
    }
    rows.sort_by_key(|r| r.frame);
    masks.sort_by_key(|r| r.frame);
    if let Some(w) = rows.windows(2).find(|w| w[0].frame == w[1].frame) {
        return Err(JoinError::Twice { frame: w[0].frame, first: files[w[0].file].clone(), second: files[w[1].file].clone() });
    }
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let names: Vec<String> = files.iter().map(|f| relative(dir, f)).collect();
    let (numbers, incomplete): (Vec<u64>, Vec<u64>) = (rows.iter().map(|r| r.frame).collect(), masks.iter().map(|r| r.frame).collect());
    let layout = Layout { frames: pieces(&rows, &names), masks: pieces(&masks, &names), files: names, frame_numbers: &numbers, incomplete: &incomplete, end_time: None };
    let meta = crate::NxmxMeta { number_of_images: Some(numbers.len() as u64), ..meta };
    if crate::claim::taken(out) && !overwrite {
        return Err(crate::claim::ClaimError::Exists(out.to_owned()).into());
    }
    if crate::claim::is_link(out) {
        return Err(crate::claim::ClaimError::Link(out.to_owned()).into());
    }
    write_layout(out, &meta, &MaskChunk::new(&meta), &layout).map_err(|source| JoinError::Hdf5 { path: out.to_owned(), source })?;
    Ok(Joined { frames: numbers.len() as u64, data_files: files.len() })
}

/// A data file's frame numbers and incomplete frames' numbers, in its row order.
fn tables(path: &Path) -> hdf5::Result<(Vec<u64>, Vec<u64>)> {
    let f = hdf5::File::open(path)?;
    Ok((f.dataset("entry/data/frame_number")?.read_raw()?, f.dataset("entry/data/incomplete_frame_number")?.read_raw()?))
}

/// The rows (in the joined order) as pieces: per file, runs of consecutive rows that land a
/// fixed step apart (receivers taking turns give one piece per file).
fn pieces(rows: &[Row], names: &[String]) -> Vec<Piece> {
    let mut by_file: Vec<Vec<(usize, usize)>> = vec![Vec::new(); names.len()];
    for (dst, r) in rows.iter().enumerate() {
        by_file[r.file].push((r.row, dst));
    }
    let mut out = Vec::new();
    for (file, mut placed) in by_file.into_iter().enumerate() {
        placed.sort_unstable();
        let mut i = 0;
        while i < placed.len() {
            let (src, dst) = placed[i];
            let step = placed.get(i + 1).filter(|n| n.0 == src + 1 && n.1 > dst).map_or(1, |n| n.1 - dst);
            let mut count = 1;
            while placed.get(i + count).is_some_and(|&(s, d)| s == src + count && d == dst + count * step) {
                count += 1;
            }
            out.push(Piece { file: names[file].clone(), src_start: src, dst_start: dst, dst_step: step, count });
            i += count;
        }
    }
    out
}

/// `to` as a path relative to the directory `from` (as the master names its data files),
/// or absolute when the two share no root.
fn relative(from: &Path, to: &Path) -> String {
    let (Ok(from), Ok(to)) = (std::path::absolute(from), std::path::absolute(to)) else {
        return to.display().to_string();
    };
    let (f, t): (Vec<Component>, Vec<Component>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    if common == 0 {
        return to.display().to_string();
    }
    let mut rel = PathBuf::new();
    for _ in common..f.len() {
        rel.push("..");
    }
    t[common..].iter().for_each(|c| rel.push(c));
    rel.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receivers_taking_turns_give_one_piece_each() {
        let names = vec!["a".to_string(), "b".to_string()];
        let rows: Vec<Row> = (0..10u64).map(|f| Row { frame: f, file: (f % 2) as usize, row: (f / 2) as usize }).collect();
        let p = pieces(&rows, &names);
        assert_eq!(p, vec![
            Piece { file: "a".into(), src_start: 0, dst_start: 0, dst_step: 2, count: 5 },
            Piece { file: "b".into(), src_start: 0, dst_start: 1, dst_step: 2, count: 5 },
        ]);
        // a gap breaks the run: each run lands where its frames are
        let rows = vec![Row { frame: 0, file: 0, row: 0 }, Row { frame: 1, file: 0, row: 1 }, Row { frame: 2, file: 1, row: 0 }, Row { frame: 3, file: 0, row: 2 }];
        let p = pieces(&rows, &names);
        assert_eq!(p[0], Piece { file: "a".into(), src_start: 0, dst_start: 0, dst_step: 1, count: 2 });
        assert_eq!(p[1], Piece { file: "a".into(), src_start: 2, dst_start: 3, dst_step: 1, count: 1 });
        assert_eq!(p[2], Piece { file: "b".into(), src_start: 0, dst_start: 2, dst_step: 1, count: 1 });
    }

    #[test]
    fn data_files_are_named_relative_to_the_master() {
        assert_eq!(relative(Path::new("/a/out"), Path::new("/a/dr0/x.h5")), "../dr0/x.h5");
        assert_eq!(relative(Path::new("/a"), Path::new("/a/x.h5")), "x.h5");
    }
}
