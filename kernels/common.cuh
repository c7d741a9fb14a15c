// Shared by every kernel file: the host prepends this text to each family's
// source before NVRTC compiles it (NVRTC has no CUDA headers of its own).
//
// Element types: f32 (float), f64 (double), and 16-bit f16/bf16 held as raw
// bits, converted with PTX `cvt` (round to nearest even) so no cuda_fp16.h
// is needed. Arithmetic happens in `acc_t<T>`: f32, or f64 for f64.
// FG_EMU is defined only by the host emulator (tests/cuda_emu), which
// compiles these files as C++ in place of the PTX below.

typedef unsigned long long u64;
typedef long long i64;

struct __align__(2) f16 { unsigned short bits; };
struct __align__(2) bf16 { unsigned short bits; };

template <class T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
template <class T> using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(f16 v) {
#ifdef FG_EMU
    return fg_emu_h2f(v.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
#endif
}
__device__ __forceinline__ float to_acc(bf16 v) {
    return __uint_as_float(((unsigned int)v.bits) << 16);
}

template <class T> __device__ __forceinline__ T from_acc(acc_t<T> v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ f16 from_acc<f16>(float v) {
    f16 h;
#ifdef FG_EMU
    h.bits = fg_emu_f2h(v);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
#endif
    return h;
}
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float v) {
    bf16 h;
#ifdef FG_EMU
    h.bits = fg_emu_f2bf(v);
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
#endif
    return h;
}

// Strided addressing for broadcasting and permuted views: up to MAX_RANK
// dimensions, row-major `shape` of the output, and per operand the stride
// (in elements) of each output dimension, 0 where it broadcasts.
#define MAX_RANK 8
struct Strides {
    int rank;
    i64 shape[MAX_RANK];
    i64 a[MAX_RANK];
    i64 b[MAX_RANK];
};

// Offsets into operands a and b of output element i.
__device__ __forceinline__ void strided_offsets(const Strides &s, i64 i, i64 &oa, i64 &ob) {
    oa = 0;
    ob = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
        i64 n = s.shape[d];
        i64 k = i % n;
        i /= n;
        oa += k * s.a[d];
        ob += k * s.b[d];
    }
}

// Warp-wide sum in a fixed butterfly order: every lane gets the same bits.
template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <class A> __device__ __forceinline__ A warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum (blockDim.x a multiple of 32, at most 1024) in a fixed
// order; `scratch` holds 32 values. Every thread gets the result.
template <class A> __device__ __forceinline__ A block_sum(A v, A *scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : (A)0;
    return warp_sum(v);
}

// Accumulator arithmetic, overloaded for float and double, so a kernel
// templated on its accumulator type names one function. The rounded
// operations are IEEE operations one at a time (no FMA contraction), as the
// CPU does; exp, log and tanh are CUDA's libm.
__device__ __forceinline__ float fg_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double fg_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float fg_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double fg_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float fg_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double fg_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fg_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double fg_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float fg_recip(float a) { return __fdiv_rn(1.0f, a); }
__device__ __forceinline__ double fg_recip(double a) { return __ddiv_rn(1.0, a); }
template <class A> __device__ __forceinline__ A fg_neg_inf();
template <> __device__ __forceinline__ float fg_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double fg_neg_inf<double>() {
    return __longlong_as_double((long long)0xfff0000000000000ull);
}
__device__ __forceinline__ float fg_exp(float a) { return expf(a); }
__device__ __forceinline__ double fg_exp(double a) { return exp(a); }
__device__ __forceinline__ float fg_log(float a) { return logf(a); }
__device__ __forceinline__ double fg_log(double a) { return log(a); }
__device__ __forceinline__ float fg_tanh(float a) { return tanhf(a); }
__device__ __forceinline__ double fg_tanh(double a) { return tanh(a); }
__device__ __forceinline__ float fg_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double fg_abs(double a) { return fabs(a); }
__device__ __forceinline__ float fg_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double fg_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float fg_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double fg_sqrt(double a) { return __dsqrt_rn(a); }

// Exports a kernel for every element type: a file defines
// `#define K(T, S) extern "C" __global__ void name_##S(const T *x, ...) {...}`
// and writes `FG_ALL_TYPES(K)`, giving name_f32, name_f64, name_f16,
// name_bf16 (the suffixes the host looks kernels up by).
#define FG_ALL_TYPES(M) M(float, f32) M(double, f64) M(f16, f16) M(bf16, bf16)
