// CPU stand-in for libcublas, for running the CUDA tests without a GPU.
//
// Companion of the emulated libcuda: "device" pointers are plain host
// addresses, so every matrix, alpha and beta is read and written directly.
// Work runs synchronously on the calling thread at call time; the stream set
// on a handle is only remembered (cublasGetStream_v2 returns it).
//
// Exported: exactly what cudarc 0.19 reaches through CudaBlas::new, its Drop,
// set/get_pointer_mode and the Gemm trait (f32, f64, f16, bf16; gemm and
// gemm_strided_batched), plus a few harmless handle setters.
//
// Numerics (identical for every entry point):
//   - matrices are column-major; op(X) is X for CUBLAS_OP_N and X^T for
//     CUBLAS_OP_T / CUBLAS_OP_C (the same thing for real types);
//   - f16/bf16 elements are widened exactly to float;
//   - dot = sum over l = 0..k-1 of op(A)(i,l) * op(B)(l,j), accumulated in the
//     compute type (float, or double for 64F) in increasing l;
//   - C(i,j) = alpha * dot                 when beta == 0 (C is never read),
//     C(i,j) = alpha * dot + beta * C(i,j) otherwise;
//     when alpha == 0, A and B are not read and dot counts as 0;
//   - the result is rounded once to C's type, round-to-nearest-even.
// Build: g++ -std=c++17 -O2 -fPIC -shared -ffp-contract=off
//            -o libcublas.so tests/cuda_emu/cublas.cpp

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>

namespace {

// Enum values as in cuBLAS / library_types.h (checked against cudarc's sys).
enum Status : int { SUCCESS = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };
enum Op : int { OP_N = 0, OP_T = 1, OP_C = 2 };
enum DataType : int { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };
enum Compute : int {
  C_16F = 64, C_16F_PEDANTIC = 65, C_32F = 68, C_32F_PEDANTIC = 69,
  C_64F = 70, C_64F_PEDANTIC = 71, C_32F_FAST_16F = 74, C_32F_FAST_16BF = 75,
  C_32F_FAST_TF32 = 77,
};

struct Handle {
  void *stream = nullptr;  // cudaStream_t, remembered only
  int pointer_mode = 0;    // HOST; DEVICE reads the same since memory is shared
  int math_mode = 0;       // CUBLAS_DEFAULT_MATH
};

// Storage-only 16-bit types; arithmetic always happens after widening.
struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };

uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Exact widening of IEEE binary16.
float widen(F16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ffu;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return u2f(sign | ((exp + 112) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in float
  float mag = float(man) * u2f(0x33800000u);  // 0x33800000 == 2^-24
  return u2f(sign | f2u(mag));
}
float widen(BF16 b) { return u2f(uint32_t(b.bits) << 16); }
float widen(float f) { return f; }
double widen(double d) { return d; }

// float -> binary16, round to nearest, ties to even.
F16 narrow_f16(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u)  // NaN: keep the top payload bits, force quiet
    return F16{uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  if (abs >= 0x477ff000u)  // >= 65520, the midpoint above 65504: rounds to inf
    return F16{uint16_t(sign | 0x7c00u)};
  if (abs >= 0x38800000u) {  // normal half range, >= 2^-14
    uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
    uint32_t h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // carry may bump exponent: fine
    return F16{uint16_t(sign | h)};
  }
  uint32_t e = abs >> 23;
  if (e < 102) return F16{sign};  // below 2^-25 (the half-ulp of 2^-24): rounds to 0
  // subnormal half: count of 2^-24 units is mant * 2^(e-126), shift in [14, 24]
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;  // q may reach 0x400: smallest normal
  return F16{uint16_t(sign | q)};
}

// float -> bfloat16, round to nearest, ties to even (same exponent range as
// float, so subnormals and overflow to inf fall out of the integer rounding).
BF16 narrow_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{uint16_t((u >> 16) | 0x0040u)};
  return BF16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

void put(float *p, float v) { *p = v; }
void put(double *p, double v) { *p = v; }
void put(F16 *p, float v) { *p = narrow_f16(v); }
void put(BF16 *p, float v) { *p = narrow_bf16(v); }

struct Shape {
  int ta, tb, m, n, k, lda, ldb, ldc;
  long long sa, sb, sc;
  int batch;
};

// Argument checks in the spirit of cuBLAS: negative sizes, unknown ops and
// leading dimensions smaller than the stored rows are INVALID_VALUE.
// The emulated driver's queued host copies run before a product reads
// device memory (it exports fg_emu_flush; found through the loaded copy).
void flush_copies() {
  static int (*f)() = [] {
    void *l = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    return l ? (int (*)())dlsym(l, "fg_emu_flush") : nullptr;
  }();
  if (f) f();
}

int check(const char *fn, void *h, const Shape &s) {
  if (!h) { std::fprintf(stderr, "cublas-emu: %s: null handle\n", fn); return NOT_INITIALIZED; }
  auto op_ok = [](int t) { return t == OP_N || t == OP_T || t == OP_C; };
  int rows_a = s.ta == OP_N ? s.m : s.k, rows_b = s.tb == OP_N ? s.k : s.n;
  auto at_least = [](int ld, int rows) { return ld >= (rows > 1 ? rows : 1); };
  if (!op_ok(s.ta) || !op_ok(s.tb) || s.m < 0 || s.n < 0 || s.k < 0 || s.batch < 0 ||
      !at_least(s.lda, rows_a) || !at_least(s.ldb, rows_b) || !at_least(s.ldc, s.m)) {
    std::fprintf(stderr,
                 "cublas-emu: %s: invalid arguments (transa=%d transb=%d m=%d n=%d k=%d "
                 "lda=%d ldb=%d ldc=%d batch=%d)\n",
                 fn, s.ta, s.tb, s.m, s.n, s.k, s.lda, s.ldb, s.ldc, s.batch);
    return INVALID_VALUE;
  }
  return SUCCESS;
}

// One strided batch of GEMMs with accumulator type Acc. Indices are 64-bit.
template <class Acc, class TA, class TB, class TC>
int gemm(const char *fn, void *h, const Shape &s, const void *alpha_p, const void *A_,
         const void *B_, const void *beta_p, void *C_) {
  if (int st = check(fn, h, s)) return st;
  flush_copies();
  const Acc alpha = *static_cast<const Acc *>(alpha_p), beta = *static_cast<const Acc *>(beta_p);
  using I = long long;
  for (I b = 0; b < s.batch; ++b) {
    const TA *A = static_cast<const TA *>(A_) + b * s.sa;
    const TB *B = static_cast<const TB *>(B_) + b * s.sb;
    TC *C = static_cast<TC *>(C_) + b * s.sc;
    // op(A)(i,l) and op(B)(l,j) as strides over (i,l) and (l,j)
    const I a_i = s.ta == OP_N ? 1 : s.lda, a_l = s.ta == OP_N ? s.lda : 1;
    const I b_l = s.tb == OP_N ? 1 : s.ldb, b_j = s.tb == OP_N ? s.ldb : 1;
    for (I j = 0; j < s.n; ++j) {
      for (I i = 0; i < s.m; ++i) {
        Acc dot = 0;
        if (alpha != Acc(0))
          for (I l = 0; l < s.k; ++l)
            dot += Acc(widen(A[i * a_i + l * a_l])) * Acc(widen(B[l * b_l + j * b_j]));
        TC *c = &C[i + j * I(s.ldc)];
        Acc v = alpha * dot;
        if (beta != Acc(0)) v += beta * Acc(widen(*c));
        put(c, v);
      }
    }
  }
  return SUCCESS;
}

// Dispatch for the Ex entry points. Supported: compute 32F (any variant) with
// A=B in {16F, 16BF, 32F} and C = A's type or 32F; compute 64F with all 64F.
// alpha/beta have the compute type (float or double).
int gemm_ex(const char *fn, void *h, const Shape &s, const void *alpha, const void *A,
            int at, const void *B, int bt, const void *beta, void *C, int ct, int compute) {
  flush_copies();
  bool c32 = compute == C_32F || compute == C_32F_PEDANTIC || compute == C_32F_FAST_16F ||
             compute == C_32F_FAST_16BF || compute == C_32F_FAST_TF32;
  bool c64 = compute == C_64F || compute == C_64F_PEDANTIC;
  if (c64 && at == R_64F && bt == R_64F && ct == R_64F)
    return gemm<double, double, double, double>(fn, h, s, alpha, A, B, beta, C);
  if (c32 && at == bt) {
    if (at == R_32F && ct == R_32F)
      return gemm<float, float, float, float>(fn, h, s, alpha, A, B, beta, C);
    if (at == R_16F && ct == R_16F)
      return gemm<float, F16, F16, F16>(fn, h, s, alpha, A, B, beta, C);
    if (at == R_16F && ct == R_32F)
      return gemm<float, F16, F16, float>(fn, h, s, alpha, A, B, beta, C);
    if (at == R_16BF && ct == R_16BF)
      return gemm<float, BF16, BF16, BF16>(fn, h, s, alpha, A, B, beta, C);
    if (at == R_16BF && ct == R_32F)
      return gemm<float, BF16, BF16, float>(fn, h, s, alpha, A, B, beta, C);
  }
  std::fprintf(stderr, "cublas-emu: %s: unsupported types Atype=%d Btype=%d Ctype=%d computeType=%d\n",
               fn, at, bt, ct, compute);
  return NOT_SUPPORTED;
}

}  // namespace

extern "C" {

int cublasCreate_v2(void **handle) {
  if (!handle) return INVALID_VALUE;
  *handle = new Handle();
  return SUCCESS;
}
int cublasDestroy_v2(void *h) {
  if (!h) return NOT_INITIALIZED;
  delete static_cast<Handle *>(h);
  return SUCCESS;
}
int cublasSetStream_v2(void *h, void *stream) {
  if (!h) return NOT_INITIALIZED;
  static_cast<Handle *>(h)->stream = stream;
  return SUCCESS;
}
int cublasGetStream_v2(void *h, void **stream) {
  if (!h) return NOT_INITIALIZED;
  if (!stream) return INVALID_VALUE;
  *stream = static_cast<Handle *>(h)->stream;
  return SUCCESS;
}
int cublasSetPointerMode_v2(void *h, int mode) {
  if (!h) return NOT_INITIALIZED;
  if (mode != 0 && mode != 1) return INVALID_VALUE;
  static_cast<Handle *>(h)->pointer_mode = mode;
  return SUCCESS;
}
int cublasGetPointerMode_v2(void *h, int *mode) {
  if (!h) return NOT_INITIALIZED;
  if (!mode) return INVALID_VALUE;
  *mode = static_cast<Handle *>(h)->pointer_mode;
  return SUCCESS;
}
int cublasSetMathMode(void *h, int mode) {
  if (!h) return NOT_INITIALIZED;
  static_cast<Handle *>(h)->math_mode = mode;
  return SUCCESS;
}
int cublasGetMathMode(void *h, int *mode) {
  if (!h) return NOT_INITIALIZED;
  if (!mode) return INVALID_VALUE;
  *mode = static_cast<Handle *>(h)->math_mode;
  return SUCCESS;
}
// No scratch memory is ever needed; the buffer is accepted and ignored.
int cublasSetWorkspace_v2(void *h, void *, size_t) { return h ? SUCCESS : NOT_INITIALIZED; }
// Library properties without a handle: MAJOR_VERSION 0, MINOR_VERSION 1,
// PATCH_LEVEL 2, as cuBLAS 13.0.0.
int cublasGetProperty(int type, int *value) {
  if (!value || type < 0 || type > 2) return INVALID_VALUE;
  *value = type == 0 ? 13 : 0;
  return SUCCESS;
}
int cublasGetVersion_v2(void *, int *version) {
  if (!version) return INVALID_VALUE;
  *version = 130000;  // pretends to be cuBLAS 13.0, matching cudarc's cuda-13000 bindings
  return SUCCESS;
}

int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                   const float *A, int lda, const float *B, int ldb, const float *beta,
                   float *C, int ldc) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, 1};
  return gemm<float, float, float, float>("cublasSgemm_v2", h, s, alpha, A, B, beta, C);
}
int cublasDgemm_v2(void *h, int ta, int tb, int m, int n, int k, const double *alpha,
                   const double *A, int lda, const double *B, int ldb, const double *beta,
                   double *C, int ldc) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, 1};
  return gemm<double, double, double, double>("cublasDgemm_v2", h, s, alpha, A, B, beta, C);
}
int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, long long sa, const float *B, int ldb,
                              long long sb, const float *beta, float *C, int ldc, long long sc,
                              int batch) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch};
  return gemm<float, float, float, float>("cublasSgemmStridedBatched", h, s, alpha, A, B, beta, C);
}
int cublasDgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const double *alpha,
                              const double *A, int lda, long long sa, const double *B, int ldb,
                              long long sb, const double *beta, double *C, int ldc, long long sc,
                              int batch) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch};
  return gemm<double, double, double, double>("cublasDgemmStridedBatched", h, s, alpha, A, B, beta, C);
}
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
                 int at, int lda, const void *B, int bt, int ldb, const void *beta, void *C, int ct,
                 int ldc, int compute, int /*algo: ignored*/) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, 1};
  return gemm_ex("cublasGemmEx", h, s, alpha, A, at, B, bt, beta, C, ct, compute);
}
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                               const void *A, int at, int lda, long long sa, const void *B, int bt,
                               int ldb, long long sb, const void *beta, void *C, int ct, int ldc,
                               long long sc, int batch, int compute, int /*algo: ignored*/) {
  Shape s{ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch};
  return gemm_ex("cublasGemmStridedBatchedEx", h, s, alpha, A, at, B, bt, beta, C, ct, compute);
}

}  // extern "C"
