//! Bitshuffle (Masui et al.) and the bitshuffle+LZ4 / bitshuffle+Zstd HDF5 chunk format
//! (filter 32008, docs/formats.md section 2), written here because no maintained Rust crate
//! implements it; LZ4 blocks come from `lz4_flex` (decoded by liblz4, through `lz4`), Zstd
//! frames from `zstd` (libzstd).
//!
//! Transposition of a block of `n` elements (`n` a multiple of 8) of `size` bytes: output
//! row `byte * 8 + bit` (n / 8 bytes long) holds that bit of that byte of every element,
//! eight elements per output byte, least significant bit first.
//!
//! Chunk: 8-byte big-endian uncompressed size, 4-byte big-endian block size in bytes, then
//! per block a 4-byte big-endian compressed length and a raw LZ4 block (or a Zstd frame);
//! the last partial
//! block is rounded down to a multiple of 8 elements and the remaining `len % 8` elements
//! are appended uncompressed.

use thiserror::Error;

/// The bitshuffle library's default block: 8 KiB of elements, a multiple of 8, at least 128.
pub fn default_block_elems(elem_size: usize) -> usize {
    ((8192 / elem_size) / 8 * 8).max(128)
}

/// `src` (elements of `size` bytes) cut into blocks of `block_elems` elements as a chunk is
/// (the last block rounded down to whole groups of 8), each block transposed into `dst`
/// ([`shuffle_block`]), the last `n % 8` elements copied as they are: the layout
/// [`Compressor::compress_shuffled`] takes, and the GPU's bitshuffle makes.
pub fn shuffle_blocks(src: &[u8], size: usize, block_elems: usize, dst: &mut [u8]) {
    assert!(src.len().is_multiple_of(size) && dst.len() == src.len() && block_elems.is_multiple_of(8) && block_elems > 0, "whole elements, blocks of whole 8-element groups");
    let n = src.len() / size;
    let whole = n / 8 * 8 * size;
    for (s, d) in src[..whole].chunks(block_elems * size).zip(dst[..whole].chunks_mut(block_elems * size)) {
        shuffle_block(s, d, size);
    }
    dst[whole..].copy_from_slice(&src[whole..]);
}

/// Transposes one 8x8 bit matrix held in a u64 (byte i = row i): afterwards byte j, bit i
/// is what was byte i, bit j.
#[inline(always)]
fn transpose8(mut x: u64) -> u64 {
    let t = (x ^ (x >> 7)) & 0x00aa_00aa_00aa_00aa;
    x = x ^ t ^ (t << 7);
    let t = (x ^ (x >> 14)) & 0x0000_cccc_0000_cccc;
    x = x ^ t ^ (t << 14);
    let t = (x ^ (x >> 28)) & 0x0000_0000_f0f0_f0f0;
    x ^ t ^ (t << 28)
}

/// Bit-transposes one block: `src` holds `n` elements of `size` bytes, `n % 8 == 0`.
pub fn shuffle_block(src: &[u8], dst: &mut [u8], size: usize) {
    let n = src.len() / size;
    assert!(n % 8 == 0 && src.len() == n * size && dst.len() == src.len(), "block of whole 8-element groups");
    #[cfg(target_arch = "x86_64")]
    let done = if (size == 2 || size == 4) && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { avx2::shuffle_groups_of_32(src, dst, size) }
    } else {
        sse2::shuffle_groups_of_16(src, dst, size)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    shuffle_groups_of_8(src, dst, size, done / 8);
}

/// The portable path: 8-element groups from group `from` on, one 8x8 bit transpose per
/// byte of the element.
fn shuffle_groups_of_8(src: &[u8], dst: &mut [u8], size: usize, from: usize) {
    let row = src.len() / size / 8;
    for k in from..row {
        let group = &src[k * 8 * size..(k + 1) * 8 * size];
        for byte in 0..size {
            let mut x = 0u64;
            for l in 0..8 {
                x |= (group[l * size + byte] as u64) << (8 * l);
            }
            let y = transpose8(x);
            for bit in 0..8 {
                dst[(byte * 8 + bit) * row + k] = (y >> (8 * bit)) as u8;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Transposes whole groups of 32 elements of 2 or 4 bytes: byte shuffles gather each
    /// byte plane of the group into one register, then `movemask` takes one bit of all 32
    /// bytes at once. Returns the elements done.
    ///
    /// # Safety
    /// The CPU must have AVX2; `size` is 2 or 4, `src.len() == dst.len()`, a multiple of
    /// 8 elements (as [`super::shuffle_block`] asserts).
    #[target_feature(enable = "avx2")]
    pub unsafe fn shuffle_groups_of_32(src: &[u8], dst: &mut [u8], size: usize) -> usize {
        let n = src.len() / size;
        let groups = n / 32;
        let row = n / 8;
        let mut planes = [_mm256_setzero_si256(); 4];
        for g in 0..groups {
            // SAFETY (loads): group g spans bytes [g*32*size, (g+1)*32*size) of src, inside
            // it since g < n / 32.
            let p = src.as_ptr().add(g * 32 * size);
            if size == 2 {
                // per 128-bit lane: the 8 low bytes, then the 8 high bytes
                let m = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(_mm256_loadu_si256(p.cast()), m));
                let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(_mm256_loadu_si256(p.add(32).cast()), m));
                planes[0] = _mm256_permute2x128_si256::<0x20>(a, b);
                planes[1] = _mm256_permute2x128_si256::<0x31>(a, b);
            } else {
                // per 128-bit lane (4 elements): byte 0 of each, byte 1, byte 2, byte 3
                let m = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                let idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
                let mut q = [_mm256_setzero_si256(); 4];
                for (k, v) in q.iter_mut().enumerate() {
                    let x = _mm256_shuffle_epi8(_mm256_loadu_si256(p.add(32 * k).cast()), m);
                    // 64-bit word j now holds byte plane j of these 8 elements
                    *v = _mm256_permutevar8x32_epi32(x, idx);
                }
                let (lo_ab, hi_ab) = (_mm256_unpacklo_epi64(q[0], q[1]), _mm256_unpackhi_epi64(q[0], q[1]));
                let (lo_cd, hi_cd) = (_mm256_unpacklo_epi64(q[2], q[3]), _mm256_unpackhi_epi64(q[2], q[3]));
                planes[0] = _mm256_permute2x128_si256::<0x20>(lo_ab, lo_cd);
                planes[1] = _mm256_permute2x128_si256::<0x20>(hi_ab, hi_cd);
                planes[2] = _mm256_permute2x128_si256::<0x31>(lo_ab, lo_cd);
                planes[3] = _mm256_permute2x128_si256::<0x31>(hi_ab, hi_cd);
            }
            for (byte, plane) in planes.iter().take(size).enumerate() {
                let mut v = *plane;
                for bit in (0..8).rev() {
                    let mask = _mm256_movemask_epi8(v) as u32;
                    // SAFETY (store): 4 bytes at (byte*8 + bit)*row + 4g; 4g + 4 <= row
                    // since g < n/32, and (byte*8 + bit) < 8*size, so inside dst.
                    let at = (byte * 8 + bit) * row + 4 * g;
                    dst.as_mut_ptr().add(at).cast::<u32>().write_unaligned(mask.to_le());
                    v = _mm256_add_epi8(v, v);
                }
            }
        }
        groups * 32
    }

    /// Inverse of [`shuffle_groups_of_32`]: each bit plane's 32 bits of a group are spread
    /// over the group's 32 bytes (byte e takes bit e), building each byte plane, and the
    /// byte planes are interleaved into the elements. Returns the elements done.
    ///
    /// # Safety
    /// The CPU must have AVX2; `size` is 2 or 4, `src.len() == dst.len()`, a multiple of
    /// 8 elements (as [`super::unshuffle_block`] asserts).
    #[target_feature(enable = "avx2")]
    pub unsafe fn unshuffle_groups_of_32(src: &[u8], dst: &mut [u8], size: usize) -> usize {
        let n = src.len() / size;
        let groups = n / 32;
        let row = n / 8;
        // byte e of a lane takes byte e / 8 of the broadcast word, and keeps bit e % 8 of it
        let spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let mut planes = [_mm256_setzero_si256(); 4];
        for g in 0..groups {
            for (byte, plane) in planes.iter_mut().take(size).enumerate() {
                let mut v = _mm256_setzero_si256();
                for bit in 0..8 {
                    // SAFETY (load): 4 bytes at (byte*8 + bit)*row + 4g; 4g + 4 <= row since
                    // g < n/32, and byte*8 + bit < 8*size, so they end within 8*size*row,
                    // src's length.
                    let at = (byte * 8 + bit) * row + 4 * g;
                    let word = src.as_ptr().add(at).cast::<u32>().read_unaligned();
                    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(u32::from_le(word) as i32), spread);
                    let on = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
                    v = _mm256_or_si256(v, _mm256_and_si256(on, _mm256_set1_epi8((1u8 << bit) as i8)));
                }
                *plane = v;
            }
            // SAFETY (stores): group g's 32 elements are bytes [g*32*size, (g+1)*32*size) of
            // dst, inside it since g < n / 32.
            let out = dst.as_mut_ptr().add(g * 32 * size);
            if size == 2 {
                let (lo, hi) = (_mm256_unpacklo_epi8(planes[0], planes[1]), _mm256_unpackhi_epi8(planes[0], planes[1]));
                _mm256_storeu_si256(out.cast(), _mm256_permute2x128_si256::<0x20>(lo, hi));
                _mm256_storeu_si256(out.add(32).cast(), _mm256_permute2x128_si256::<0x31>(lo, hi));
            } else {
                let (a, b) = (_mm256_unpacklo_epi8(planes[0], planes[1]), _mm256_unpackhi_epi8(planes[0], planes[1]));
                let (c, d) = (_mm256_unpacklo_epi8(planes[2], planes[3]), _mm256_unpackhi_epi8(planes[2], planes[3]));
                // per lane: elements 0-3, 4-7, 8-11, 12-15 of the lane's 16
                let w = [_mm256_unpacklo_epi16(a, c), _mm256_unpackhi_epi16(a, c), _mm256_unpacklo_epi16(b, d), _mm256_unpackhi_epi16(b, d)];
                _mm256_storeu_si256(out.cast(), _mm256_permute2x128_si256::<0x20>(w[0], w[1]));
                _mm256_storeu_si256(out.add(32).cast(), _mm256_permute2x128_si256::<0x20>(w[2], w[3]));
                _mm256_storeu_si256(out.add(64).cast(), _mm256_permute2x128_si256::<0x31>(w[0], w[1]));
                _mm256_storeu_si256(out.add(96).cast(), _mm256_permute2x128_si256::<0x31>(w[2], w[3]));
            }
        }
        groups * 32
    }
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    /// Transposes whole groups of 16 elements with SSE2 (part of every x86-64 CPU):
    /// `movemask` gathers one bit of 16 bytes at once. Returns the elements done.
    pub fn shuffle_groups_of_16(src: &[u8], dst: &mut [u8], size: usize) -> usize {
        let n = src.len() / size;
        let groups = n / 16;
        let row = n / 8;
        let mut lanes = [[0u8; 16]; 8];
        for g in 0..groups {
            let group = &src[g * 16 * size..(g + 1) * 16 * size];
            for byte in 0..size {
                // SAFETY: SSE2 is always available on x86_64; every load reads 16 bytes
                // inside `group` or `lanes`, and each store writes 2 bytes at
                // (byte*8 + bit)*row + 2g, inside dst since 2g + 2 <= row.
                unsafe {
                    let mut v = if size == 2 {
                        let a = _mm_loadu_si128(group.as_ptr().cast());
                        let b = _mm_loadu_si128(group.as_ptr().add(16).cast());
                        if byte == 0 {
                            let m = _mm_set1_epi16(0xff);
                            _mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m))
                        } else {
                            _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8))
                        }
                    } else {
                        let lane = &mut lanes[byte % 8];
                        for (l, x) in lane.iter_mut().enumerate() {
                            *x = group[l * size + byte];
                        }
                        _mm_loadu_si128(lane.as_ptr().cast())
                    };
                    for bit in (0..8).rev() {
                        let mask = _mm_movemask_epi8(v) as u16;
                        let at = (byte * 8 + bit) * row + 2 * g;
                        dst[at..at + 2].copy_from_slice(&mask.to_le_bytes());
                        v = _mm_add_epi8(v, v);
                    }
                }
            }
        }
        groups * 16
    }
}

/// Inverse of [`shuffle_block`].
pub fn unshuffle_block(src: &[u8], dst: &mut [u8], size: usize) {
    let n = src.len() / size;
    assert!(n % 8 == 0 && src.len() == n * size && dst.len() == src.len(), "block of whole 8-element groups");
    #[cfg(target_arch = "x86_64")]
    let done = if (size == 2 || size == 4) && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), and the block is as asserted.
        unsafe { avx2::unshuffle_groups_of_32(src, dst, size) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    unshuffle_groups_of_8(src, dst, size, done / 8);
}

/// The portable path of [`unshuffle_block`], from 8-element group `from` on. Eight groups
/// at a time: the 8 bit planes of one byte give a word each, transposed bytewise into each
/// group's 8 plane bytes, then bitwise into its elements' bytes.
fn unshuffle_groups_of_8(src: &[u8], dst: &mut [u8], size: usize, from: usize) {
    let row = src.len() / size / 8;
    let wide = from + (row - from) / 8 * 8;
    for byte in 0..size {
        let planes = &src[byte * 8 * row..(byte + 1) * 8 * row];
        for k0 in (from..wide).step_by(8) {
            let mut a = [0u64; 8];
            for (bit, w) in a.iter_mut().enumerate() {
                *w = u64::from_le_bytes(planes[bit * row + k0..bit * row + k0 + 8].try_into().expect("8 bytes"));
            }
            transpose_bytes8(&mut a);
            for (j, &y) in a.iter().enumerate() {
                put_group(dst, k0 + j, byte, size, transpose8(y));
            }
        }
        for k in wide..row {
            let y = (0..8).fold(0u64, |y, bit| y | (planes[bit * row + k] as u64) << (8 * bit));
            put_group(dst, k, byte, size, transpose8(y));
        }
    }
}

/// Byte `byte` of the 8 elements of group `k`, from the bytes of `x`.
fn put_group(dst: &mut [u8], k: usize, byte: usize, size: usize, x: u64) {
    for l in 0..8 {
        dst[(k * 8 + l) * size + byte] = (x >> (8 * l)) as u8;
    }
}

/// Transposes the 8 x 8 byte matrix whose row `i` is word `i` (byte `j`: column `j`).
fn transpose_bytes8(a: &mut [u64; 8]) {
    for (step, mask, pairs) in [(32, 0x0000_0000_ffff_ffffu64, [0, 1, 2, 3]), (16, 0x0000_ffff_0000_ffff, [0, 1, 4, 5]), (8, 0x00ff_00ff_00ff_00ff, [0, 2, 4, 6])] {
        let d = step / 8;
        for i in pairs {
            let t = ((a[i] >> step) ^ a[i + d]) & mask;
            a[i] ^= t << step;
            a[i + d] ^= t;
        }
    }
}

/// The codec of the blocks after transposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Lz4,
    /// Zstd at this compression level.
    Zstd(i32),
}

impl Codec {
    /// The codec named `name` (`lz4` or `zstd`; Zstd at `zstd_level`).
    pub fn parse(name: &str, zstd_level: i32) -> Result<Codec, crate::UnknownName> {
        match name {
            "lz4" => Ok(Codec::Lz4),
            "zstd" => Ok(Codec::Zstd(zstd_level)),
            _ => Err(crate::UnknownName { what: "codec", name: name.into(), expected: "lz4 or zstd" }),
        }
    }

    /// The HDF5 cd_values entries 4 and 5 of filter 32008: 2 = LZ4, 3 = Zstd, then the level.
    pub fn cd_values(self) -> [u32; 2] {
        match self {
            Codec::Lz4 => [2, 0],
            Codec::Zstd(level) => [3, level as u32],
        }
    }
}

/// Reusable buffers (and the Zstd context) for compressing chunks without allocating per
/// frame once `out` has grown to its working size.
pub struct Compressor {
    elem_size: usize,
    block_elems: usize,
    shuffled: Vec<u8>,
    packer: Packer,
}

impl Compressor {
    /// `block_elems` 0 picks the library default.
    pub fn new(elem_size: usize, block_elems: usize, codec: Codec) -> Self {
        let block_elems = if block_elems == 0 { default_block_elems(elem_size) } else { block_elems };
        assert!(block_elems % 8 == 0 && block_elems > 0, "block size must be a multiple of 8 elements");
        let zstd = match codec {
            Codec::Lz4 => None,
            Codec::Zstd(level) => Some(zstd::bulk::Compressor::new(level).expect("libzstd accepts every level (it clamps)")),
        };
        let block_bytes = block_elems * elem_size;
        let worst = lz4_flex::block::get_maximum_output_size(block_bytes).max(zstd::zstd_safe::compress_bound(block_bytes));
        Compressor { elem_size, block_elems, shuffled: vec![0; block_bytes], packer: Packer { packed: vec![0; worst], zstd } }
    }

    /// Elements per block (the last block of a chunk may hold fewer).
    pub fn block_elems(&self) -> usize {
        self.block_elems
    }

    /// Compresses `src` (whole elements) into `out` (cleared first) as one chunk.
    pub fn compress(&mut self, src: &[u8], out: &mut Vec<u8>) {
        self.chunk(src, false, out);
    }

    /// Compresses `n` elements of `T` (of the compressor's element size) into `out` (cleared
    /// first) as one chunk, the elements made block by block: `produce(first, block)` fills
    /// `block` with elements `first..first + block.len()`, in order, once each. The elements
    /// then never exist as a whole array: each block is made in `staging` (one block long),
    /// which stays in the core's cache until it is compressed. The chunk is the one
    /// [`Compressor::compress`] makes of the same elements.
    pub fn compress_from<T: crate::Plain + Default>(&mut self, n: usize, staging: &mut Vec<T>, out: &mut Vec<u8>, mut produce: impl FnMut(usize, &mut [T])) {
        assert_eq!(std::mem::size_of::<T>(), self.elem_size, "elements of the compressor's size");
        staging.resize(self.block_elems.max(8), T::default());
        self.header(n, out);
        let mut at = 0;
        for elems in self.blocks(n) {
            produce(at, &mut staging[..elems]);
            self.block(crate::bytes_of(&staging[..elems]), out);
            at += elems;
        }
        // the last elements (fewer than 8) go in uncompressed
        produce(at, &mut staging[..n - at]);
        out.extend_from_slice(crate::bytes_of(&staging[..n - at]));
    }

    /// The chunk [`Compressor::compress`] makes of elements whose blocks are transposed
    /// already: `shuffled` as [`shuffle_blocks`] lays them out with this compressor's block
    /// size (the GPU's bitshuffle makes the same), so only the codec runs here.
    pub fn compress_shuffled(&mut self, shuffled: &[u8], out: &mut Vec<u8>) {
        self.chunk(shuffled, true, out);
    }

    /// The chunk of `src` (whole elements), its blocks `transposed` already or not.
    fn chunk(&mut self, src: &[u8], transposed: bool, out: &mut Vec<u8>) {
        let es = self.elem_size;
        assert_eq!(src.len() % es, 0, "whole elements");
        let n = src.len() / es;
        self.header(n, out);
        let mut at = 0;
        for elems in self.blocks(n) {
            let block = &src[at..at + elems * es];
            if transposed {
                self.packer.pack(block, out);
            } else {
                self.block(block, out);
            }
            at += elems * es;
        }
        out.extend_from_slice(&src[at..]);
    }

    /// The chunk's header for `n` elements.
    fn header(&self, n: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&((n * self.elem_size) as u64).to_be_bytes());
        out.extend_from_slice(&((self.block_elems * self.elem_size) as u32).to_be_bytes());
    }

    /// The elements of each compressed block of `n`: whole blocks, then the rest rounded
    /// down to a multiple of 8 (if any).
    fn blocks(&self, n: usize) -> impl Iterator<Item = usize> {
        let (be, full) = (self.block_elems, n / self.block_elems);
        let last = (n % be) / 8 * 8;
        (0..full).map(move |_| be).chain((last > 0).then_some(last))
    }

    /// Shuffles and compresses one block (whole 8-element groups) onto the chunk.
    fn block(&mut self, src: &[u8], out: &mut Vec<u8>) {
        let shuffled = &mut self.shuffled[..src.len()];
        shuffle_block(src, shuffled, self.elem_size);
        self.packer.pack(shuffled, out);
    }
}

/// The codec's side of a [`Compressor`]: one compressed block at its worst-case size, and
/// the Zstd context.
struct Packer {
    packed: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Packer {
    /// Compresses one shuffled block onto the chunk, its size first.
    fn pack(&mut self, shuffled: &[u8], out: &mut Vec<u8>) {
        // into a scratch block sized once for the worst case, then only the compressed
        // bytes into the chunk: no zeroing of a worst-case output per block
        let c = match self.zstd.as_mut() {
            None => lz4_flex::block::compress_into(shuffled, &mut self.packed).expect("scratch sized for the worst case"),
            Some(z) => z.compress_to_buffer(shuffled, &mut self.packed).expect("scratch sized for the worst case"),
        };
        out.extend_from_slice(&(c as u32).to_be_bytes());
        out.extend_from_slice(&self.packed[..c]);
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChunkError {
    #[error("chunk is truncated")]
    Truncated,
    #[error("chunk block size {0} is not a positive multiple of 8 elements")]
    BadBlockSize(u32),
    #[error("compressed block does not decode to {0} bytes")]
    BadBlock(usize),
    /// The header claims more bytes than the chunk's blocks can hold.
    #[error("chunk of {len} bytes claims {total} bytes, more than its blocks can hold")]
    Claims { total: u64, len: usize },
}

/// The largest chunk HDF5 stores (its chunk sizes are 32-bit): a larger claim is refused.
pub const MAX_CHUNK_BYTES: u64 = u32::MAX as u64;

/// Decodes a bitshuffle chunk of `elem_size`-byte elements (for tests and tools; the readers
/// of our files are hdf5plugin and the bitshuffle library).
pub fn decompress(chunk: &[u8], elem_size: usize, codec: Codec) -> Result<Vec<u8>, ChunkError> {
    let total = u64::from_be_bytes(chunk.get(0..8).ok_or(ChunkError::Truncated)?.try_into().unwrap()) as usize;
    let block_bytes = u32::from_be_bytes(chunk.get(8..12).ok_or(ChunkError::Truncated)?.try_into().unwrap());
    let be = block_bytes as usize / elem_size;
    if be == 0 || be % 8 != 0 || block_bytes as usize % elem_size != 0 {
        return Err(ChunkError::BadBlockSize(block_bytes));
    }
    // every block follows its 4-byte length, and the unshuffled rest is under 8 elements:
    // a claim beyond that is refused before anything is allocated for it
    let most = ((chunk.len() - 12) / 4).saturating_mul(block_bytes as usize).saturating_add(elem_size.saturating_mul(8));
    if total > most || total as u64 > MAX_CHUNK_BYTES {
        return Err(ChunkError::Claims { total: total as u64, len: chunk.len() });
    }
    let n = total / elem_size;
    let mut out = vec![0u8; total];
    let mut tmp = vec![0u8; (block_bytes as usize).min(total)];
    let (mut pos, mut at) = (12usize, 0usize);
    let blocks = n / be + usize::from((n % be) / 8 * 8 > 0);
    for b in 0..blocks {
        let elems = if b < n / be { be } else { (n % be) / 8 * 8 };
        let bytes = elems * elem_size;
        let clen = u32::from_be_bytes(chunk.get(pos..pos + 4).ok_or(ChunkError::Truncated)?.try_into().unwrap()) as usize;
        pos += 4;
        let cblock = chunk.get(pos..pos + clen).ok_or(ChunkError::Truncated)?;
        pos += clen;
        let got = match codec {
            // liblz4's decoder: several times lz4_flex's on these blocks (rdaq bench join)
            Codec::Lz4 => {
                let size = i32::try_from(bytes).map_err(|_| ChunkError::BadBlock(bytes))?;
                lz4::block::decompress_to_buffer(cblock, Some(size), &mut tmp[..bytes]).map_err(|_| ChunkError::BadBlock(bytes))?
            }
            Codec::Zstd(_) => zstd::bulk::decompress_to_buffer(cblock, &mut tmp[..bytes]).map_err(|_| ChunkError::BadBlock(bytes))?,
        };
        if got != bytes {
            return Err(ChunkError::BadBlock(bytes));
        }
        unshuffle_block(&tmp[..bytes], &mut out[at..at + bytes], elem_size);
        at += bytes;
    }
    let rest = chunk.get(pos..pos + (total - at)).ok_or(ChunkError::Truncated)?;
    out[at..].copy_from_slice(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_chunk_claiming_more_than_its_blocks_hold_is_refused() {
        let mut chunk = (32u64 << 30).to_be_bytes().to_vec();
        chunk.extend_from_slice(&8192u32.to_be_bytes());
        chunk.extend_from_slice(&[0u8; 16]);
        assert_eq!(decompress(&chunk, 2, Codec::Lz4), Err(ChunkError::Claims { total: 32 << 30, len: 28 }));
    }

    proptest! {
        /// Whatever a chunk's header claims, decoding answers (an error or the bytes), with
        /// no more memory than the chunk's blocks can hold.
        #[test]
        fn any_claimed_size_is_answered(total in any::<u64>(), block in any::<u32>(), body in proptest::collection::vec(any::<u8>(), 0..64), elem in 1usize..9) {
            let mut chunk = total.to_be_bytes().to_vec();
            chunk.extend_from_slice(&block.to_be_bytes());
            chunk.extend_from_slice(&body);
            let _ = decompress(&chunk, elem, Codec::Lz4);
            let _ = decompress(&chunk, elem, Codec::Zstd(3));
        }
    }

    /// The definition, one bit at a time: the oracle for the fast transposition.
    fn shuffle_naive(src: &[u8], size: usize) -> Vec<u8> {
        let n = src.len() / size;
        let mut dst = vec![0u8; src.len()];
        for e in 0..n {
            for byte in 0..size {
                for bit in 0..8 {
                    if src[e * size + byte] >> bit & 1 == 1 {
                        let out_bit = (byte * 8 + bit) * n + e;
                        dst[out_bit / 8] |= 1 << (out_bit % 8);
                    }
                }
            }
        }
        dst
    }

    proptest! {
        #[test]
        fn fast_shuffle_matches_definition(size in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
                                           groups in 1usize..200, seed: u64) {
            let n = groups * 8;
            let src: Vec<u8> = (0..n * size).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 13) as u8).collect();
            let mut dst = vec![0; src.len()];
            shuffle_block(&src, &mut dst, size);
            prop_assert_eq!(&dst, &shuffle_naive(&src, size));
            let mut back = vec![0; src.len()];
            unshuffle_block(&dst, &mut back, size);
            prop_assert_eq!(back, src);
        }

        #[test]
        fn chunks_roundtrip(size in prop_oneof![Just(2usize), Just(4)], n in 0usize..20_000, block in prop_oneof![Just(0usize), Just(128), Just(1000)],
                            codec in prop_oneof![Just(Codec::Lz4), Just(Codec::Zstd(1)), Just(Codec::Zstd(5))], seed: u64) {
            let src: Vec<u8> = (0..n * size).map(|i| ((seed ^ i as u64).wrapping_mul(0x9e37_79b9) >> 20) as u8 & 0x0f).collect();
            let mut c = Compressor::new(size, block, codec);
            let mut out = Vec::new();
            c.compress(&src, &mut out);
            prop_assert_eq!(&decompress(&out, size, codec).unwrap(), &src);
            let mut shuffled = vec![0u8; src.len()];
            shuffle_blocks(&src, size, c.block_elems(), &mut shuffled);
            let mut from_shuffled = Vec::new();
            c.compress_shuffled(&shuffled, &mut from_shuffled);
            prop_assert_eq!(from_shuffled, out);
        }
    }

    #[test]
    fn header_is_big_endian_sizes() {
        let mut c = Compressor::new(2, 0, Codec::Lz4);
        let mut out = Vec::new();
        c.compress(&[0u8; 16384], &mut out);
        assert_eq!(&out[..12], &[0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0x20, 0]);
        assert!(out.len() < 200, "zeros compress");
    }

    #[test]
    fn chunks_made_block_by_block_equal_whole_ones() {
        for n in [0usize, 5, 2048, 2048 * 3 + 13] {
            let src: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % 5 - 1).collect();
            let (mut whole, mut blocks) = (Vec::new(), Vec::new());
            let mut c = Compressor::new(4, 0, Codec::Lz4);
            c.compress(crate::bytes_of(&src), &mut whole);
            let mut staging = Vec::new();
            c.compress_from(n, &mut staging, &mut blocks, |first, b: &mut [i32]| b.copy_from_slice(&src[first..first + b.len()]));
            assert_eq!(whole, blocks, "{n} elements");
        }
    }
}
