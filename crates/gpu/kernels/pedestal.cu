// Pedestal tracking on dark frames, the CPU tracker (crates/process/src/pedestal.rs,
// Pedestal<f64>) being the reference: per pixel of the tracked gain stage a running window
// of sums of the ADC value and its square, in f64, each operation correctly rounded as on
// the CPU (__dadd_rn, __dsub_rn, __dmul_rn, __ddiv_rn).

#define ADC_MAX 0x3fff

// Adds one dark frame: words of another gain stage are counted in `wrong`; until `window`
// samples, the sums grow; then each new sample replaces the window's mean.
extern "C" __global__ void pedestal_push(const unsigned short* raw, double* sum, double* sum2, unsigned int* samples,
                                         unsigned int* wrong, unsigned int code, unsigned int window, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    unsigned short w = raw[px];
    if ((unsigned int)(w >> 14) != code) { wrong[px] += 1u; return; }
    double x = (double)(w & ADC_MAX);
    double xx = __dmul_rn(x, x);
    if (samples[px] < window) {
        sum[px] = __dadd_rn(sum[px], x);
        sum2[px] = __dadd_rn(sum2[px], xx);
        samples[px] += 1u;
    } else {
        double wn = (double)window;
        sum[px] = __dadd_rn(sum[px], __dsub_rn(x, __ddiv_rn(sum[px], wn)));
        sum2[px] = __dadd_rn(sum2[px], __dsub_rn(xx, __ddiv_rn(sum2[px], wn)));
    }
}

// The pedestal per pixel: sum / samples, 0 where no sample came; rounded to f32 to nearest.
extern "C" __global__ void pedestal_mean(const double* sum, const unsigned int* samples, float* out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    unsigned int k = samples[px];
    out[px] = k == 0u ? 0.0f : __double2float_rn(__ddiv_rn(sum[px], (double)k));
}
