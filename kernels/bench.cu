// Bench scaffolding for `fusegrad bench --device cuda` (launchers in
// src/bench/cuda.rs): standard normal inputs drawn on the device, so a
// shape of 10^8 elements costs no host work and no upload, and a spin that
// keeps the GPU busy while the host queues the op being timed. No op uses
// these kernels; no CPU twin.
//
// ---------------------------------------------------------------------------
// fill_normal_NAME(T* out, i64 n, u64 seed, u64 offset)
//   out[i] = from_acc<T>(z(seed, offset + i)) for 0 <= i < n, where z is a
//   standard normal that depends on (seed, index) alone:
//     h  = mix64(mix64(seed) + index * 0x9E3779B97F4A7C15)   (splitmix64)
//     u1 = ((h >> 40) + 1) * 2^-24      in (0, 1]
//     u2 = (h & 0xFFFFFF) * 2^-24      in [0, 1)
//     z  = sqrt(-2 log u1) * cos(2 pi u2)                       (Box-Muller)
//   computed in f32 for every T (|z| <= 5.77), then narrowed once. Equal
//   (seed, index) give equal bits on one device whatever the launch
//   geometry or n; `offset` lets consecutive buffers continue one stream.
//   out  : n elements, contiguous; every element is written.
//   n    : element count.
//   Geometry (grid-stride): block = 256 threads, grid = min(ceil(n / 256),
//   cap) blocks (any grid >= 1 is correct), dynamic smem = 0. Skip the
//   launch when n == 0.
//
// bench_spin(i64 cycles)
//   Returns once clock64() has advanced by at least `cycles` since the
//   thread started; writes nothing.
//   Geometry: grid = 1 block of 1 thread, dynamic smem = 0.
// ---------------------------------------------------------------------------

#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)

// splitmix64's output function: a bijection on 64 bits whose every output
// bit depends on every input bit.
__device__ __forceinline__ u64 fg_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One standard normal from the 64-bit hash `h`; each product and sum is
// rounded on its own so the emulation's host build gives the same steps.
__device__ __forceinline__ float fg_normal_of(u64 h) {
    const float ulp24 = 5.9604644775390625e-8f;  // 2^-24: 24-bit fractions are exact in f32
    float u1 = __fmul_rn((float)((h >> 40) + 1), ulp24);
    float u2 = __fmul_rn((float)(h & 0xFFFFFFull), ulp24);
    float r = __fsqrt_rn(__fmul_rn(-2.0f, logf(u1)));
    return __fmul_rn(r, cosf(__fmul_rn(6.28318530717958647692f, u2)));
}

#define FG_FILL_NORMAL(T, S)                                                      \
    extern "C" __global__ void fill_normal_##S(T *out, i64 n, u64 seed,           \
                                               u64 offset) {                      \
        const u64 key = fg_mix64(seed);                                           \
        FG_GRID_STRIDE(i, n) {                                                    \
            u64 h = fg_mix64(key + (offset + (u64)i) * 0x9E3779B97F4A7C15ull);    \
            out[i] = from_acc<T>((acc_t<T>)fg_normal_of(h));                      \
        }                                                                         \
    }
FG_ALL_TYPES(FG_FILL_NORMAL)

extern "C" __global__ void bench_spin(i64 cycles) {
    const i64 start = clock64();
    while (clock64() - start < cycles) {
    }
}
