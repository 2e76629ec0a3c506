// The local-SNR strong-pixel test on the GPU, the CPU finder (crates/process/src/spots.rs,
// LocalSnr::find) being the reference. Its decisions depend on floating-point sums, so the
// sums are formed in the CPU's order: the CPU keeps running column sums that it updates as
// its window moves down the image (add row r + n, then remove row r - n - 1, before testing
// row r); here one thread per column replays that sequence and stores the sums each row
// sees (colsum_running), and one thread per pixel then sums the box's columns left to right
// and tests the pixel (strong_pixels). All in f64, correctly rounded.

__device__ __forceinline__ void add_px(double* s1, double* s2, unsigned int* cnt, float v, double sign) {
    bool ok = isfinite(v);
    double x = ok ? (double)v : 0.0;
    *s1 = __dadd_rn(*s1, __dmul_rn(sign, x));
    *s2 = __dadd_rn(*s2, __dmul_rn(__dmul_rn(sign, x), x));
    *cnt += ok ? (sign > 0.0 ? 1u : 0xffffffffu) : 0u;
}

// sum, sum2, cnt: height x width, the column sums as row r is tested. One thread per column
// must replay its additions in order, so the loop is latency-bound: the rows that enter and
// leave the window are loaded UNROLL at a time ahead of the additions (the sums' order is
// unchanged), so that the loads of a block of rows are in flight together: one memory
// latency per 32 rows.
#define UNROLL 32
extern "C" __global__ void colsum_running(const float* __restrict__ image, int width, int height, int n,
                                          double* __restrict__ sum, double* __restrict__ sum2,
                                          unsigned int* __restrict__ cnt) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    double s1 = 0.0, s2 = 0.0;
    unsigned int k = 0u;
    int first = n < height ? n : height;
    for (int r = 0; r < first; r++) add_px(&s1, &s2, &k, image[(long long)r * width + c], 1.0);
    for (int r0 = 0; r0 < height; r0 += UNROLL) {
        float enter[UNROLL], leave[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int r = r0 + u;
            enter[u] = (r < height && r + n < height) ? image[(long long)(r + n) * width + c] : 0.0f;
            leave[u] = (r < height && r > n) ? image[(long long)(r - n - 1) * width + c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int r = r0 + u;
            if (r >= height) break;
            if (r + n < height) add_px(&s1, &s2, &k, enter[u], 1.0);
            if (r > n) add_px(&s1, &s2, &k, leave[u], -1.0);
            long long at = (long long)r * width + c;
            sum[at] = s1;
            sum2[at] = s2;
            cnt[at] = k;
        }
    }
}

// Whether the pixel px of value v is a strong pixel: at least the threshold, and either
// saturated (+inf) or (I - mean)^2 > snr^2 * variance with I > mean over the box around it
// without itself and without pixels that are not finite.
__device__ __forceinline__ bool is_strong(float v, long long px, int width, int n, float threshold, double snr2,
                                          const double* sum, const double* sum2, const unsigned int* cnt) {
    if (!(v >= threshold)) return false;
    if (isinf(v)) return true;
    int r = (int)(px / width), c = (int)(px % width);
    int lo = c - n > 0 ? c - n : 0;
    int hi = c + n + 1 < width ? c + n + 1 : width;
    long long row = (long long)r * width;
    unsigned int k = 0u;
    double s = 0.0, q = 0.0;
    for (int j = lo; j < hi; j++) {
        k += cnt[row + j];
        s = __dadd_rn(s, sum[row + j]);
        q = __dadd_rn(q, sum2[row + j]);
    }
    k -= 1u;
    if (k == 0u) return false;
    double x = (double)v;
    s = __dsub_rn(s, x);
    q = __dsub_rn(q, __dmul_rn(x, x));
    double kd = (double)k;
    double mean = __ddiv_rn(s, kd);
    double var = __dsub_rn(__ddiv_rn(q, kd), __dmul_rn(mean, mean));
    if (var < 0.0) var = 0.0;
    double d = __dsub_rn(x, mean);
    return d > 0.0 && __dmul_rn(d, d) > __dmul_rn(snr2, var);
}

// strong[px] = 1 when pixel px is a strong pixel (is_strong), else 0.
extern "C" __global__ void strong_pixels(const float* image, int width, int height, int n, float threshold, double snr2,
                                         const double* sum, const double* sum2, const unsigned int* cnt,
                                         unsigned char* strong) {
    long long px = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= (long long)width * height) return;
    strong[px] = is_strong(image[px], px, width, n, threshold, snr2, sum, sum2, cnt) ? 1 : 0;
}

// The strong pixels as a list in image order, in three launches without atomics on the
// list: strong_flags marks each pixel and counts each row's strong pixels, row_offsets turns
// the counts into each row's first place (one block), strong_compact writes each row's
// strong pixels there, in order (one block per row).

// flags[px] = 1 for a strong pixel; row_count[r] += 1 for each (row_count zeroed first).
extern "C" __global__ void strong_flags(const float* __restrict__ image, int width, int height, int n, float threshold,
                                        double snr2, const double* __restrict__ sum, const double* __restrict__ sum2,
                                        const unsigned int* __restrict__ cnt, unsigned char* __restrict__ flags,
                                        unsigned int* row_count) {
    long long px = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= (long long)width * height) return;
    bool s = is_strong(image[px], px, width, n, threshold, snr2, sum, sum2, cnt);
    flags[px] = s ? 1 : 0;
    if (s) atomicAdd(&row_count[px / width], 1u);
}

// row_off[r] = the strong pixels of the rows before r; row_off[rows] = all of them. One
// block of 1024 threads: each sums a run of rows, the block scans the runs' sums.
extern "C" __global__ void row_offsets(const unsigned int* __restrict__ row_count, int rows, unsigned int* __restrict__ row_off) {
    __shared__ unsigned int part[1024];
    int t = threadIdx.x, per = (rows + 1023) / 1024;
    int lo = t * per, hi = lo + per < rows ? lo + per : rows;
    unsigned int own = 0;
    for (int r = lo; r < hi; r++) own += row_count[r];
    part[t] = own;
    __syncthreads();
    for (int d = 1; d < 1024; d <<= 1) {
        unsigned int v = t >= d ? part[t - d] : 0u;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    unsigned int at = part[t] - own;
    for (int r = lo; r < hi; r++) {
        row_off[r] = at;
        at += row_count[r];
    }
    if (t == 1023) row_off[rows] = part[1023];
}

// One block per row: its strong pixels, in order, at the row's place; the first `cap` of
// the image's are written (row_off says how many there are).
extern "C" __global__ void strong_compact(const float* __restrict__ image, const unsigned char* __restrict__ flags,
                                          int width, const unsigned int* __restrict__ row_off,
                                          unsigned int* __restrict__ index, float* __restrict__ value, unsigned int cap) {
    __shared__ unsigned int warp_sum[32];
    int r = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    unsigned int base = row_off[r];
    long long row = (long long)r * width;
    for (int c0 = 0; c0 < width; c0 += blockDim.x) {
        int c = c0 + t;
        bool s = c < width && flags[row + c] != 0;
        unsigned int ballot = __ballot_sync(0xffffffffu, s);
        if (lane == 0) warp_sum[warp] = __popc(ballot);
        __syncthreads();
        unsigned int before = 0, total = 0;
        for (int w = 0; w < warps; w++) {
            before += w < warp ? warp_sum[w] : 0u;
            total += warp_sum[w];
        }
        unsigned int at = base + before + __popc(ballot & ((1u << lane) - 1u));
        if (s && at < cap) {
            index[at] = (unsigned int)(row + c);
            value[at] = image[row + c];
        }
        base += total;
        __syncthreads();
    }
}
