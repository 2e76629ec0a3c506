//! The packet grid of a frame slot: module `m` occupies bytes `[m * module_bytes,
//! (m + 1) * module_bytes)`, cut into cells of `cell_bytes` (the datagram payload size; the
//! last cell of a module may be shorter). One bit per cell in the frame's packet bitmap.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub modules: u16,
    pub module_bytes: u64,
    pub cell_bytes: u64,
    pub cells_per_module: u32,
}

impl Grid {
    pub fn new(modules: u16, module_bytes: u64, cell_bytes: u64) -> Grid {
        assert!(modules > 0 && module_bytes > 0 && cell_bytes > 0, "empty grid");
        let cells_per_module = module_bytes.div_ceil(cell_bytes) as u32;
        Grid { modules, module_bytes, cell_bytes, cells_per_module }
    }

    pub fn slot_bytes(&self) -> u64 {
        self.modules as u64 * self.module_bytes
    }

    pub fn cells(&self) -> u32 {
        self.modules as u32 * self.cells_per_module
    }

    /// Byte offset of a cell in the slot.
    #[inline]
    /// 16-bit pixels of a whole frame (every module).
    pub fn frame_pixels(&self) -> usize {
        (self.modules as u64 * self.module_bytes / 2) as usize
    }

    pub fn cell_offset(&self, cell: u32) -> u64 {
        let (m, k) = (cell / self.cells_per_module, cell % self.cells_per_module);
        m as u64 * self.module_bytes + k as u64 * self.cell_bytes
    }

    /// Length of a cell (the last one of a module may be short).
    #[inline]
    pub fn cell_len(&self, cell: u32) -> u64 {
        let k = (cell % self.cells_per_module) as u64;
        self.cell_bytes.min(self.module_bytes - k * self.cell_bytes)
    }

    /// The cell that module `module`'s payload at slot offset `offset` of `len` bytes fills,
    /// or `None` when it is not exactly one cell of that module.
    #[inline]
    pub fn cell_at(&self, module: u16, offset: u64, len: u64) -> Option<u32> {
        let base = module as u64 * self.module_bytes;
        let rel = offset.checked_sub(base)?;
        if rel >= self.module_bytes || rel % self.cell_bytes != 0 {
            return None;
        }
        let cell = module as u32 * self.cells_per_module + (rel / self.cell_bytes) as u32;
        (self.cell_len(cell) == len).then_some(cell)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_cover_modules_exactly() {
        let g = Grid::new(2, 10_000, 4096);
        assert_eq!(g.cells_per_module, 3);
        assert_eq!(g.cell_len(2), 10_000 - 8192);
        assert_eq!(g.cell_at(1, 10_000 + 4096, 4096), Some(4));
        assert_eq!(g.cell_at(1, 10_000 + 8192, 10_000 - 8192), Some(5));
        assert_eq!(g.cell_at(0, 10_000, 4096), None, "module 0 cannot write module 1");
        assert_eq!(g.cell_at(0, 100, 4096), None, "misaligned");
        assert_eq!(g.cell_at(0, 0, 4095), None, "short");
        assert_eq!(g.cell_offset(4), 10_000 + 4096);
    }
}
