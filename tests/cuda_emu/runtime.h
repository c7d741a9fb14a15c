// The CUDA C subset kernels/*.cu use, for compiling them as host C++ into
// the emulated driver (tests/cuda_emu/driver.cpp). One launch runs at a
// time; a block's threads are fibers switched only at barriers and warp
// operations, so shared memory is a function-static and every interleaving
// is deterministic. What the kernels may not rely on is checked: a warp
// operation reached with a lane missing or a barrier nobody completes stops
// the launch with an error instead of hanging.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#define FG_EMU 1
#define __device__
#define __host__
#ifndef FG_SCAN
#define FG_KERNEL
#endif
#define __global__ FG_KERNEL
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
// Set by the scheduler before a fiber runs (threadIdx) or a launch starts.
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

// Scheduler entry points (driver.cpp).
void fg_emu_bar(int id, int count);  // bar.sync id, count (count 0: all live threads)
void fg_emu_warp();                  // every lane of this warp arrives
void fg_emu_fail(const char *what);  // records an error; the launch fails

// One 64-bit slot per thread for warp exchanges.
inline unsigned long long fg_emu_slot[1024];

inline void __syncthreads() { fg_emu_bar(0, 0); }

// The cycle counter: each read moves it 2^32 cycles on, so a kernel that
// waits for a count of cycles (bench_spin) ends at once on the CPU; the
// step keeps it from wrapping within any run (launches run one at a time).
inline long long clock64() {
    static long long now = 0;
    return now += 1ll << 32;
}

template <class V> inline V __shfl_xor_sync(unsigned mask, V v, int o, int width = 32) {
    static_assert(sizeof(V) <= 8, "shuffle of more than 8 bytes");
    if (mask != 0xffffffffu) fg_emu_fail("__shfl_xor_sync with a partial mask");
    unsigned t = threadIdx.x, lane = t & 31, base = t & ~31u;
    std::memcpy(&fg_emu_slot[t], &v, sizeof v);
    fg_emu_warp();
    unsigned src = lane ^ (unsigned)o;
    if ((src & ~(unsigned)(width - 1)) != (lane & ~(unsigned)(width - 1))) src = lane;
    V r;
    std::memcpy(&r, &fg_emu_slot[base + src], sizeof r);
    fg_emu_warp();
    return r;
}

// Lane src_lane's v (within groups of width lanes), to every lane.
template <class V> inline V __shfl_sync(unsigned mask, V v, int src_lane, int width = 32) {
    static_assert(sizeof(V) <= 8, "shuffle of more than 8 bytes");
    if (mask != 0xffffffffu) fg_emu_fail("__shfl_sync with a partial mask");
    unsigned t = threadIdx.x, lane = t & 31, base = t & ~31u;
    std::memcpy(&fg_emu_slot[t], &v, sizeof v);
    fg_emu_warp();
    unsigned src = (lane & ~(unsigned)(width - 1)) + ((unsigned)src_lane & (unsigned)(width - 1));
    V r;
    std::memcpy(&r, &fg_emu_slot[base + src], sizeof r);
    fg_emu_warp();
    return r;
}

inline unsigned __ballot_sync(unsigned mask, int p) {
    if (mask != 0xffffffffu) fg_emu_fail("__ballot_sync with a partial mask");
    unsigned t = threadIdx.x, base = t & ~31u;
    fg_emu_slot[t] = p != 0;
    fg_emu_warp();
    unsigned bits = 0;
    for (unsigned l = 0; l < 32 && base + l < blockDim.x; ++l)
        if (fg_emu_slot[base + l]) bits |= 1u << l;
    fg_emu_warp();
    return bits;
}
inline bool __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T *p) { return *p; }

template <class To, class From> inline To fg_emu_bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "bit cast of different sizes");
    To t;
    std::memcpy(&t, &f, sizeof t);
    return t;
}
inline float __uint_as_float(unsigned u) { return fg_emu_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return fg_emu_bits<unsigned>(f); }
inline float __int_as_float(int u) { return fg_emu_bits<float>(u); }
inline int __float_as_int(float f) { return fg_emu_bits<int>(f); }
inline double __longlong_as_double(long long u) { return fg_emu_bits<double>(u); }
inline long long __double_as_longlong(double f) { return fg_emu_bits<long long>(f); }
inline double __hiloint2double(int hi, int lo) {
    return fg_emu_bits<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}
inline int __double2loint(double d) { return (int)(unsigned)fg_emu_bits<unsigned long long>(d); }
inline int __double2hiint(double d) {
    return (int)(unsigned)(fg_emu_bits<unsigned long long>(d) >> 32);
}

// The host compiles with -ffp-contract=off: each of these is one IEEE op.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float __double2float_rn(double v) { return (float)v; }
inline float __double2float_rz(double v) {
    float f = (float)v;
    if (std::isfinite(f) && std::fabs((double)f) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    if (std::isinf(f) && std::isfinite(v)) f = std::copysign(3.40282347e38f, f);
    return f;
}

using std::ceil;
using std::copysign;
using std::erfc;
using std::exp;
using std::fabs;
using std::fmax;
using std::log;
using std::sqrt;
using std::tanh;
inline float fabsf(float a) { return std::fabs(a); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float expf(float a) { return std::exp(a); }
inline float logf(float a) { return std::log(a); }
inline float tanhf(float a) { return std::tanh(a); }
inline float cosf(float a) { return std::cos(a); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// 16-bit conversions, round to nearest even (PTX cvt.rn).
inline float fg_emu_h2f(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 0x400), (int)e - 25);
    return s ? -v : v;
}
inline unsigned short fg_emu_f2h(float f) {
    unsigned s = (fg_emu_bits<unsigned>(f) >> 16) & 0x8000;
    float a = std::fabs(f);
    if (a != a) return (unsigned short)(s | 0x7fff);
    if (a >= 65520.0f) return (unsigned short)(s | 0x7c00);
    if (a < 6.103515625e-05f)  // subnormal: units of 2^-24, nearbyint is RNE
        return (unsigned short)(s | (unsigned)std::nearbyint(a * 16777216.0f));
    int e;
    std::frexp(a, &e);
    float r = std::ldexp(std::nearbyint(std::ldexp(a, 11 - e)), e - 11);
    unsigned rb = fg_emu_bits<unsigned>(r);
    int ex = (int)((rb >> 23) & 0xff) - 127 + 15;
    if (ex >= 31) return (unsigned short)(s | 0x7c00);
    return (unsigned short)(s | (ex << 10) | ((rb >> 13) & 0x3ff));
}
inline unsigned short fg_emu_f2bf(float f) {
    unsigned x = fg_emu_bits<unsigned>(f);
    if (f != f) return 0x7fff;  // PTX's canonical NaN
    x += 0x7fff + ((x >> 16) & 1);
    return (unsigned short)(x >> 16);
}

// Kernel registration: the build script appends one FG_EMU_ENTRY per
// kernel, which records a trampoline that unpacks cuLaunchKernel's
// argument pointers into the kernel's own parameter types.
#include <type_traits>
#include <utility>
using fg_emu_invoker = void (*)(void *fn, void **params);
int fg_emu_register(const char *name, void *fn, fg_emu_invoker invoke);
template <class... A, std::size_t... I>
inline void fg_emu_call(void (*f)(A...), void **p, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>> *>(p[I])...);
}
template <class... A> inline int fg_emu_entry(const char *name, void (*f)(A...)) {
    return fg_emu_register(name, reinterpret_cast<void *>(f), [](void *fn, void **p) {
        fg_emu_call(reinterpret_cast<void (*)(A...)>(fn), p, std::index_sequence_for<A...>{});
    });
}
#define FG_EMU_ENTRY(n) fg_emu_entry(#n, &n)
