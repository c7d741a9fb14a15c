// Elementwise kernels: the CUDA twin of ops/elementwise/cpu.rs.
//
// Every kernel below is exported per element type as NAME_f32, NAME_f64,
// NAME_f16, NAME_bf16 (T = float, double, f16, bf16; A = acc_t<T>: float,
// or double for f64). All loops are grid-stride over i64 indices, so any
// grid works; the rule given is the recommended one. Nothing here reduces,
// so results never depend on the geometry.
//
// Kind codes (enum declaration order in ops/elementwise/mod.rs):
//
//   Unary (int kind, double c, int ni)      Binary (int kind, int ni)
//    0 Copy          x  (raw copy)            0 Add           a + b
//    1 Fill(c)       c  (x not read)          1 Sub           a - b
//    2 Neg           -x                       2 Mul           a b
//    3 AddScalar(c)  x + c                    3 Div           a / b
//    4 MulScalar(c)  x c   (CPU: v * c)       4 NegMul        -(a b)
//    5 DivScalar(c)  x / c                    5 PowiGrad(ni)  g ni x^(ni-1); 0 for ni = 0
//    6 Powi(ni)      x^ni                     6 SqrtGrad      g / (2 y)
//    7 Sqrt                                   7 RsqrtGrad     -g y^3 / 2
//    8 Rsqrt         1 / sqrt x               8 TanhGrad      g (1 - y^2)
//    9 Exp                                    9 SigmoidGrad   g y (1 - y)
//   10 Log                                   10 GeluTanhGrad  g gelu_tanh'(x)
//   11 Tanh                                  11 GeluErfGrad   g (Phi(x) + x phi(x))
//   12 Sigmoid
//   13 GeluTanh
//   14 GeluErf
//
// `c` is rounded to A inside (as the CPU's `Accum::of`); `ni` is the i32 of
// Powi/PowiGrad (ignored by the other kinds). An unknown kind code writes
// nothing. For binary kinds the first operand is `a` (`g` for the chain-rule
// kinds) and the second `b` (`x` or `y`, what the op saved).
//
// Semantics match the CPU: each +, -, *, /, sqrt is one IEEE operation in A
// (the __*_rn intrinsics stop NVRTC from contracting into FMA), so every kind
// built only from those (all but Exp, Log, Tanh, Sigmoid, the GELUs and
// their grads) gives the CPU's bits; exp/log/tanh are CUDA's, within ulps
// of Rust's libm. GeluErf/GeluErfGrad run in f64 for every T (as the CPU),
// with src/special.rs's erf/erfc/Phi/phi ported operation for operation.
//
// ---------------------------------------------------------------------------
// unary(const T* x, T* y, i64 n, int kind, double c, int ni)
//   y[i] = kind(x[i]) for i < n, both contiguous. (y may equal x.)
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// unary_strided(const T* x, T* y, Strides s, i64 n, int kind, double c, int ni)
//   `unary_to`: x broadcast to the output shape. s.rank/s.shape = output
//   shape (rank <= 8; rank 0 = one element), s.a[d] = x's stride in
//   elements along output dim d (0 where x broadcasts), s.b unused (any
//   value). n = product of s.shape. y contiguous, y[i] = kind(x[off_a(i)]).
//   The host may drop size-1 dims and merge dims first (fewer divisions).
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// binary(const T* a, const T* b, T* y, Strides s, i64 n, int kind, int ni)
//   NumPy broadcasting: s.shape = output shape, s.a / s.b = a's and b's
//   strides per output dim (0 where broadcast), n = numel; y contiguous,
//   y[i] = kind(a[off_a(i)], b[off_b(i)]).
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// binary_flat(const T* a, const T* b, T* y, i64 n, int kind, int ni)
//   Fast path when a and b both have the output's shape (all contiguous):
//   y[i] = kind(a[i], b[i]). y may alias a or b.
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// mul_grads(const T* g, const T* a, const T* b, T* da, T* db, i64 n)
//   Both gradients of a*b, same shape, one pass: da[i] = g[i] b[i],
//   db[i] = g[i] a[i] (each one rounding in A, as the CPU's Mul).
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// relu_fwd(const T* x, T* y, unsigned int* mask, i64 n)
//   y[i] = x[i] where pass else +0, pass = (x > 0 or x is NaN) in A; y
//   copies x's bits where it passes. mask: ceil(n / 32) unsigned ints
//   (= 4 ceil(n/32) bytes); bit i % 32 of word i / 32 is pass(i), unused
//   high bits of the last word 0. Little-endian, so its first ceil(n / 8)
//   bytes are exactly the CPU's Vec<u8> mask (bit i % 8 of byte i / 8).
//   Whole warps own whole words (a ballot per 32 elements), so blockDim.x
//   must be a multiple of 32.
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
//
// relu_bwd(const unsigned int* mask, const T* g, T* dx, i64 n)
//   dx[i] = g[i] where bit i of mask (layout above) is set, else +0.
//   grid = min(ceil(n / 256), 65535), block = 256, smem = 0.
// ---------------------------------------------------------------------------

// ----- src/special.rs, ported in f64 (same operations, same order) ---------
#define SP_TWO_OVER_SQRT_PI 1.12837916709551257390
#define SP_FRAC_1_SQRT_2 0.70710678118654752440
#define SP_PI 3.14159265358979323846
#define SP_SPLIT 1.5
#define SP_ERFC_ZERO 27.3

// x with the low 32 mantissa bits cleared: its square is exact.
__device__ __forceinline__ double sp_high(double x) {
    return __longlong_as_double(__double_as_longlong(x) & (long long)0xFFFFFFFF00000000ull);
}

// e^(-x^2 / 2^k), k in {0,1}: x^2 = h^2 + (x-h)(x+h) with h^2 exact.
__device__ __forceinline__ double sp_exp_neg_sq(double x, bool halve) {
    if (fabs(x) > 1.7976931348623157e308) return 0.0;  // +-inf: the limit, not inf - inf
    double h = sp_high(x);
    double s = halve ? 0.5 : 1.0;
    double e1 = exp(__dmul_rn(-__dmul_rn(h, h), s));
    double e2 = exp(__dmul_rn(-__dmul_rn(__dsub_rn(x, h), __dadd_rn(x, h)), s));
    return __dmul_rn(e1, e2);
}

// erf by the positive series, |x| < 1.5.
__device__ double sp_erf_series(double x) {
    double z = __dmul_rn(__dmul_rn(2.0, x), x);
    double term = 1.0, sum = 1.0, n = 0.0;
    while (term > __dmul_rn(sum, 1.5e-17)) {
        n = __dadd_rn(n, 1.0);
        term = __dmul_rn(term, __ddiv_rn(z, __dadd_rn(__dmul_rn(2.0, n), 1.0)));
        sum = __dadd_rn(sum, term);
    }
    return __dmul_rn(__dmul_rn(__dmul_rn(SP_TWO_OVER_SQRT_PI, x), sp_exp_neg_sq(x, false)), sum);
}

// erfc(x) e^(x^2) by the continued fraction, x >= 1.5, bottom-up.
__device__ double sp_erfc_scaled(double x) {
    int depth = x < 2.0 ? 44 : x < 3.0 ? 28 : x < 6.0 ? 16 : 8;
    double z = __dmul_rn(__dmul_rn(2.0, x), x);
    double z1 = __dadd_rn(z, 1.0);
    double t = __dadd_rn(z1, __dmul_rn(4.0, (double)depth));
    for (int ki = depth; ki >= 1; --ki) {
        double k = (double)ki;
        double num = __dmul_rn(__dsub_rn(__dmul_rn(2.0, k), 1.0), __dmul_rn(2.0, k));
        t = __dsub_rn(__dadd_rn(z1, __dmul_rn(4.0, __dsub_rn(k, 1.0))), __ddiv_rn(num, t));
    }
    return __ddiv_rn(__dmul_rn(SP_TWO_OVER_SQRT_PI, x), t);
}

__device__ double sp_erfc_fraction(double x) {
    if (x >= SP_ERFC_ZERO) return 0.0;
    return __dmul_rn(sp_erfc_scaled(x), sp_exp_neg_sq(x, false));
}

__device__ double sp_erf(double x) {
    double a = fabs(x);
    if (a != a) return x;
    if (a < SP_SPLIT) return sp_erf_series(x);
    return copysign(__dsub_rn(1.0, sp_erfc_fraction(a)), x);
}

__device__ double sp_erfc(double x) {
    if (x != x) return x;
    if (x < SP_SPLIT) return __dsub_rn(1.0, sp_erf(x));
    return sp_erfc_fraction(x);
}

// Phi(x) = erfc(-x / sqrt 2) / 2, relative accuracy in the left tail.
__device__ double sp_normal_cdf(double x) {
    double a = __dmul_rn(-x, SP_FRAC_1_SQRT_2);
    if (a != a || a < SP_SPLIT) return __dmul_rn(0.5, sp_erfc(a));
    if (a >= SP_ERFC_ZERO) return 0.0;
    return __dmul_rn(__dmul_rn(0.5, sp_erfc_scaled(a)), sp_exp_neg_sq(x, true));
}

// phi(x) = e^(-x^2/2) / sqrt(2 pi).
__device__ __forceinline__ double sp_normal_pdf(double x) {
    return __ddiv_rn(sp_exp_neg_sq(x, true), __dsqrt_rn(__dmul_rn(2.0, SP_PI)));
}

// x Phi(x).
// At -inf (below the largest finite double) the limit 0, as -0, not -inf * 0.
__device__ __forceinline__ double gelu_erf_f64(double x) {
    return x < -1.7976931348623157e308 ? -0.0 : __dmul_rn(x, sp_normal_cdf(x));
}

// Phi(x) + x phi(x); the second term 0 where phi underflows to exactly 0.
__device__ double gelu_erf_slope_f64(double x) {
    double p = sp_normal_pdf(x);
    if (p == 0.0) return sp_normal_cdf(x);
    return __dadd_rn(sp_normal_cdf(x), __dmul_rn(x, p));
}

// ----- activations in A (ops/elementwise/cpu.rs) ---------------------------
// 1 / (1 + e^-x), as e^x / (1 + e^x) for negative x (no overflow).
template <class A> __device__ __forceinline__ A ew_sigmoid(A x) {
    if (x >= (A)0) return fg_div((A)1, fg_add((A)1, fg_exp(-x)));
    A e = fg_exp(x);
    return fg_div(e, fg_add((A)1, e));
}

#define GELU_K 0.7978845608028654
#define GELU_A 0.044715

// 2u = 2 k (x + a x^3), constants rounded to A first (as `A::of`).
template <class A> __device__ __forceinline__ A gelu_2u(A x) {
    A two_k = fg_mul((A)2.0, (A)GELU_K);
    A cube = fg_mul(fg_mul(fg_mul((A)GELU_A, x), x), x);
    return fg_mul(two_k, fg_add(x, cube));
}

template <class A> __device__ __forceinline__ A gelu_tanh_fwd(A x) {
    return fg_mul(x, ew_sigmoid(gelu_2u(x)));
}

// s + 2 x s (1-s) k (1 + 3 a x^2) with (s, 1-s) from one exponential;
// s alone where s (1-s) is exactly 0 (finite slope for huge |x|).
template <class A> __device__ A gelu_tanh_slope(A x) {
    A v = gelu_2u(x);
    A e = fg_exp(-fg_abs(v));
    A big = fg_div((A)1, fg_add((A)1, e));
    A small = fg_div(e, fg_add((A)1, e));
    A s = v >= (A)0 ? big : small;
    A sn = v >= (A)0 ? small : big;
    A ss = fg_mul(s, sn);
    if (ss == (A)0) return s;
    A t = fg_mul(fg_mul(fg_mul((A)2.0, x), ss), (A)GELU_K);
    A q = fg_add((A)1, fg_mul(fg_mul(fg_mul((A)3.0, (A)GELU_A), x), x));
    return fg_add(s, fg_mul(t, q));
}

// x^n by square-and-multiply, as Rust's powi (compiler-builtins __powi*f2):
// exact for the bits Rust produces at a runtime exponent.
template <class A> __device__ A ew_powi(A a, int n) {
    unsigned int p = n < 0 ? 0u - (unsigned int)n : (unsigned int)n;
    A r = (A)1;
    while (true) {
        if (p & 1u) r = fg_mul(r, a);
        p >>= 1;
        if (p == 0u) break;
        a = fg_mul(a, a);
    }
    return n < 0 ? fg_div((A)1, r) : r;
}

// ----- kinds ----------------------------------------------------------------
enum {
    U_COPY, U_FILL, U_NEG, U_ADD_S, U_MUL_S, U_DIV_S, U_POWI, U_SQRT, U_RSQRT,
    U_EXP, U_LOG, U_TANH, U_SIGMOID, U_GELU_TANH, U_GELU_ERF, U_COUNT
};
enum {
    B_ADD, B_SUB, B_MUL, B_DIV, B_NEG_MUL, B_POWI_GRAD, B_SQRT_GRAD, B_RSQRT_GRAD,
    B_TANH_GRAD, B_SIGMOID_GRAD, B_GELU_TANH_GRAD, B_GELU_ERF_GRAD, B_COUNT
};

template <int K, class A> __device__ __forceinline__ A un_op(A v, A c, int n) {
    if constexpr (K == U_FILL) return c;
    else if constexpr (K == U_NEG) return -v;
    else if constexpr (K == U_ADD_S) return fg_add(v, c);
    else if constexpr (K == U_MUL_S) return fg_mul(v, c);
    else if constexpr (K == U_DIV_S) return fg_div(v, c);
    else if constexpr (K == U_POWI) return ew_powi(v, n);
    else if constexpr (K == U_SQRT) return fg_sqrt(v);
    else if constexpr (K == U_RSQRT) return fg_div((A)1, fg_sqrt(v));
    else if constexpr (K == U_EXP) return fg_exp(v);
    else if constexpr (K == U_LOG) return fg_log(v);
    else if constexpr (K == U_TANH) return fg_tanh(v);
    else if constexpr (K == U_SIGMOID) return ew_sigmoid(v);
    else if constexpr (K == U_GELU_TANH) return gelu_tanh_fwd(v);
    else if constexpr (K == U_GELU_ERF) return (A)gelu_erf_f64((double)v);
    else return v;  // U_COPY (handled as a raw copy by the loops)
}

// PowiGrad's pieces: nf = (A)(double)n, m = n - 1 unless it overflows.
template <int K, class A> __device__ __forceinline__ A bin_op(A p, A q, int n) {
    if constexpr (K == B_ADD) return fg_add(p, q);
    else if constexpr (K == B_SUB) return fg_sub(p, q);
    else if constexpr (K == B_MUL) return fg_mul(p, q);
    else if constexpr (K == B_DIV) return fg_div(p, q);
    else if constexpr (K == B_NEG_MUL) return -fg_mul(p, q);
    else if constexpr (K == B_POWI_GRAD) {
        // n = 0: exactly 0 whatever g and x (the CPU's constant kind).
        if (n == 0) return (A)0;
        A gn = fg_mul(p, (A)(double)n);
        // n = i32::MIN, where n - 1 overflows: g n x^n / x.
        if (n == (int)0x80000000) return fg_div(fg_mul(gn, ew_powi(q, n)), q);
        return fg_mul(gn, ew_powi(q, n - 1));
    }
    else if constexpr (K == B_SQRT_GRAD) return fg_div(p, fg_mul((A)2, q));
    else if constexpr (K == B_RSQRT_GRAD)
        return fg_mul(fg_mul(fg_mul(fg_mul((A)-0.5, p), q), q), q);
    else if constexpr (K == B_TANH_GRAD) return fg_mul(p, fg_sub((A)1, fg_mul(q, q)));
    else if constexpr (K == B_SIGMOID_GRAD) return fg_mul(fg_mul(p, q), fg_sub((A)1, q));
    else if constexpr (K == B_GELU_TANH_GRAD) return fg_mul(p, gelu_tanh_slope(q));
    else return fg_mul(p, (A)gelu_erf_slope_f64((double)q));  // B_GELU_ERF_GRAD
}

// ----- strided addressing ---------------------------------------------------
// Offsets of output element i in a and b; 32-bit division when the whole
// index space fits (the common case, far cheaper than 64-bit division).
__device__ __forceinline__ void ew_offsets(const Strides &s, i64 i, bool small, i64 &oa, i64 &ob) {
    oa = 0;
    ob = 0;
    if (small) {
        unsigned int r = (unsigned int)i;
        for (int d = s.rank - 1; d >= 0; --d) {
            unsigned int nd = (unsigned int)s.shape[d];
            unsigned int k = r % nd;
            r /= nd;
            oa += (i64)k * s.a[d];
            ob += (i64)k * s.b[d];
        }
    } else {
        for (int d = s.rank - 1; d >= 0; --d) {
            i64 nd = s.shape[d];
            i64 k = i % nd;
            i /= nd;
            oa += k * s.a[d];
            ob += k * s.b[d];
        }
    }
}

#define EW_LOOP(i, n)                                                                \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (i64)gridDim.x * blockDim.x)

// ----- unary ------------------------------------------------------------------
template <class T, int K>
__device__ __forceinline__ void unary_loop(const T *x, T *y, i64 n, acc_t<T> c, int ni) {
    EW_LOOP(i, n) {
        if constexpr (K == U_COPY) y[i] = x[i];
        else if constexpr (K == U_FILL) y[i] = from_acc<T>(c);
        else y[i] = from_acc<T>(un_op<K>(to_acc(x[i]), c, ni));
    }
}

template <class T, int K>
__device__ __forceinline__ void unary_strided_loop(const T *x, T *y, const Strides &s, i64 n,
                                                   acc_t<T> c, int ni) {
    bool small = n <= 0xFFFFFFFFll;
    EW_LOOP(i, n) {
        if constexpr (K == U_FILL) {
            y[i] = from_acc<T>(c);
        } else {
            i64 oa, ob;
            ew_offsets(s, i, small, oa, ob);
            if constexpr (K == U_COPY) y[i] = x[oa];
            else y[i] = from_acc<T>(un_op<K>(to_acc(x[oa]), c, ni));
        }
    }
}

#define UNARY_CASES(CALL)                                                            \
    switch (kind) {                                                                  \
    case U_COPY: CALL(U_COPY); break;                                                \
    case U_FILL: CALL(U_FILL); break;                                                \
    case U_NEG: CALL(U_NEG); break;                                                  \
    case U_ADD_S: CALL(U_ADD_S); break;                                              \
    case U_MUL_S: CALL(U_MUL_S); break;                                              \
    case U_DIV_S: CALL(U_DIV_S); break;                                              \
    case U_POWI: CALL(U_POWI); break;                                                \
    case U_SQRT: CALL(U_SQRT); break;                                                \
    case U_RSQRT: CALL(U_RSQRT); break;                                              \
    case U_EXP: CALL(U_EXP); break;                                                  \
    case U_LOG: CALL(U_LOG); break;                                                  \
    case U_TANH: CALL(U_TANH); break;                                                \
    case U_SIGMOID: CALL(U_SIGMOID); break;                                          \
    case U_GELU_TANH: CALL(U_GELU_TANH); break;                                      \
    case U_GELU_ERF: CALL(U_GELU_ERF); break;                                        \
    default: break;                                                                  \
    }

#define BINARY_CASES(CALL)                                                           \
    switch (kind) {                                                                  \
    case B_ADD: CALL(B_ADD); break;                                                  \
    case B_SUB: CALL(B_SUB); break;                                                  \
    case B_MUL: CALL(B_MUL); break;                                                  \
    case B_DIV: CALL(B_DIV); break;                                                  \
    case B_NEG_MUL: CALL(B_NEG_MUL); break;                                          \
    case B_POWI_GRAD: CALL(B_POWI_GRAD); break;                                      \
    case B_SQRT_GRAD: CALL(B_SQRT_GRAD); break;                                      \
    case B_RSQRT_GRAD: CALL(B_RSQRT_GRAD); break;                                    \
    case B_TANH_GRAD: CALL(B_TANH_GRAD); break;                                      \
    case B_SIGMOID_GRAD: CALL(B_SIGMOID_GRAD); break;                                \
    case B_GELU_TANH_GRAD: CALL(B_GELU_TANH_GRAD); break;                            \
    case B_GELU_ERF_GRAD: CALL(B_GELU_ERF_GRAD); break;                              \
    default: break;                                                                  \
    }

// ----- binary -----------------------------------------------------------------
template <class T, int K>
__device__ __forceinline__ void binary_flat_loop(const T *a, const T *b, T *y, i64 n, int ni) {
    EW_LOOP(i, n) y[i] = from_acc<T>(bin_op<K>(to_acc(a[i]), to_acc(b[i]), ni));
}

template <class T, int K>
__device__ __forceinline__ void binary_strided_loop(const T *a, const T *b, T *y,
                                                    const Strides &s, i64 n, int ni) {
    bool small = n <= 0xFFFFFFFFll;
    EW_LOOP(i, n) {
        i64 oa, ob;
        ew_offsets(s, i, small, oa, ob);
        y[i] = from_acc<T>(bin_op<K>(to_acc(a[oa]), to_acc(b[ob]), ni));
    }
}

// Kernel bodies as templates; the extern "C" wrappers only name them.
template <class T>
__device__ __forceinline__ void unary_body(const T *x, T *y, i64 n, int kind, double c, int ni) {
    acc_t<T> ca = (acc_t<T>)c;
#define CALL(K) unary_loop<T, K>(x, y, n, ca, ni)
    UNARY_CASES(CALL)
#undef CALL
}

template <class T>
__device__ __forceinline__ void unary_strided_body(const T *x, T *y, const Strides &s, i64 n,
                                                   int kind, double c, int ni) {
    acc_t<T> ca = (acc_t<T>)c;
#define CALL(K) unary_strided_loop<T, K>(x, y, s, n, ca, ni)
    UNARY_CASES(CALL)
#undef CALL
}

template <class T>
__device__ __forceinline__ void binary_flat_body(const T *a, const T *b, T *y, i64 n, int kind,
                                                 int ni) {
#define CALL(K) binary_flat_loop<T, K>(a, b, y, n, ni)
    BINARY_CASES(CALL)
#undef CALL
}

template <class T>
__device__ __forceinline__ void binary_strided_body(const T *a, const T *b, T *y,
                                                    const Strides &s, i64 n, int kind, int ni) {
#define CALL(K) binary_strided_loop<T, K>(a, b, y, s, n, ni)
    BINARY_CASES(CALL)
#undef CALL
}

// ----- mul_grads, relu ----------------------------------------------------------
template <class T>
__device__ __forceinline__ void mul_grads_body(const T *g, const T *a, const T *b, T *da, T *db,
                                               i64 n) {
    EW_LOOP(i, n) {
        acc_t<T> gv = to_acc(g[i]);
        da[i] = from_acc<T>(fg_mul(gv, to_acc(b[i])));
        db[i] = from_acc<T>(fg_mul(gv, to_acc(a[i])));
    }
}

// +0 in any element type (all-zero bits).
template <class T> __device__ __forceinline__ T ew_zero() {
    T z;
    if constexpr (sizeof(T) == 2) z.bits = 0;
    else z = (T)0;
    return z;
}

// A warp owns 32 consecutive elements per step (one mask word); the loop
// bound is warp-uniform so every lane reaches the ballot.
template <class T>
__device__ __forceinline__ void relu_fwd_body(const T *x, T *y, unsigned int *mask, i64 n) {
    i64 words = (n + 31) >> 5;
    i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    i64 nwarps = ((i64)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (i64 w = warp; w < words; w += nwarps) {
        i64 i = (w << 5) + lane;
        bool pass = false;
        if (i < n) {
            T v = x[i];
            acc_t<T> av = to_acc(v);
            pass = av > (acc_t<T>)0 || av != av;
            y[i] = pass ? v : ew_zero<T>();
        }
        unsigned int bits = __ballot_sync(0xffffffffu, pass);
        if (lane == 0) mask[w] = bits;
    }
}

template <class T>
__device__ __forceinline__ void relu_bwd_body(const unsigned int *mask, const T *g, T *dx, i64 n) {
    EW_LOOP(i, n) {
        bool pass = (mask[i >> 5] >> (unsigned int)(i & 31)) & 1u;
        dx[i] = pass ? g[i] : ew_zero<T>();
    }
}

// ----- exports ----------------------------------------------------------------
#define K_ELEMENTWISE(T, S)                                                                   \
    extern "C" __global__ void unary_##S(const T *x, T *y, i64 n, int kind, double c, int ni) { \
        unary_body<T>(x, y, n, kind, c, ni);                                                  \
    }                                                                                         \
    extern "C" __global__ void unary_strided_##S(const T *x, T *y, Strides s, i64 n, int kind, \
                                                 double c, int ni) {                          \
        unary_strided_body<T>(x, y, s, n, kind, c, ni);                                       \
    }                                                                                         \
    extern "C" __global__ void binary_##S(const T *a, const T *b, T *y, Strides s, i64 n,      \
                                          int kind, int ni) {                                 \
        binary_strided_body<T>(a, b, y, s, n, kind, ni);                                      \
    }                                                                                         \
    extern "C" __global__ void binary_flat_##S(const T *a, const T *b, T *y, i64 n, int kind,  \
                                               int ni) {                                      \
        binary_flat_body<T>(a, b, y, n, kind, ni);                                            \
    }                                                                                         \
    extern "C" __global__ void mul_grads_##S(const T *g, const T *a, const T *b, T *da, T *db, \
                                             i64 n) {                                         \
        mul_grads_body<T>(g, a, b, da, db, n);                                                \
    }                                                                                         \
    extern "C" __global__ void relu_fwd_##S(const T *x, T *y, unsigned int *mask, i64 n) {     \
        relu_fwd_body<T>(x, y, mask, n);                                                      \
    }                                                                                         \
    extern "C" __global__ void relu_bwd_##S(const unsigned int *mask, const T *g, T *dx,       \
                                            i64 n) {                                          \
        relu_bwd_body<T>(mask, g, dx, n);                                                     \
    }

FG_ALL_TYPES(K_ELEMENTWISE)
