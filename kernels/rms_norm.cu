// rms_norm.cu: fused RMSNorm forward and backward (f32, f64, f16, bf16).
//
// SEMANTICS (ops/rms_norm: mod.rs, cpu.rs; the fallback of
// ops/layer_norm/scaled.rs with no centring). x is [n_rows, d] row-major and
// contiguous. Per row, in A = acc_t<T> (float; double for f64), every
// operation rounded on its own as the CPU does (no FMA contraction):
//   rstd = 1 / sqrt(sum(x^2) / d + eps)
//   y    = (x * rstd) * gamma                 (absent gamma skipped: *1 exact)
// Backward, g = dy * gamma, xhat = x * rstd:
//   dx = rstd * (g - xhat * (sum(g*xhat) / d)),  dgamma = sum over rows of dy*xhat
// Only the summation order differs from the CPU (see DETERMINISM).
//
// KERNELS (names get _f32, _f64, _f16 or _bf16; A = acc_t<T>; null = a null
// device pointer, 0u64; every pointer is to device memory)
//
// rms_norm_fwd(const T *x, const T *gamma, T *y, A *rstd, i64 n_rows, i64 d,
//              int tpr, i64 rows_per_range, double eps)
//   x, y: [n_rows, d]. gamma: [d] or null. rstd: [n_rows], written (the
//   statistic backward needs). eps: the op's eps as A, widened to double
//   (rounded back to A inside, exactly). Reads x once from DRAM (see PATHS),
//   gamma; writes y, rstd.
//
// rms_norm_bwd(const T *x, const T *dy, const T *gamma, const A *rstd, T *dx,
//              A *part, i64 n_rows, i64 d, int tpr, i64 rows_per_range,
//              double eps)
//   x, gamma, eps: as given to the forward; rstd: the forward's; dy:
//   [n_rows, d]. dx: [n_rows, d] written, or null when not wanted. part:
//   scratch of P*d values of A, or null when dgamma is not wanted; row p =
//   dgamma terms summed over rows p*R .. min((p+1)*R, n)-1 (R =
//   rows_per_range) in row order; every row p < P is written in full (no
//   memset needed). Reads x, dy, rstd, gamma once from DRAM; writes dx, part.
//
// rms_norm_bwd_finalize(const A *part, T *dgamma, i64 n_parts, i64 d)
//   dgamma[j] = sum_p part[p*d + j], p = 0 .. n_parts-1 in a fixed order,
//   rounded to T. n_parts = P; n_parts = 0 writes zeros (the N = 0 case).
//
// GEOMETRY (the host's rule, the same as layer_norm.cu's; results depend on
// d, the dtype and, for the backward, rows_per_range, never on the device
// or the grid)
//   VEC = 16 / sizeof(T)                  4 f32, 2 f64, 8 f16/bf16
//   NV  = 8 forward, 2 backward           16-byte chunks a thread holds
//   C   = ceil(d / VEC),  m = ceil(C / NV)
//   tpr = m <= 32 ? next_pow2(m) : min(round_up(m, 32), 512)
//   block = tpr >= 256 ? tpr : (256 / tpr) * tpr      (G = block / tpr)
//   Dynamic shared memory: 0 bytes for every kernel (static: 4 KiB for fwd
//   and bwd, 1 KiB (2 KiB f64) for finalize).
//   forward:  rows_per_range R_f >= 1, any (suggested: clamp(ceil(N/4096),
//             1, 8)); grid = ceil(ceil(N / R_f) / G); any grid >= 1 gives
//             the same bits.
//   backward: R = max(clamp(ceil(N / 128), 1, 64), ceil(N / 4096)),
//             P = ceil(N / R) (<= 4096, a function of N only),
//             grid = ceil(P / G) (any grid >= 1 gives the same bits).
//   finalize: block 256 (required), grid = clamp(ceil(d / 32), 1, 65535).
//   Limits: tpr a power of two <= 32 or a multiple of 32 <= 512; block a
//   multiple of tpr and of 32, <= 512, block / tpr <= 4 when tpr > 32.
//   N = 0: launch neither fwd nor bwd; for a wanted dgamma write zeros
//   (memset, or finalize with n_parts = 0).
//
// LAUNCH ORDER (backward): rms_norm_bwd, then rms_norm_bwd_finalize on the
// same stream, reading the same part. Outputs must not alias inputs
// (pointers are __restrict__).
//
// PATHS: held (every pointer 16-byte aligned, d % VEC == 0, d <= NV*VEC*tpr:
// tpr = 512 gives forward d <= 16384 f32, 32768 f16/bf16, 8192 f64; backward
// 4096 f32, 8192 f16/bf16, 2048 f64): the row stays in registers (16-byte
// loads/stores, x and dy read once, dgamma terms in registers across a
// range, next rows prefetched into L2). Otherwise streaming: chunk by chunk,
// each pass reading the row again (from L1/L2), interleaved coalesced
// scalar accesses when d % VEC != 0. Same bits on both paths for one d.
// (layer_norm.cu's header has the details; the code below is the same.)
//
// SCALED FALLBACK (scaled.rs with mean 0), inside the kernels: a row whose
// rstd is out of the trusted range (0, inf, NaN or > 2^40 f32 / 2^459 f64:
// sum(x^2) overflowed or lost bits to subnormals) and whose values are all
// finite is recomputed in f64 on x*2^k (1 <= max|x*2^k| < 2), rstd = r*2^k
// as scaled.rs stores it; in the backward a row takes the f64 path when its
// saved rstd is out of range (also subnormal) or its sums overflowed.
// Finite input gives finite rstd and xhat (y is finite unless xhat*gamma
// overflows T). NaN rows propagate (y, dx NaN in that row, dgamma NaN); an
// inf gives rstd = 0, so y = x*0 (NaN at the inf), as IEEE and the CPU.
//
// DETERMINISM: no atomics; every sum in a fixed order that depends only on
// (d, dtype, rows_per_range); finalize adds the part rows in a fixed order.

// ===========================================================================
// Fused-norm core. The same text sits in layer_norm.cu and rms_norm.cu
// (each file is compiled on its own with only common.cuh before it); CEN
// selects LayerNorm (centre by the mean, beta, dbeta) or RMSNorm.
// ===========================================================================

#define FG_RMS_FWD(T, S)                                                                        \
    extern "C" __global__ void __launch_bounds__(512)                                           \
        rms_norm_fwd_##S(const T *x, const T *gamma, T *y, acc_t<T> *rstd, i64 n_rows, i64 d,   \
                         int tpr, i64 rows_per_range, double eps) {                             \
        fgn::forward<T, false>(x, gamma, nullptr, y, nullptr, rstd, n_rows, d, tpr, rows_per_range, \
                               eps);                                                            \
    }
FG_ALL_TYPES(FG_RMS_FWD)

#define FG_RMS_BWD(T, S)                                                                          \
    extern "C" __global__ void __launch_bounds__(512)                                             \
        rms_norm_bwd_##S(const T *x, const T *dy, const T *gamma, const acc_t<T> *rstd, T *dx,    \
                         acc_t<T> *part, i64 n_rows, i64 d, int tpr, i64 rows_per_range,          \
                         double eps) {                                                            \
        fgn::backward<T, false>(x, dy, gamma, nullptr, rstd, dx, part, n_rows, d, tpr,            \
                                rows_per_range, eps);                                             \
    }
FG_ALL_TYPES(FG_RMS_BWD)

#define FG_RMS_FIN(T, S)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        rms_norm_bwd_finalize_##S(const acc_t<T> *part, T *dgamma, i64 n_parts, i64 d) {          \
        fgn::finalize<T, false>(part, dgamma, nullptr, n_parts, d);                               \
    }
FG_ALL_TYPES(FG_RMS_FIN)
