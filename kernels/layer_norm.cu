// layer_norm.cu: fused LayerNorm forward and backward (f32, f64, f16, bf16).
//
// SEMANTICS (ops/layer_norm: mod.rs, cpu.rs, cpu/*.rs, scaled.rs). x is
// [n_rows, d] row-major and contiguous (d = product of the normalized dims).
// Per row, in A = acc_t<T> (float; double for f64), every operation rounded
// on its own as the CPU does (no FMA contraction):
//   mean = x[0] + sum(x - x[0]) / d          shifted, so constant rows are exact
//   rstd = 1 / sqrt(sum((x - mean)^2) / d + eps)   two passes, never E[x^2]-E[x]^2
//   y    = ((x - mean) * rstd) * gamma + beta      (absent gamma/beta skipped:
//                                                   the CPU's *1 and + -0 are exact)
// Backward, g = dy * gamma, xhat = (x - mean) * rstd, inv_d = 1/d:
//   dx = rstd * ((g - sum(g)*inv_d) - xhat * (sum(g*xhat)*inv_d))
//   dgamma = sum over rows of dy*xhat,  dbeta = sum over rows of dy
// Only the summation order differs from the CPU (see DETERMINISM), so results
// agree to rounding, not bit for bit.
//
// KERNELS (names get _f32, _f64, _f16 or _bf16; A = acc_t<T>; null = a null
// device pointer, 0u64; every pointer is to device memory)
//
// layer_norm_fwd(const T *x, const T *gamma, const T *beta, T *y, A *mean,
//                A *rstd, i64 n_rows, i64 d, int tpr, i64 rows_per_range,
//                double eps)
//   x, y: [n_rows, d]. gamma, beta: [d], or null when absent (each on its
//   own). mean, rstd: [n_rows], written (the statistics backward needs).
//   eps: the op's eps as A (the host's checked value widened to double; it
//   is rounded back to A inside, exactly). tpr, rows_per_range: GEOMETRY.
//   Reads x once from DRAM (the row stays in registers; see PATHS), gamma,
//   beta; writes y, mean, rstd.
//
// layer_norm_bwd(const T *x, const T *dy, const T *gamma, const A *mean,
//                const A *rstd, T *dx, A *part, i64 n_rows, i64 d, int tpr,
//                i64 rows_per_range, double eps)
//   x, gamma, eps: as given to the forward; mean, rstd: the forward's
//   outputs; dy: [n_rows, d]. dx: [n_rows, d] written, or null when dx is not
//   wanted. part: scratch of P*2*d values of A (P below), or null when
//   neither dgamma nor dbeta is wanted. Row p of part is
//   [dgamma terms | dbeta terms] summed over rows p*R .. min((p+1)*R, n)-1
//   (R = rows_per_range) in row order; every row p < P is written in full
//   (no memset needed). Reads x, dy, mean, rstd, gamma once from DRAM;
//   writes dx and part.
//
// layer_norm_bwd_finalize(const A *part, T *dgamma, T *dbeta, i64 n_parts,
//                         i64 d)
//   dgamma[j] = sum_p part[p*2d + j], dbeta[j] = sum_p part[p*2d + d + j]
//   for p = 0 .. n_parts-1 in a fixed order, rounded to T. Either output may
//   be null. n_parts = P; n_parts = 0 writes zeros (the N = 0 case).
//
// GEOMETRY (the host's rule; results depend on d, the dtype and, for the
// backward, rows_per_range, never on the device or the grid)
//   VEC = 16 / sizeof(T)                  4 f32, 2 f64, 8 f16/bf16
//   NV  = 8 forward, 2 backward           16-byte chunks a thread holds
//   C   = ceil(d / VEC),  m = ceil(C / NV)
//   tpr = m <= 32 ? next_pow2(m) : min(round_up(m, 32), 512)
//                                          threads per row ("team")
//   block = tpr >= 256 ? tpr : (256 / tpr) * tpr
//                                          G = block / tpr rows at a time
//   Dynamic shared memory: 0 bytes for every kernel (static: 4 KiB for fwd
//   and bwd, 1 KiB (2 KiB f64) for finalize).
//   forward:  rows_per_range R_f >= 1, any (suggested: clamp(ceil(N/4096),
//             1, 8)); grid = ceil(ceil(N / R_f) / G). Any grid >= 1 is
//             correct (blocks stride over ranges of R_f rows) and gives
//             the same bits.
//   backward: R = max(clamp(ceil(N / 128), 1, 64), ceil(N / 4096)),
//             P = ceil(N / R) (so P <= 4096 and depends on N only),
//             grid = ceil(P / G) (any grid >= 1 gives the same bits).
//   finalize: block 256 (required), grid = clamp(ceil(2d / 32), 1, 65535)
//             (any grid >= 1 is correct).
//   Limits the kernels rely on: tpr a power of two <= 32 or a multiple of
//   32 <= 512; block a multiple of tpr and of 32, <= 512, and
//   block / tpr <= 4 when tpr > 32 (the rule above satisfies all three).
//   N = 0 (no rows): launch neither fwd nor bwd; for wanted dgamma/dbeta
//   write zeros (memset, or finalize with n_parts = 0).
//
// LAUNCH ORDER (backward): layer_norm_bwd, then layer_norm_bwd_finalize on
// the same stream, reading the same part (kept until finalize has run).
// Outputs must not alias inputs (pointers are __restrict__).
//
// PATHS (chosen inside, uniformly per launch)
//   held: every pointer 16-byte aligned, d % VEC == 0 and d <= NV*VEC*tpr
//   (tpr = 512: forward d <= 16384 f32, 32768 f16/bf16, 8192 f64; backward
//   d <= 4096 f32, 8192 f16/bf16, 2048 f64). A team holds its row in
//   registers: thread `lane` holds chunks k = 0..NV-1 (16 bytes each, the
//   elements (k*tpr + lane)*VEC ..+VEC), read with 16-byte loads; the
//   forward reads x once and writes y with 16-byte stores; the backward reads
//   x and dy once, keeps its columns' dgamma/dbeta terms in registers across
//   the rows of a range, and writes them to part once per range. The next
//   rows of the range (16 KiB ahead, rows up to 256 KiB) are prefetched into
//   L2 while a row is processed (both paths).
//   streaming (everything else: misaligned pointers, d % VEC != 0, longer
//   rows): the same teams walk the row chunk by chunk, several chunks in
//   flight, and read it again for each pass (the passes after the first hit
//   L1/L2); the backward adds its terms into part row by row. Chunks are 16
//   contiguous bytes when d % VEC == 0 (16-byte accesses when aligned) and
//   otherwise "interleaved": element (k*VEC + e)*tpr + lane, so each scalar
//   access of a warp is coalesced. (For d % VEC != 0 the rows start at
//   varying alignments; a per-row vector body with a scalar tail would make
//   each thread's elements, hence the sums' bits, depend on the row's
//   address. Coalesced scalar accesses move the same DRAM lines.) A thread's
//   summation order depends only on (d, tpr), so held and streaming give the
//   same bits for the same d.
//   Team reductions: xor butterflies inside a warp; for tpr > 32 one value
//   per warp through shared memory and a named barrier (bar.sync 1+g, tpr)
//   per team, then a butterfly over the per-warp values.
//
// SCALED FALLBACK (scaled.rs), inside the kernels, no host round trip. A row
// whose statistics fall out of the trusted range (mean not finite, rstd <= 0,
// NaN or > 2^40 (f32) / 2^459 (f64): the squares overflowed, or lost bits
// to subnormals with a tiny eps) has its max|x| reduced (NaN-propagating);
// if the row is finite it is recomputed in f64 on x*2^k with 1 <= max|x*2^k|
// < 2 (exact scaling; eps*2^(2k); an eps that dwarfs var or a constant row is
// normalized unscaled), exactly as scaled.rs: y = xhat*gamma + beta in f64,
// mean and rstd as scaled.rs stores them. That row is read again from
// L1/L2; the others are untouched (a warp-wide vote keeps all lanes in the
// reductions). The backward recomputes per row, not per node: a row takes
// the f64 path when its saved statistics are out of range (also rstd
// subnormal) or its fast sums overflowed, and x is finite; its dx is
// 2^kout*(r*(g - <g> - xhat*<g xhat>)) in f64 like scaled.rs. Finite input
// always gives finite statistics and xhat (y is finite unless
// xhat*gamma + beta itself overflows T). NaN/inf rows are not rescued: they
// propagate through the fast formulas (y, dx NaN in that row; dgamma NaN;
// dbeta stays finite when dy is).
//
// DETERMINISM: no atomics. Each thread sums its elements in (k, e) order,
// teams reduce in a fixed butterfly order, part rows hold the rows of a
// range in row order, and finalize adds the part rows in a fixed order (8
// slices p = s, s+8, ... each in order, then the slices in order). Every
// order is a function of (d, dtype, rows_per_range), so two runs, any grid
// and any GPU give the same bits.

// ===========================================================================
// Fused-norm core. The same text sits in layer_norm.cu and rms_norm.cu
// (each file is compiled on its own with only common.cuh before it); CEN
// selects LayerNorm (centre by the mean, beta, dbeta) or RMSNorm.
// ===========================================================================

#define FG_LN_FWD(T, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(512)                                             \
        layer_norm_fwd_##S(const T *x, const T *gamma, const T *beta, T *y, acc_t<T> *mean,        \
                           acc_t<T> *rstd, i64 n_rows, i64 d, int tpr, i64 rows_per_range,         \
                           double eps) {                                                           \
        fgn::forward<T, true>(x, gamma, beta, y, mean, rstd, n_rows, d, tpr, rows_per_range, eps); \
    }
FG_ALL_TYPES(FG_LN_FWD)

#define FG_LN_BWD(T, S)                                                                           \
    extern "C" __global__ void __launch_bounds__(512)                                            \
        layer_norm_bwd_##S(const T *x, const T *dy, const T *gamma, const acc_t<T> *mean,         \
                           const acc_t<T> *rstd, T *dx, acc_t<T> *part, i64 n_rows, i64 d,        \
                           int tpr, i64 rows_per_range, double eps) {                             \
        fgn::backward<T, true>(x, dy, gamma, mean, rstd, dx, part, n_rows, d, tpr, rows_per_range, \
                               eps);                                                              \
    }
FG_ALL_TYPES(FG_LN_BWD)

#define FG_LN_FIN(T, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                              \
        layer_norm_bwd_finalize_##S(const acc_t<T> *part, T *dgamma, T *dbeta, i64 n_parts, i64 d) { \
        fgn::finalize<T, true>(part, dgamma, dbeta, n_parts, d);                                   \
    }
FG_ALL_TYPES(FG_LN_FIN)
