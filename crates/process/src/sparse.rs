//! The sparse form of a converted frame: the pixels above a threshold in compressed sparse
//! row (CSR) layout, as scipy.sparse.csr_matrix reads it: `values[k]` sits in column
//! `cols[k]`, and row `r` holds entries `row_ptr[r]..row_ptr[r + 1]`.

/// A CSR image whose buffers are reused from frame to frame.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Csr<T> {
    pub rows: usize,
    pub cols_total: usize,
    pub values: Vec<T>,
    pub cols: Vec<u32>,
    pub row_ptr: Vec<u32>,
}

impl<T: Copy + PartialOrd> Csr<T> {
    /// Fills from a row-major `rows x cols` image: every pixel strictly above `threshold`
    /// (NaN never is; +inf, a saturated pixel, always is).
    pub fn fill(&mut self, image: &[T], rows: usize, cols: usize, threshold: T) {
        assert_eq!(image.len(), rows * cols, "image of rows x cols");
        assert!(image.len() <= u32::MAX as usize, "u32 indices");
        self.rows = rows;
        self.cols_total = cols;
        self.values.clear();
        self.cols.clear();
        self.row_ptr.clear();
        self.row_ptr.push(0);
        for row in image.chunks_exact(cols) {
            for (c, &v) in row.iter().enumerate() {
                if v > threshold {
                    self.values.push(v);
                    self.cols.push(c as u32);
                }
            }
            self.row_ptr.push(self.values.len() as u32);
        }
    }

    /// The dense image with `fill` where nothing is stored (for tests and tools).
    pub fn to_dense(&self, fill: T) -> Vec<T> {
        let mut out = vec![fill; self.rows * self.cols_total];
        for r in 0..self.rows {
            for k in self.row_ptr[r] as usize..self.row_ptr[r + 1] as usize {
                out[r * self.cols_total + self.cols[k] as usize] = self.values[k];
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_scipy_csr() {
        let img = [0.0f32, 5.0, 0.0, 7.0, 0.0, 0.0, f32::NAN, f32::INFINITY, 1.0];
        let mut c = Csr::default();
        c.fill(&img, 3, 3, 0.5);
        assert_eq!(c.values, vec![5.0, 7.0, f32::INFINITY, 1.0]);
        assert_eq!(c.cols, vec![1, 0, 1, 2]);
        assert_eq!(c.row_ptr, vec![0, 1, 2, 4]);
    }

    proptest! {
        #[test]
        fn dense_roundtrip_keeps_every_pixel_above(rows in 1usize..20, cols in 1usize..20, seed: u64) {
            let img: Vec<i32> = (0..rows * cols).map(|i| ((seed ^ i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as i32 - 8).collect();
            let mut c = Csr::default();
            c.fill(&img, rows, cols, 3);
            let want: Vec<i32> = img.iter().map(|&v| if v > 3 { v } else { i32::MIN }).collect();
            prop_assert_eq!(c.to_dense(i32::MIN), want);
        }
    }
}
