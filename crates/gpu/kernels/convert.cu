// JUNGFRAU conversion on the GPU, the CPU stage (crates/process/src/convert.rs) being the
// reference: the same per-pixel decisions and the same f32 operations in the same order,
// each written as a correctly rounded intrinsic (__fsub_rn, __fdiv_rn) so that neither
// contraction into fused multiply-adds nor an approximate division can change a result.
// Compiled by NVRTC with --fmad=false --prec-div=true --ftz=false (crates/gpu/src/convert.rs).

#define ADC_MAX 0x3fff
#define WORD_ERROR 0xffff
#define WORD_SATURATED 0xc000
#define WORD_G1_ZERO 0x4000

// Invalid gain code 10: 0 error, 1 as G0, 2 as G2 (rdaq_process::InvalidGain).
// Returns the gain stage 0..2, or -1 for an error pixel, -2 for a saturated one.
__device__ __forceinline__ int kind(unsigned short w, unsigned int masked, int invalid) {
    if (masked != 0u || w == WORD_ERROR || w == WORD_G1_ZERO) return -1;
    if (w == WORD_SATURATED) return -2;
    switch (w >> 14) {
        case 0: return 0;
        case 1: return 1;
        case 3: return 2;
        default: return invalid == 1 ? 0 : (invalid == 2 ? 2 : -1);
    }
}

// keV per pixel: (adc - pedestal[g]) / gain[g]; +inf saturated, NaN error or masked.
// pedestal and gain hold the three gain stages one after the other (3 x n).
extern "C" __global__ void jf_convert_kev(const unsigned short* raw, const float* pedestal, const float* gain,
                                          const unsigned int* mask, int invalid, float* out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    unsigned short w = raw[px];
    int g = kind(w, mask[px], invalid);
    if (g == -1) { out[px] = __int_as_float(0x7fc00000); return; }
    if (g == -2) { out[px] = __int_as_float(0x7f800000); return; }
    float adc = (float)(w & ADC_MAX);
    out[px] = __fdiv_rn(__fsub_rn(adc, pedestal[g * n + px]), gain[g * n + px]);
}

// Rounds half away from zero as the CPU does: truncate, then step away from zero when the
// (exact) remainder is at least one half.
__device__ __forceinline__ int round_half_away(float x) {
    int t = __float2int_rz(x);
    float frac = __fsub_rn(x, (float)t);
    return t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
}

// Photon counts from keV, int32: NaN -> INT_MIN (error), +inf -> INT_MAX (saturated), else
// kev / photon_kev clamped to +-(2^31 - 128) and rounded.
extern "C" __global__ void kev_to_photons_i32(const float* kev, float photon_kev, int* out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    float e = kev[px];
    if (isnan(e)) { out[px] = (int)0x80000000; return; }
    if (isinf(e) && e > 0.0f) { out[px] = 0x7fffffff; return; }
    float x = isfinite(e) ? __fdiv_rn(e, photon_kev) : 0.0f;
    x = fminf(fmaxf(x, -2147483520.0f), 2147483520.0f);
    out[px] = round_half_away(x);
}

// The same for int16: NaN -> -32768, +inf -> 32767, else clamped to [-32767, 32766].
extern "C" __global__ void kev_to_photons_i16(const float* kev, float photon_kev, short* out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    float e = kev[px];
    if (isnan(e)) { out[px] = (short)-32768; return; }
    if (isinf(e) && e > 0.0f) { out[px] = (short)32767; return; }
    float x = isfinite(e) ? __fdiv_rn(e, photon_kev) : 0.0f;
    x = fminf(fmaxf(x, -32767.0f), 32766.0f);
    out[px] = (short)round_half_away(x);
}

// The assembled image of raw words from a frame's module words as they lie in its receiver
// slot (module after module): src_of[px] is the word behind image pixel px, or -1 for a gap
// pixel, which gets the error word.
extern "C" __global__ void assemble_words(const unsigned short* __restrict__ words, const int* __restrict__ src_of,
                                          unsigned short* __restrict__ out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    int s = src_of[px];
    out[px] = s < 0 ? (unsigned short)WORD_ERROR : words[s];
}

// jf_convert_kev of the assembled image, read straight from the module words (assembly and
// conversion in one pass). The G0 pedestal, which the tracked pedestal replaces, is its own
// array (n); G1 and G2's follow each other in ped12 (2 x n); gain holds all three (3 x n).
extern "C" __global__ void jf_assemble_kev(const unsigned short* __restrict__ words, const int* __restrict__ src_of,
                                           const float* __restrict__ ped0, const float* __restrict__ ped12,
                                           const float* __restrict__ gain, const unsigned int* __restrict__ mask,
                                           int invalid, float* __restrict__ out, int n) {
    int px = blockIdx.x * blockDim.x + threadIdx.x;
    if (px >= n) return;
    int s = src_of[px];
    unsigned short w = s < 0 ? (unsigned short)WORD_ERROR : words[s];
    int g = kind(w, mask[px], invalid);
    if (g == -1) { out[px] = __int_as_float(0x7fc00000); return; }
    if (g == -2) { out[px] = __int_as_float(0x7f800000); return; }
    float adc = (float)(w & ADC_MAX);
    float p = g == 0 ? ped0[px] : ped12[(g - 1) * n + px];
    out[px] = __fdiv_rn(__fsub_rn(adc, p), gain[g * n + px]);
}
