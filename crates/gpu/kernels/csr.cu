// Compaction of what leaves the GPU for sparse frames: the pixels strictly above a
// threshold in CSR layout (crates/process/src/sparse.rs, Csr::fill, being the reference:
// NaN never above, +inf always). Two passes, one thread per row so that each row's entries
// keep their column order: count per row, then (after the host turned the counts into row
// offsets) write values and columns at the row's offset.

#define CSR_KERNELS(T, NAME)                                                                         \
extern "C" __global__ void csr_count_##NAME(const T* image, int rows, int cols, T threshold,        \
                                            unsigned int* counts) {                                 \
    int r = blockIdx.x * blockDim.x + threadIdx.x;                                                  \
    if (r >= rows) return;                                                                          \
    const T* row = image + (long long)r * cols;                                                     \
    unsigned int k = 0u;                                                                            \
    for (int c = 0; c < cols; c++) k += row[c] > threshold ? 1u : 0u;                               \
    counts[r] = k;                                                                                  \
}                                                                                                   \
extern "C" __global__ void csr_fill_##NAME(const T* image, int rows, int cols, T threshold,         \
                                           const unsigned int* row_ptr, T* values, unsigned int* col_of) { \
    int r = blockIdx.x * blockDim.x + threadIdx.x;                                                  \
    if (r >= rows) return;                                                                          \
    const T* row = image + (long long)r * cols;                                                     \
    unsigned int k = row_ptr[r];                                                                    \
    for (int c = 0; c < cols; c++) {                                                                \
        if (row[c] > threshold) { values[k] = row[c]; col_of[k] = (unsigned int)c; k++; }          \
    }                                                                                               \
}

CSR_KERNELS(float, f32)
CSR_KERNELS(int, i32)
