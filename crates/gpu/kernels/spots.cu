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

// sum, sum2, cnt: height x width, the column sums as row r is tested.
extern "C" __global__ void colsum_running(const float* image, int width, int height, int n, double* sum, double* sum2,
                                          unsigned int* cnt) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    double s1 = 0.0, s2 = 0.0;
    unsigned int k = 0u;
    int first = n < height ? n : height;
    for (int r = 0; r < first; r++) add_px(&s1, &s2, &k, image[(long long)r * width + c], 1.0);
    for (int r = 0; r < height; r++) {
        if (r + n < height) add_px(&s1, &s2, &k, image[(long long)(r + n) * width + c], 1.0);
        if (r > n) add_px(&s1, &s2, &k, image[(long long)(r - n - 1) * width + c], -1.0);
        long long at = (long long)r * width + c;
        sum[at] = s1;
        sum2[at] = s2;
        cnt[at] = k;
    }
}

// strong[px] = 1 when pixel px is a strong pixel: at least the threshold, and either
// saturated (+inf) or (I - mean)^2 > snr^2 * variance with I > mean over the box around it
// without itself and without pixels that are not finite.
extern "C" __global__ void strong_pixels(const float* image, int width, int height, int n, float threshold, double snr2,
                                         const double* sum, const double* sum2, const unsigned int* cnt,
                                         unsigned char* strong) {
    long long px = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= (long long)width * height) return;
    float v = image[px];
    strong[px] = 0;
    if (!(v >= threshold)) return;
    if (isinf(v)) { strong[px] = 1; return; }
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
    if (k == 0u) return;
    double x = (double)v;
    s = __dsub_rn(s, x);
    q = __dsub_rn(q, __dmul_rn(x, x));
    double kd = (double)k;
    double mean = __ddiv_rn(s, kd);
    double var = __dsub_rn(__ddiv_rn(q, kd), __dmul_rn(mean, mean));
    if (var < 0.0) var = 0.0;
    double d = __dsub_rn(x, mean);
    if (d > 0.0 && __dmul_rn(d, d) > __dmul_rn(snr2, var)) strong[px] = 1;
}
