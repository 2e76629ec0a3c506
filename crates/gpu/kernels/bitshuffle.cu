// The bitshuffle transposition on the GPU, so that only compressed data needs to leave it:
// the CPU's shuffle_block (crates/process/src/bitshuffle.rs) being the reference. The image
// is cut into blocks of `block` elements (the last one shorter); each block's first whole
// groups of 8 elements are transposed: output row (byte * 8 + bit) of the block holds that
// bit of that byte of every element, 8 elements per byte, least significant bit first. The
// elements of the last block beyond its last whole group of 8 are copied as they are.
// One thread per (group of 8 elements, byte of the element).

// Transposes an 8x8 bit matrix held in 64 bits (byte i = row i), as the CPU's transpose8.
__device__ __forceinline__ unsigned long long transpose8(unsigned long long x) {
    unsigned long long t;
    t = (x ^ (x >> 7)) & 0x00aa00aa00aa00aaULL;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000cccc0000ccccULL;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000f0f0f0f0ULL;
    return x ^ t ^ (t << 28);
}

extern "C" __global__ void bitshuffle_blocks(const unsigned char* src, unsigned char* dst, int n, int size, int block) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long groups = n / 8;
    if (tid >= groups * size) {
        // the tail beyond the last whole group: copied by the first threads past the groups
        long long t = tid - groups * size;
        long long tail = (long long)(n % 8) * size;
        if (t < tail) dst[groups * 8 * size + t] = src[groups * 8 * size + t];
        return;
    }
    long long g = tid / size;      // group of 8 elements in the image
    int byte = (int)(tid % size);  // byte of the element
    long long first = g * 8;       // its first element
    long long b = first / block;   // its block
    long long b0 = b * block;      // the block's first element
    long long in_block = n - b0 < block ? n - b0 : block;
    long long row = (in_block / 8);            // bytes per output row of this block
    long long k = (first - b0) / 8;            // the group's index in its block
    const unsigned char* p = src + first * size;
    unsigned long long x = 0;
    for (int l = 0; l < 8; l++) x |= (unsigned long long)p[l * size + byte] << (8 * l);
    unsigned long long y = transpose8(x);
    unsigned char* out = dst + b0 * size;
    for (int bit = 0; bit < 8; bit++) out[(byte * 8 + bit) * row + k] = (unsigned char)(y >> (8 * bit));
}
