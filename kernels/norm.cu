// norm.cu: the fused norms, LayerNorm and RMSNorm, forward and backward
// (f32, f64, f16, bf16): one core (namespace fgn) instantiated for each,
// CEN = true for LayerNorm (centre by the mean, beta, dbeta), false for
// RMSNorm (mean taken as 0, no beta, no dbeta).
//
// SEMANTICS (ops/norm: mod.rs, cpu.rs, cpu/*.rs, scaled.rs). x is
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
// RMSNorm is the same with mean = 0 and no beta:
//   rstd = 1 / sqrt(sum(x^2) / d + eps),  y = (x * rstd) * gamma
//   dx = rstd * (g - xhat * (sum(g*xhat) / d)),  dgamma as above
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
// rms_norm_fwd(const T *x, const T *gamma, T *y, A *rstd, i64 n_rows, i64 d,
//              int tpr, i64 rows_per_range, double eps)
// rms_norm_bwd(const T *x, const T *dy, const T *gamma, const A *rstd, T *dx,
//              A *part, i64 n_rows, i64 d, int tpr, i64 rows_per_range,
//              double eps)
// rms_norm_bwd_finalize(const A *part, T *dgamma, i64 n_parts, i64 d)
//   As LayerNorm's without mean, beta and dbeta: part holds P*d values (row
//   p = the dgamma terms of range p), finalize's grid is clamp(ceil(d / 32),
//   1, 65535).
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
// LAUNCH ORDER (backward): *_norm_bwd, then *_norm_bwd_finalize on the same
// stream, reading the same part (kept until finalize has run).
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

namespace fgn {

typedef unsigned int u32;
#define FGN_FULL 0xffffffffu

// Tunables. Changing one changes no result bits except NV_FWD / nvb() (they
// feed the host's tpr rule, and tpr fixes the summation order).
constexpr int NV_FWD = 8;        // 16-byte chunks per thread held by the forward
constexpr int RED_GROUPS = 4;    // most groups per block when tpr > 32
constexpr int PF_BYTES = 16384;  // row bytes prefetched into L2 ahead of use
constexpr int PF_MAX_ROWS = 8;   // at most this many rows ahead
constexpr i64 PF_ROW_MAX = 262144;  // longer rows are not prefetched (they
                                    // would evict the row being re-read)
constexpr int BIG_U = 4;         // chunks per thread in flight on the streaming path

// Elements per 16-byte chunk, and the chunks per thread the backward holds
// (x, dy and the dgamma/dbeta terms of its columns, within 128 registers).
template <class T> __host__ __device__ constexpr int vec_of() { return 16 / (int)sizeof(T); }
template <class T> __host__ __device__ constexpr int nvb() { return 2; }

// ---- Finiteness. (IEEE operations one at a time, no FMA contraction, as the
// CPU does: common.cuh's fg_add, fg_sub, fg_mul, fg_div, fg_sqrt.)
__device__ __forceinline__ bool finite_(float a) { return fabsf(a) <= __int_as_float(0x7f7fffff); }
__device__ __forceinline__ bool finite_(double a) {
    return fabs(a) <= __longlong_as_double(0x7fefffffffffffffLL);
}
// Largest rstd the fast path is trusted with (scaled.rs rstd_limit):
// 1/sqrt(MIN_POSITIVE / EPSILON^2) = 2^40 (f32), 2^459 (f64).
__device__ __forceinline__ float rstd_limit(float) { return __int_as_float((127 + 40) << 23); }
__device__ __forceinline__ double rstd_limit(double) {
    return __longlong_as_double((long long)(1023 + 459) << 52);
}
__device__ __forceinline__ float min_normal(float) { return __int_as_float(1 << 23); }
__device__ __forceinline__ double min_normal(double) { return __longlong_as_double(1LL << 52); }

// scaled.rs `trusted`: mean finite and 0 < rstd <= limit (false for NaN).
template <class A> __device__ __forceinline__ bool trusted(A mean, A rstd) {
    return finite_(mean) & (rstd > (A)0) & (rstd <= rstd_limit(rstd));
}

// max that propagates NaN (fmax drops it): used for max|x| and the
// finiteness test of a row in one reduction.
template <class A> __device__ __forceinline__ A nan_max(A a, A b) {
    return (b > a || b != b) ? b : a;
}

// ---- 2^k scaling in f64, exactly as scaled.rs (`pow2`, `scale`, `exponent`).
__device__ __forceinline__ double pow2(int k) {
    return __longlong_as_double((long long)(k + 1023) << 52);
}
// v 2^k in steps of 2^+-1000 as scaled.rs (one multiply for |k| <= 1000).
__device__ __forceinline__ double scale(double v, int k) {
    while (k > 1000) { v = __dmul_rn(v, pow2(1000)); k -= 1000; }
    while (k < -1000) { v = __dmul_rn(v, pow2(-1000)); k += 1000; }
    return __dmul_rn(v, pow2(k));
}
__device__ __forceinline__ int exponent(double m) {
    int lift = 0;
    if (((__double_as_longlong(m) >> 52) & 0x7ff) == 0) { m = __dmul_rn(m, pow2(64)); lift = 64; }
    return (int)((__double_as_longlong(m) >> 52) & 0x7ff) - 1023 - lift;
}

// f64 -> T rounded once to nearest even (T::from_f64): for 16-bit types via
// a round-to-odd float (exact double rounding: float keeps >= 13 more bits).
__device__ __forceinline__ float odd_float(double v) {
    float f = __double2float_rz(v);
    if ((double)f != v && f == f) f = __int_as_float(__float_as_int(f) | 1);
    return f;
}
template <class T> __device__ __forceinline__ T from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ double from_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ f16 from_f64<f16>(double v) { return from_acc<f16>(odd_float(v)); }
template <> __device__ __forceinline__ bf16 from_f64<bf16>(double v) { return from_acc<bf16>(odd_float(v)); }
__device__ __forceinline__ float acc_of(double v, float) { return __double2float_rn(v); }
__device__ __forceinline__ double acc_of(double v, double) { return v; }

// ---- Elements held as raw 32-bit words: a 16-byte chunk is u32[4].
template <class T> struct Raw;
template <> struct Raw<float> {
    static __device__ __forceinline__ float get(const u32 *w, int e) { return __uint_as_float(w[e]); }
    static __device__ __forceinline__ void put(u32 *w, int e, float v) { w[e] = __float_as_uint(v); }
};
template <> struct Raw<double> {
    static __device__ __forceinline__ double get(const u32 *w, int e) {
        return __hiloint2double((int)w[2 * e + 1], (int)w[2 * e]);
    }
    static __device__ __forceinline__ void put(u32 *w, int e, double v) {
        w[2 * e] = (u32)__double2loint(v);
        w[2 * e + 1] = (u32)__double2hiint(v);
    }
};
template <class H> struct Raw16 {
    static __device__ __forceinline__ float get(const u32 *w, int e) {
        H h;
        h.bits = (unsigned short)(w[e >> 1] >> ((e & 1) * 16));
        return to_acc(h);
    }
    static __device__ __forceinline__ void put(u32 *w, int e, H v) {
        const int s = (e & 1) * 16;
        w[e >> 1] = (w[e >> 1] & ~(0xffffu << s)) | ((u32)v.bits << s);
    }
};
template <> struct Raw<f16> : Raw16<f16> {};
template <> struct Raw<bf16> : Raw16<bf16> {};
// Element e of raw words as a T (its bits, unconverted).
template <class T> __device__ __forceinline__ T raw_elem(const u32 *w, int e) {
    if constexpr (sizeof(T) == 2) {
        T v;
        v.bits = (unsigned short)(w[e >> 1] >> ((e & 1) * 16));
        return v;
    } else {
        return (T)Raw<T>::get(w, e);
    }
}

// ---- Which elements of a row a thread owns (lane of a team of tpr).
// Element e (< VEC) of the thread's chunk k is at off + k*kstride + e*estride
// with kstride = VEC*tpr, and exists iff k*VEC + e < lim:
//   chunked (d % VEC == 0): off = lane*VEC, estride = 1, so a chunk is 16
//     contiguous bytes (one vector access when the pointers are aligned);
//   interleaved (other d): off = lane, estride = tpr, so every scalar access
//     of a warp is coalesced.
// It depends only on (d, tpr, lane): so does each thread's summation order.
struct Map {
    i64 d, lim, off, kstride, estride;
    int tpr, lane;
    bool chunked;
};
template <class T> __device__ __forceinline__ i64 eidx(const Map &m, i64 k, int e) {
    return m.off + k * m.kstride + e * m.estride;
}
template <class T> __device__ __forceinline__ bool has(const Map &m, i64 k, int e) {
    return k * vec_of<T>() + e < m.lim;
}
__device__ __forceinline__ bool aligned16(const void *p) { return (((u64)p) & 15) == 0; }

// 16-byte load/store of one chunk.
template <class T> __device__ __forceinline__ void ld16(u32 *w, const T *p) {
    const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
    w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
}
template <class T> __device__ __forceinline__ void st16(T *p, const u32 *w) {
    *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Chunk k of row p into w (absent elements are left as they are); `vec`
// (chunked and every pointer 16-byte aligned) loads it as one vector.
template <class T>
__device__ __forceinline__ void load_chunk(u32 *w, const T *__restrict__ p, const Map &m, i64 k, bool vec) {
    constexpr int VEC = vec_of<T>();
    const T *q = p + m.off + k * m.kstride;
    if (vec) {
        if (k * VEC < m.lim) ld16(w, q);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            if (k * VEC + e < m.lim) Raw<T>::put(w, e, q[e * m.estride]);
    }
}
template <class T>
__device__ __forceinline__ void store_chunk(T *__restrict__ p, const u32 *w, const Map &m, i64 k, bool vec) {
    constexpr int VEC = vec_of<T>();
    T *q = p + m.off + k * m.kstride;
    if (vec) {
        if (k * VEC < m.lim) st16(q, w);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            if (k * VEC + e < m.lim) q[e * m.estride] = raw_elem<T>(w, e);
    }
}
__device__ __forceinline__ void zero4(u32 *w) { w[0] = w[1] = w[2] = w[3] = 0u; }

// Rows ahead to prefetch, and the prefetch of one row's lines into L2 (the
// team splits the 128-byte lines).
__device__ __forceinline__ int pf_rows(i64 row_bytes) {
    if (row_bytes > PF_ROW_MAX) return 0;
    i64 a = (PF_BYTES + row_bytes - 1) / row_bytes;
    return (int)(a < 1 ? 1 : (a > PF_MAX_ROWS ? PF_MAX_ROWS : a));
}
__device__ __forceinline__ void prefetch_row(const void *p, i64 bytes, int lane, int tpr) {
    const u64 end = (u64)p + (u64)bytes;
    for (u64 a = ((u64)p & ~(u64)127) + (u64)lane * 128; a < end; a += (u64)tpr * 128)
#ifndef FG_EMU
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#else
        (void)a;
#endif
}

// ---- Team (the threads of one row) reductions in a fixed order.
// tpr <= 32 (a power of two): xor butterfly inside the aligned lane group.
// tpr > 32 (a multiple of 32): butterfly per warp, one value per warp into
// shared memory, a named barrier for the group's threads only (id 1 + g),
// then every warp butterflies the per-warp values (zero padded to 32).
// Every thread of the team gets the same bits. Two scratch buffers are used
// alternately, so one barrier per reduction suffices: a thread writes a
// buffer again only after passing the next reduction's barrier, which every
// reader of the buffer has reached after its reads.
struct Red {
    double *buf;  // [RED_GROUPS][2 phases][2 values][32]
    int tpr, lane, g, phase;
};
__device__ __forceinline__ void named_bar(int id, int n) {
#ifndef FG_EMU
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
#else
    fg_emu_bar(id, n);
#endif
}
template <class A, int K, bool MAX> __device__ __forceinline__ void team_reduce(A (&v)[K], Red &r) {
    const int top = r.tpr < 32 ? r.tpr : 32;
    for (int o = top >> 1; o > 0; o >>= 1) {
#pragma unroll
        for (int j = 0; j < K; ++j) {
            const A u = __shfl_xor_sync(FGN_FULL, v[j], o);
            v[j] = MAX ? nan_max(v[j], u) : v[j] + u;
        }
    }
    if (r.tpr <= 32) return;
    double *s = r.buf + (r.g * 2 + r.phase) * 64;
    r.phase ^= 1;
    const int l = r.lane & 31, w = r.lane >> 5, nw = r.tpr >> 5;
    if (l == 0) {
#pragma unroll
        for (int j = 0; j < K; ++j) s[j * 32 + w] = (double)v[j];
    }
    named_bar(1 + r.g, r.tpr);
#pragma unroll
    for (int j = 0; j < K; ++j) v[j] = l < nw ? (A)s[j * 32 + l] : (A)0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int j = 0; j < K; ++j) {
            const A u = __shfl_xor_sync(FGN_FULL, v[j], o);
            v[j] = MAX ? nan_max(v[j], u) : v[j] + u;
        }
    }
}
template <class A> __device__ __forceinline__ A team_sum(A v, Red &r) {
    A a[1] = {v};
    team_reduce<A, 1, false>(a, r);
    return a[0];
}

// ---- The scaled fallback (scaled.rs RowNorm): xhat = (x 2^kx - shift) r,
// rstd = r 2^kout, all in f64. `sum_over(f)` is the team sum of f(x) over the
// row's elements (x widened to f64 exactly).
struct RowNorm {
    int kx, kout;
    double shift, r;
    __device__ __forceinline__ double xhat(double v) const {
        return __dmul_rn(__dsub_rn(scale(v, kx), shift), r);
    }
    __device__ __forceinline__ double mean() const { return scale(shift, -kx); }
    __device__ __forceinline__ double rstd() const { return scale(r, kout); }
};
template <bool CEN, class SumF>
__device__ __forceinline__ RowNorm row_norm(SumF sum_over, double x0, double amax, double d, double eps) {
    const int k = (amax > 0.0 && finite_(amax)) ? -exponent(amax) : 0;
    const double z0 = scale(x0, k);
    double mean_z = 0.0;
    if (CEN) mean_z = __dadd_rn(z0, __ddiv_rn(sum_over([&](double v) { return __dsub_rn(scale(v, k), z0); }), d));
    const double var_z = __ddiv_rn(sum_over([&](double v) {
                                       const double e = __dsub_rn(scale(v, k), mean_z);
                                       return __dmul_rn(e, e);
                                   }),
                                   d);
    const double eps_z = scale(eps, 2 * k);
    RowNorm rn;
    if (finite_(eps_z) && var_z > 0.0) {
        rn.kx = k; rn.shift = mean_z; rn.kout = k;
        rn.r = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var_z, eps_z)));
    } else {
        // eps dwarfs var (or the row is constant): unscaled.
        rn.kx = 0; rn.shift = scale(mean_z, -k); rn.kout = 0;
        rn.r = __ddiv_rn(1.0, __dsqrt_rn(eps));
    }
    return rn;
}

// The slow paths are plain loops (not unrolled: they are rare, registers are
// not) that read the row again from global memory (L1/L2), one element per
// thread at a time (j = lane + i*tpr). Every lane of a warp enters (after a
// vote); `active` says whether this group's row is out of range. They begin
// and end with the group's barrier, so their use of the reduction scratch
// never meets the caller's.
struct FwdSlow {
    bool scaled;
    double mean, rstd;
};
// Writes y for the group's row (if `valid`): from the scaled fallback where
// `active` and the row is finite, else from (mean, rstd) with the fast
// path's formula, element j = lane + i*tpr (the formula is per element, so
// the bits do not depend on which thread computes it).
template <class T, bool CEN>
__device__ __forceinline__ FwdSlow fwd_slow(const T *__restrict__ xr, const T *__restrict__ gamma,
                                            const T *__restrict__ beta, T *__restrict__ yr, i64 d, double eps,
                                            bool active, bool valid, acc_t<T> mean, acc_t<T> rstd, double *buf,
                                            int tpr, int lane, int g) {
    typedef acc_t<T> A;
    Red r;
    r.buf = buf; r.tpr = tpr; r.lane = lane; r.g = g; r.phase = 0;
    if (tpr > 32) named_bar(1 + g, tpr);
    const i64 dn = active ? d : 0;
    A am[1] = {0};
#pragma unroll 1
    for (i64 j = lane; j < dn; j += tpr) am[0] = nan_max(am[0], fg_abs(to_acc(xr[j])));
    team_reduce<A, 1, true>(am, r);
    // Only rows with every value finite are rescued; NaN/inf propagate.
    const bool sc = active && finite_(am[0]);
    FwdSlow o;
    o.scaled = false;
    o.mean = o.rstd = 0.0;
    RowNorm rn;
    rn.kx = rn.kout = 0;
    rn.shift = 0.0;
    rn.r = 1.0;
    if (__any_sync(FGN_FULL, sc)) {
        auto sum_over = [&](auto f) -> double {
            double s = 0.0;
#pragma unroll 1
            for (i64 j = lane; j < dn; j += tpr) s = __dadd_rn(s, f((double)to_acc(xr[j])));
            return team_sum(s, r);
        };
        const double x0 = active ? (double)to_acc(xr[0]) : 0.0;
        rn = row_norm<CEN>(sum_over, x0, (double)am[0], (double)d, eps);
        if (sc) {
            o.scaled = true;
            o.mean = rn.mean();
            o.rstd = rn.rstd();
        }
    }
    const i64 dv = valid ? d : 0;
#pragma unroll 1
    for (i64 j = lane; j < dv; j += tpr) {
        const A v = to_acc(xr[j]);
        if (sc) {
            // scaled.rs forward_rows: absent gamma is 1.0, absent beta 0.0.
            const double gd = gamma ? (double)to_acc(gamma[j]) : 1.0;
            const double bd = (CEN && beta) ? (double)to_acc(beta[j]) : 0.0;
            yr[j] = from_f64<T>(__dadd_rn(__dmul_rn(rn.xhat((double)v), gd), bd));
        } else {
            A t = CEN ? fg_mul(fg_sub(v, mean), rstd) : fg_mul(v, rstd);
            if (gamma) t = fg_mul(t, to_acc(gamma[j]));
            if (CEN && beta) t = fg_add(t, to_acc(beta[j]));
            yr[j] = from_acc<T>(t);
        }
    }
    if (tpr > 32) named_bar(1 + g, tpr);
    return o;
}

struct BwdSlow {
    bool scaled;
    RowNorm rn;
    double mgd, mgxd;  // <g>, <g xhat> in f64 (mgd 0 for RMSNorm)
};
template <class T, bool CEN>
__device__ __forceinline__ BwdSlow bwd_slow(const T *__restrict__ xr, const T *__restrict__ dr,
                                         const T *__restrict__ gamma, i64 d, double eps, bool active,
                                         double *buf, int tpr, int lane, int g) {
    typedef acc_t<T> A;
    Red r;
    r.buf = buf; r.tpr = tpr; r.lane = lane; r.g = g; r.phase = 0;
    if (tpr > 32) named_bar(1 + g, tpr);
    const i64 dn = active ? d : 0;
    A am[1] = {0};
#pragma unroll 1
    for (i64 j = lane; j < dn; j += tpr) am[0] = nan_max(am[0], fg_abs(to_acc(xr[j])));
    team_reduce<A, 1, true>(am, r);
    const bool sc = active && finite_(am[0]);
    BwdSlow o;
    o.scaled = false;
    o.mgd = o.mgxd = 0.0;
    o.rn.kx = o.rn.kout = 0;
    o.rn.shift = 0.0;
    o.rn.r = 1.0;
    if (__any_sync(FGN_FULL, sc)) {
        auto sum_over = [&](auto f) -> double {
            double s = 0.0;
#pragma unroll 1
            for (i64 j = lane; j < dn; j += tpr) s = __dadd_rn(s, f((double)to_acc(xr[j])));
            return team_sum(s, r);
        };
        const double x0 = active ? (double)to_acc(xr[0]) : 0.0;
        const RowNorm rn = row_norm<CEN>(sum_over, x0, (double)am[0], (double)d, eps);
        double s[2] = {0.0, 0.0};
#pragma unroll 1
        for (i64 j = lane; j < dn; j += tpr) {
            const double gd = gamma ? (double)to_acc(gamma[j]) : 1.0;
            const double h = rn.xhat((double)to_acc(xr[j]));
            const double gg = __dmul_rn((double)to_acc(dr[j]), gd);
            s[0] = __dadd_rn(s[0], gg);
            s[1] = __dadd_rn(s[1], __dmul_rn(gg, h));
        }
        team_reduce<double, 2, false>(s, r);
        if (sc) {
            const double inv_d = __ddiv_rn(1.0, (double)d);
            o.scaled = true;
            o.rn = rn;
            o.mgd = CEN ? __dmul_rn(s[0], inv_d) : 0.0;
            o.mgxd = __dmul_rn(s[1], inv_d);
        }
    }
    if (tpr > 32) named_bar(1 + g, tpr);
    return o;
}

// ---- Per-kernel setup shared by forward and backward.
struct Geo {
    Map m;
    Red r;
    int G;      // groups (rows in flight) per block
    i64 P;      // ranges of rows_per_range rows
    i64 K;      // chunks per thread on the streaming path
    int ahead;  // rows prefetched ahead (held path)
};
template <class T>
__device__ __forceinline__ Geo setup(double *red, i64 n, i64 d, int tpr, i64 rpr) {
    constexpr int VEC = vec_of<T>();
    Geo g;
    g.r.buf = red;
    g.r.tpr = tpr;
    g.r.lane = (int)(threadIdx.x % (unsigned)tpr);
    g.r.g = (int)(threadIdx.x / (unsigned)tpr);
    g.r.phase = 0;
    g.m.d = d;
    g.m.tpr = tpr;
    g.m.lane = g.r.lane;
    g.m.chunked = (d % VEC) == 0;
    {
        const i64 units = g.m.chunked ? d / VEC : d;  // chunks or elements of the row
        const i64 mine = units > g.r.lane ? (units - g.r.lane + tpr - 1) / tpr : 0;
        g.m.lim = g.m.chunked ? mine * VEC : mine;
        g.m.off = g.m.chunked ? (i64)g.r.lane * VEC : (i64)g.r.lane;
        g.m.kstride = (i64)VEC * tpr;
        g.m.estride = g.m.chunked ? 1 : tpr;
    }
    g.G = (int)(blockDim.x / (unsigned)tpr);
    g.P = (n + rpr - 1) / rpr;
    const i64 c = (d + VEC - 1) / VEC;
    g.K = (c + tpr - 1) / tpr;
    g.ahead = pf_rows(d * (i64)sizeof(T));
    return g;
}

// L2 prefetch for the `i`-th row of a range: at the range's first row the
// next `ahead` rows, later the row `ahead` on; never past the range.
__device__ __forceinline__ void prefetch_ahead(const void *base, i64 row_bytes, i64 row, i64 i, i64 rpr,
                                               i64 n, const Geo &g) {
    const char *b = (const char *)base;
    if (g.ahead == 0) return;
    for (int a = (i == 0 ? 1 : g.ahead); a <= g.ahead; ++a) {
        if (i + a < rpr && row + a < n) prefetch_row(b + (row + a) * row_bytes, row_bytes, g.m.lane, g.m.tpr);
    }
}

// Streams the thread's chunks of a row (two rows: stream2), BIG_U loads in
// flight: f(k, w...) for each chunk k < kn, in order.
template <class T, class F, int U = BIG_U>
__device__ __forceinline__ void stream1(const T *__restrict__ p, const Map &m, i64 kn, bool vec, F f) {
    for (i64 k0 = 0; k0 < kn; k0 += U) {
        u32 w[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            zero4(w[u]);
            if (k0 + u < kn) load_chunk<T>(w[u], p, m, k0 + u, vec);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (k0 + u < kn) f(k0 + u, w[u]);
    }
}
template <class T, class F, int U = BIG_U / 2>
__device__ __forceinline__ void stream2(const T *__restrict__ p, const T *__restrict__ q, const Map &m, i64 kn,
                                        bool vec, F f) {
    for (i64 k0 = 0; k0 < kn; k0 += U) {
        u32 a[U][4], b[U][4];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            zero4(a[u]);
            zero4(b[u]);
            if (k0 + u < kn) {
                load_chunk<T>(a[u], p, m, k0 + u, vec);
                load_chunk<T>(b[u], q, m, k0 + u, vec);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (k0 + u < kn) f(k0 + u, a[u], b[u]);
    }
}

// ===========================================================================
// Forward
// ===========================================================================

// Per-thread partial sums of one chunk: sum (x - x0), and sum c^2 with
// c = x - mean (LayerNorm) or x (RMSNorm).
template <class T>
__device__ __forceinline__ acc_t<T> chunk_shift_sum(const u32 *w, const Map &m, i64 k, acc_t<T> x0, acc_t<T> s) {
    constexpr int VEC = vec_of<T>();
#pragma unroll
    for (int e = 0; e < VEC; ++e)
        if (has<T>(m, k, e)) s = fg_add(s, fg_sub(Raw<T>::get(w, e), x0));
    return s;
}
template <class T, bool CEN>
__device__ __forceinline__ acc_t<T> chunk_sq_sum(const u32 *w, const Map &m, i64 k, acc_t<T> mean, acc_t<T> q) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
#pragma unroll
    for (int e = 0; e < VEC; ++e)
        if (has<T>(m, k, e)) {
            const A c = CEN ? fg_sub(Raw<T>::get(w, e), mean) : Raw<T>::get(w, e);
            q = fg_add(q, fg_mul(c, c));
        }
    return q;
}

// y for one chunk: ((x - mean) rstd) gamma + beta, each step rounded, as the
// CPU (absent gamma/beta are skipped: x*1 and x + -0 are exact).
template <class T, bool CEN>
__device__ __forceinline__ void fwd_out_chunk(T *__restrict__ yr, const T *__restrict__ gamma,
                                              const T *__restrict__ beta, const Map &m, i64 k, bool vec,
                                              const u32 *w, acc_t<T> mean, acc_t<T> rstd) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
    u32 gw[4], bw[4], ow[4];
    zero4(gw); zero4(bw); zero4(ow);
    if (gamma) load_chunk<T>(gw, gamma, m, k, vec);
    if (CEN && beta) load_chunk<T>(bw, beta, m, k, vec);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        if (has<T>(m, k, e)) {
            const A v = Raw<T>::get(w, e);
            A t = CEN ? fg_mul(fg_sub(v, mean), rstd) : fg_mul(v, rstd);
            if (gamma) t = fg_mul(t, Raw<T>::get(gw, e));
            if (CEN && beta) t = fg_add(t, Raw<T>::get(bw, e));
            Raw<T>::put(ow, e, from_acc<T>(t));
        }
    }
    store_chunk<T>(yr, ow, m, k, vec);
}

// A row whose statistics are out of the trusted range (any in the warp: the
// vote keeps every lane in the reductions) goes through fwd_slow, which
// writes y for every valid row of the warp; the scaled rows' statistics
// replace mean and rstd.
template <class T, bool CEN>
__device__ __forceinline__ void fwd_slow_stats(const T *xr, const T *gamma, const T *beta, T *yr, bool slow,
                                               bool valid, double eps_d, acc_t<T> &mean, acc_t<T> &rstd,
                                               Geo &g) {
    const FwdSlow o = fwd_slow<T, CEN>(xr, gamma, beta, yr, g.m.d, eps_d, slow, valid, mean, rstd, g.r.buf,
                                       g.r.tpr, g.r.lane, g.r.g);
    if (o.scaled) {
        mean = acc_of(o.mean, mean);
        rstd = acc_of(o.rstd, rstd);
    }
}

// y for one held chunk (16-byte aligned): ((x - mean) rstd) gamma + beta.
template <class T, bool CEN>
__device__ __forceinline__ void fwd_out16(T *yp, const T *gp, const T *bp, const u32 *w, acc_t<T> mean,
                                          acc_t<T> rstd) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
    u32 gw[4], bw[4], ow[4];
    if (gp) ld16(gw, gp);
    if (CEN && bp) ld16(bw, bp);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const A v = Raw<T>::get(w, e);
        A t = CEN ? fg_mul(fg_sub(v, mean), rstd) : fg_mul(v, rstd);
        if (gp) t = fg_mul(t, Raw<T>::get(gw, e));
        if (CEN && bp) t = fg_add(t, Raw<T>::get(bw, e));
        Raw<T>::put(ow, e, from_acc<T>(t));
    }
    st16(yp, ow);
}

// One row held in registers (aligned, d % VEC == 0, d <= NV_FWD*VEC*tpr):
// x is read from global memory once. Chunk k of the thread is elements
// (k*tpr + lane)*VEC .. +VEC, present for k < nk.
template <class T, bool CEN>
__device__ __forceinline__ void fwd_row_held(const T *__restrict__ x, const T *__restrict__ gamma,
                                             const T *__restrict__ beta, T *__restrict__ y,
                                             acc_t<T> *__restrict__ mean_out, acc_t<T> *__restrict__ rstd_out,
                                             i64 row, bool valid, acc_t<T> eps, Geo &g) {
    typedef acc_t<T> A;
    constexpr int NV = NV_FWD, VEC = vec_of<T>();
    const i64 d = g.m.d;
    const int nk = valid ? (int)(g.m.lim / VEC) : 0;
    const int off = g.m.lane * VEC, stride = g.m.tpr * VEC;
    const T *xr = x + row * d;
    u32 w[NV][4];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        if (k < nk) ld16(w[k], xr + off + k * stride);
        else zero4(w[k]);
    }
    A mean = 0;
    if (CEN) {
        const A x0 = valid ? to_acc(xr[0]) : (A)0;
        A s = 0;
#pragma unroll
        for (int k = 0; k < NV; ++k)
            if (k < nk) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s = fg_add(s, fg_sub(Raw<T>::get(w[k], e), x0));
            }
        mean = fg_add(x0, fg_div(team_sum(s, g.r), (A)d));
    }
    A q = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (k < nk) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A c = CEN ? fg_sub(Raw<T>::get(w[k], e), mean) : Raw<T>::get(w[k], e);
                q = fg_add(q, fg_mul(c, c));
            }
        }
    A rstd = fg_div((A)1, fg_sqrt(fg_add(fg_div(team_sum(q, g.r), (A)d), eps)));
    T *yr = y + row * d;
    const bool slow = valid && !trusted(mean, rstd);
    if (__any_sync(FGN_FULL, slow)) {
        fwd_slow_stats<T, CEN>(xr, gamma, beta, yr, slow, valid, (double)eps, mean, rstd, g);
    } else if (valid) {
#pragma unroll
        for (int k = 0; k < NV; ++k)
            if (k < nk) {
                const int o = off + k * stride;
                fwd_out16<T, CEN>(yr + o, gamma ? gamma + o : nullptr, beta ? beta + o : nullptr, w[k], mean, rstd);
            }
    }
    if (valid && g.m.lane == 0) {
        if (CEN) mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

// One row on the streaming path: each pass reads it again (from L1/L2 while
// the row fits there). Same per-thread element order as the held path.
template <class T, bool CEN>
__device__ __forceinline__ void fwd_row_big(const T *__restrict__ x, const T *__restrict__ gamma,
                                            const T *__restrict__ beta, T *__restrict__ y,
                                            acc_t<T> *__restrict__ mean_out, acc_t<T> *__restrict__ rstd_out,
                                            i64 row, bool valid, acc_t<T> eps, bool vec, Geo &g) {
    typedef acc_t<T> A;
    const Map &m = g.m;
    const i64 d = m.d, kn = valid ? g.K : 0;
    const T *xr = x + row * d;
    A mean = 0;
    if (CEN) {
        const A x0 = valid ? to_acc(xr[0]) : (A)0;
        A s = 0;
        stream1<T>(xr, m, kn, vec, [&](i64 k, const u32 *w) { s = chunk_shift_sum<T>(w, m, k, x0, s); });
        mean = fg_add(x0, fg_div(team_sum(s, g.r), (A)d));
    }
    A q = 0;
    stream1<T>(xr, m, kn, vec, [&](i64 k, const u32 *w) { q = chunk_sq_sum<T, CEN>(w, m, k, mean, q); });
    A rstd = fg_div((A)1, fg_sqrt(fg_add(fg_div(team_sum(q, g.r), (A)d), eps)));
    T *yr = y + row * d;
    const bool slow = valid && !trusted(mean, rstd);
    if (__any_sync(FGN_FULL, slow)) {
        fwd_slow_stats<T, CEN>(xr, gamma, beta, yr, slow, valid, (double)eps, mean, rstd, g);
    } else if (valid) {
        stream1<T>(xr, m, kn, vec,
                   [&](i64 k, const u32 *w) { fwd_out_chunk<T, CEN>(yr, gamma, beta, m, k, vec, w, mean, rstd); });
    }
    if (valid && m.lane == 0) {
        if (CEN) mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

// The rows of this block's groups: group q = b*G + g of block b takes the
// range of rows [q*rpr, (q+1)*rpr), blocks striding over ranges.
#define FGN_ROWS(...)                                                      \
    for (i64 rb = blockIdx.x; rb * g.G < g.P; rb += gridDim.x) {           \
        const i64 first = (rb * g.G + g.r.g) * rpr;                        \
        for (i64 i = 0; i < rpr; ++i) {                                    \
            const i64 row = first + i;                                     \
            const bool valid = row < n;                                    \
            __VA_ARGS__                                                    \
        }                                                                  \
    }

// The streaming forward: out of line, so that its registers are allocated
// apart from the held path's (one call per thread).
template <class T, bool CEN>
__device__ __noinline__ void forward_stream(const T *__restrict__ x, const T *__restrict__ gamma,
                                            const T *__restrict__ beta, T *__restrict__ y,
                                            acc_t<T> *__restrict__ mean_out, acc_t<T> *__restrict__ rstd_out,
                                            i64 n, i64 d, int tpr, i64 rpr, acc_t<T> eps, bool vec, double *red) {
    Geo g = setup<T>(red, n, d, tpr, rpr);
    const i64 row_bytes = d * (i64)sizeof(T);
    FGN_ROWS(if (valid) prefetch_ahead(x, row_bytes, row, i, rpr, n, g);
             fwd_row_big<T, CEN>(x, gamma, beta, y, mean_out, rstd_out, row, valid, eps, vec, g);)
}

template <class T, bool CEN>
__device__ __forceinline__ void forward(const T *__restrict__ x, const T *__restrict__ gamma,
                                        const T *__restrict__ beta, T *__restrict__ y,
                                        acc_t<T> *__restrict__ mean_out, acc_t<T> *__restrict__ rstd_out, i64 n,
                                        i64 d, int tpr, i64 rpr, double eps_in) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
    __shared__ double red[RED_GROUPS * 2 * 64];
    const A eps = (A)eps_in;
    const bool vec = d % VEC == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) && aligned16(beta);
    if (!(vec && (i64)NV_FWD * VEC * tpr >= d)) {
        forward_stream<T, CEN>(x, gamma, beta, y, mean_out, rstd_out, n, d, tpr, rpr, eps, vec, red);
        return;
    }
    Geo g = setup<T>(red, n, d, tpr, rpr);
    const i64 row_bytes = d * (i64)sizeof(T);
    FGN_ROWS(if (valid) prefetch_ahead(x, row_bytes, row, i, rpr, n, g);
             fwd_row_held<T, CEN>(x, gamma, beta, y, mean_out, rstd_out, row, valid, eps, g);)
}

// ===========================================================================
// Backward
// ===========================================================================

// A backward row's constants: saved statistics, the means <g> and <g xhat>,
// and, when the row takes the scaled path, its f64 normalization.
template <class A> struct BwdRow {
    A m, rs, mg, mgx;
    BwdSlow s;
};

// Fast-path sums of one chunk's present elements (e < ne): s1 += g,
// s2 += g xhat, with g = dy gamma (dy alone without gamma).
template <class T, bool CEN>
__device__ __forceinline__ void bwd_sums16(const u32 *xw, const u32 *dw, const u32 *gw, bool has_g, acc_t<T> mm,
                                           acc_t<T> rs, acc_t<T> &s1, acc_t<T> &s2, int ne = vec_of<T>()) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        if (e < ne) {
            const A xv = Raw<T>::get(xw, e), dv = Raw<T>::get(dw, e);
            const A xh = CEN ? fg_mul(fg_sub(xv, mm), rs) : fg_mul(xv, rs);
            const A gg = has_g ? fg_mul(dv, Raw<T>::get(gw, e)) : dv;
            if (CEN) s1 = fg_add(s1, gg);
            s2 = fg_add(s2, fg_mul(gg, xh));
        }
    }
}

// Output terms of one chunk's present elements (e < ne): dx into ow and the
// partial terms add_part(e, dy xhat, dy).
template <class T, bool CEN, class PG>
__device__ __forceinline__ void bwd_out16(u32 *ow, const u32 *xw, const u32 *dw, const u32 *gw, bool has_g,
                                          const BwdRow<acc_t<T>> &b, PG add_part, int ne = vec_of<T>()) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>();
    if (!b.s.scaled) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            if (e < ne) {
                const A xv = Raw<T>::get(xw, e), dv = Raw<T>::get(dw, e);
                const A xh = CEN ? fg_mul(fg_sub(xv, b.m), b.rs) : fg_mul(xv, b.rs);
                const A gg = has_g ? fg_mul(dv, Raw<T>::get(gw, e)) : dv;
                // CPU order: r * (g - <g> - xhat <g xhat>), no <g> for RMSNorm.
                const A t = CEN ? fg_sub(fg_sub(gg, b.mg), fg_mul(xh, b.mgx)) : fg_sub(gg, fg_mul(xh, b.mgx));
                Raw<T>::put(ow, e, from_acc<T>(fg_mul(b.rs, t)));
                add_part(e, fg_mul(dv, xh), dv);
            }
        }
    } else {
        // scaled.rs backward: 2^kout (r (g - <g> - xhat <g xhat>)) in f64.
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            if (e < ne) {
                const A xv = Raw<T>::get(xw, e), dv = Raw<T>::get(dw, e);
                const double gd = has_g ? (double)Raw<T>::get(gw, e) : 1.0;
                const double h = b.s.rn.xhat((double)xv), dd = (double)dv, gg = __dmul_rn(dd, gd);
                const double t = __dmul_rn(b.s.rn.r, __dsub_rn(__dsub_rn(gg, b.s.mgd), __dmul_rn(h, b.s.mgxd)));
                Raw<T>::put(ow, e, from_f64<T>(scale(t, b.s.rn.kout)));
                add_part(e, acc_of(__dmul_rn(dd, h), xv), dv);
            }
        }
    }
}

// The streaming path's chunk k (any mapping, any alignment): number of its
// elements present (all VEC or none when chunked).
template <class T> __device__ __forceinline__ int present(const Map &m, i64 k) {
    constexpr int VEC = vec_of<T>();
    const i64 r = m.lim - k * VEC;
    return r >= VEC ? VEC : (r > 0 ? (int)r : 0);
}

// After pass A (s1 = sum g, s2 = sum g xhat over the team): the means, and
// the scaled fallback where the saved statistics are out of the range the
// fast path is exact in (also rstd subnormal) or the sums overflowed, and
// the row of x is finite.
template <class T, bool CEN>
__device__ __forceinline__ bool bwd_decide(BwdRow<acc_t<T>> &b, acc_t<T> s1, acc_t<T> s2, const T *xr,
                                           const T *dr, const T *gamma, bool valid, double eps, Geo &g) {
    typedef acc_t<T> A;
    if (CEN) {
        const A inv_d = fg_div((A)1, (A)g.m.d);
        b.mg = fg_mul(s1, inv_d);
        b.mgx = fg_mul(s2, inv_d);
    } else {
        b.mg = 0;
        b.mgx = fg_div(s2, (A)g.m.d);
    }
    b.s.scaled = false;
    const bool ok = finite_(b.m) && b.rs >= min_normal(b.rs) && b.rs <= rstd_limit(b.rs) && finite_(s1) &&
                    finite_(s2);
    return valid && !ok;
}

// One row held in registers (aligned, d % VEC == 0, d <= nvb*VEC*tpr); pg/pb
// are this thread's partial accumulators for its columns.
template <class T, bool CEN>
__device__ __forceinline__ void bwd_row_held(const T *__restrict__ x, const T *__restrict__ dy,
                                             const T *__restrict__ gamma, const acc_t<T> *__restrict__ mean_in,
                                             const acc_t<T> *__restrict__ rstd_in, T *__restrict__ dx, bool want_p,
                                             i64 row, bool valid, double eps, Geo &g,
                                             acc_t<T> (&pg)[nvb<T>()][vec_of<T>()],
                                             acc_t<T> (&pb)[nvb<T>()][vec_of<T>()]) {
    typedef acc_t<T> A;
    constexpr int NV = nvb<T>(), VEC = vec_of<T>();
    const i64 d = g.m.d;
    const int nk = valid ? (int)(g.m.lim / VEC) : 0;
    const int off = g.m.lane * VEC, stride = g.m.tpr * VEC;
    const T *xr = x + row * d, *dr = dy + row * d;
    u32 xw[NV][4], dw[NV][4];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        if (k < nk) {
            ld16(xw[k], xr + off + k * stride);
            ld16(dw[k], dr + off + k * stride);
        } else {
            zero4(xw[k]);
            zero4(dw[k]);
        }
    }
    BwdRow<A> b;
    b.m = (CEN && valid) ? mean_in[row] : (A)0;
    b.rs = valid ? rstd_in[row] : (A)1;
    A s[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < NV; ++k)
        if (k < nk) {
            u32 gw[4];
            zero4(gw);
            if (gamma) ld16(gw, gamma + off + k * stride);
            bwd_sums16<T, CEN>(xw[k], dw[k], gw, gamma != nullptr, b.m, b.rs, s[0], s[1]);
        }
    team_reduce<A, 2, false>(s, g.r);
    const bool slow = bwd_decide<T, CEN>(b, s[0], s[1], xr, dr, gamma, valid, eps, g);
    T *dxr = dx + row * d;
    auto add_part = [&](int k, int e, A tg, A tb) {
        if (want_p) {
            pg[k][e] = fg_add(pg[k][e], tg);
            if (CEN) pb[k][e] = fg_add(pb[k][e], tb);
        }
    };
    if (__any_sync(FGN_FULL, slow)) {
        // The slow path, then pass B from global memory again (L1/L2), so
        // that the registers holding the row are free meanwhile.
        b.s = bwd_slow<T, CEN>(xr, dr, gamma, d, eps, slow, g.r.buf, g.r.tpr, g.r.lane, g.r.g);
#pragma unroll
        for (int k = 0; k < NV; ++k)
            if (k < nk) {
                const int o = off + k * stride;
                u32 xv[4], dv[4], gw[4], ow[4];
                zero4(gw);
                ld16(xv, xr + o);
                ld16(dv, dr + o);
                if (gamma) ld16(gw, gamma + o);
                bwd_out16<T, CEN>(ow, xv, dv, gw, gamma != nullptr, b,
                                  [&](int e, A tg, A tb) { add_part(k, e, tg, tb); });
                if (dx) st16(dxr + o, ow);
                // One chunk at a time here (a compiler-only barrier): the
                // slow path is rare, registers are not.
                asm volatile("" ::: "memory");
            }
    } else {
#pragma unroll
        for (int k = 0; k < NV; ++k)
            if (k < nk) {
                const int o = off + k * stride;
                u32 gw[4], ow[4];
                zero4(gw);
                if (gamma) ld16(gw, gamma + o);
                bwd_out16<T, CEN>(ow, xw[k], dw[k], gw, gamma != nullptr, b,
                                  [&](int e, A tg, A tb) { add_part(k, e, tg, tb); });
                if (dx) st16(dxr + o, ow);
            }
    }
}

// One row on the streaming path: pass A, the decision, then pass B reading x
// and dy again, which adds the terms straight into the range's partial row
// in global memory (from 0 at the range's first row).
template <class T, bool CEN>
__device__ __forceinline__ void bwd_row_big(const T *__restrict__ x, const T *__restrict__ dy,
                                            const T *__restrict__ gamma, const acc_t<T> *__restrict__ mean_in,
                                            const acc_t<T> *__restrict__ rstd_in, T *__restrict__ dx,
                                            acc_t<T> *__restrict__ prow, bool first, i64 row, bool valid,
                                            double eps, bool vec, Geo &g) {
    typedef acc_t<T> A;
    const Map &m = g.m;
    const i64 d = m.d, kn = valid ? g.K : 0;
    const T *xr = x + row * d, *dr = dy + row * d;
    BwdRow<A> b;
    b.m = (CEN && valid) ? mean_in[row] : (A)0;
    b.rs = valid ? rstd_in[row] : (A)1;
    A s[2] = {0, 0};
    stream2<T>(xr, dr, m, kn, vec, [&](i64 k, const u32 *xw, const u32 *dw) {
        u32 gw[4];
        zero4(gw);
        if (gamma) load_chunk<T>(gw, gamma, m, k, vec);
        bwd_sums16<T, CEN>(xw, dw, gw, gamma != nullptr, b.m, b.rs, s[0], s[1], present<T>(m, k));
    });
    team_reduce<A, 2, false>(s, g.r);
    const bool slow = bwd_decide<T, CEN>(b, s[0], s[1], xr, dr, gamma, valid, eps, g);
    if (__any_sync(FGN_FULL, slow))
        b.s = bwd_slow<T, CEN>(xr, dr, gamma, d, eps, slow, g.r.buf, g.r.tpr, g.r.lane, g.r.g);
    if (!valid) return;
    T *dxr = dx + row * d;
    stream2<T>(xr, dr, m, kn, vec, [&](i64 k, const u32 *xw, const u32 *dw) {
        u32 gw[4], ow[4];
        zero4(gw);
        zero4(ow);
        if (gamma) load_chunk<T>(gw, gamma, m, k, vec);
        bwd_out16<T, CEN>(ow, xw, dw, gw, gamma != nullptr, b, [&](int e, A tg, A tb) {
            if (prow) {
                const i64 j = eidx<T>(m, k, e);
                // From 0 at the range's first row, as the held path's registers.
                prow[j] = fg_add(first ? (A)0 : prow[j], tg);
                if (CEN) prow[d + j] = fg_add(first ? (A)0 : prow[d + j], tb);
            }
        }, present<T>(m, k));
        if (dx) store_chunk<T>(dxr, ow, m, k, vec);
    });
}

// The streaming backward: out of line like forward_stream. Group q's
// partial row is part + q*W, filled row by row (stored at the range's first
// row).
template <class T, bool CEN>
__device__ __noinline__ void backward_stream(const T *__restrict__ x, const T *__restrict__ dy,
                                             const T *__restrict__ gamma, const acc_t<T> *__restrict__ mean_in,
                                             const acc_t<T> *__restrict__ rstd_in, T *__restrict__ dx,
                                             acc_t<T> *__restrict__ part, i64 n, i64 d, int tpr, i64 rpr,
                                             double eps, bool vec, double *red) {
    Geo g = setup<T>(red, n, d, tpr, rpr);
    const i64 W = CEN ? 2 * d : d;
    const i64 row_bytes = d * (i64)sizeof(T);
    FGN_ROWS(const i64 r = rb * g.G + g.r.g; if (valid) {
                 prefetch_ahead(x, row_bytes, row, i, rpr, n, g);
                 prefetch_ahead(dy, row_bytes, row, i, rpr, n, g);
             }
             bwd_row_big<T, CEN>(x, dy, gamma, mean_in, rstd_in, dx, (part && r < g.P) ? part + r * W : nullptr,
                                 i == 0, row, valid, eps, vec, g);)
}

template <class T, bool CEN>
__device__ __forceinline__ void backward(const T *__restrict__ x, const T *__restrict__ dy,
                                         const T *__restrict__ gamma, const acc_t<T> *__restrict__ mean_in,
                                         const acc_t<T> *__restrict__ rstd_in, T *__restrict__ dx,
                                         acc_t<T> *__restrict__ part, i64 n, i64 d, int tpr, i64 rpr,
                                         double eps_in) {
    typedef acc_t<T> A;
    constexpr int VEC = vec_of<T>(), NV = nvb<T>();
    __shared__ double red[RED_GROUPS * 2 * 64];
    // eps as the CPU's scaled path sees it: the acc_t value, widened.
    const double eps = (double)(A)eps_in;
    const bool vec = d % VEC == 0 && aligned16(x) && aligned16(dy) && aligned16(gamma) && aligned16(dx);
    if (!(vec && (i64)NV * VEC * tpr >= d)) {
        backward_stream<T, CEN>(x, dy, gamma, mean_in, rstd_in, dx, part, n, d, tpr, rpr, eps, vec, red);
        return;
    }
    Geo g = setup<T>(red, n, d, tpr, rpr);
    const bool want_p = part != nullptr;
    const i64 W = CEN ? 2 * d : d;
    const i64 row_bytes = d * (i64)sizeof(T);
    for (i64 rb = blockIdx.x; rb * g.G < g.P; rb += gridDim.x) {
        const i64 r = rb * g.G + g.r.g;  // this group's range (and partial row)
        const i64 first = r * rpr;
        A pg[NV][VEC], pb[NV][VEC];
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int e = 0; e < VEC; ++e) pg[k][e] = pb[k][e] = 0;
        for (i64 i = 0; i < rpr; ++i) {
            const i64 row = first + i;
            const bool valid = row < n;
            if (valid) {
                prefetch_ahead(x, row_bytes, row, i, rpr, n, g);
                prefetch_ahead(dy, row_bytes, row, i, rpr, n, g);
            }
            bwd_row_held<T, CEN>(x, dy, gamma, mean_in, rstd_in, dx, want_p, row, valid, eps, g, pg, pb);
        }
        if (want_p && r < g.P) {
            // The group's partial row: its columns, in the held layout.
            A *prow = part + r * W + (i64)g.r.lane * VEC;
            const int nk = (int)(g.m.lim / VEC);
#pragma unroll
            for (int k = 0; k < NV; ++k)
                if (k < nk) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        prow[(i64)k * g.m.kstride + e] = pg[k][e];
                        if (CEN) prow[d + (i64)k * g.m.kstride + e] = pb[k][e];
                    }
                }
        }
    }
}

// Column sums of the partial rows in a fixed order: slice s (of 8) adds rows
// s, s+8, s+16, ... in order, then the 8 slice sums are added in order.
template <class T, bool CEN>
__device__ __forceinline__ void finalize(const acc_t<T> *__restrict__ part, T *__restrict__ dgamma,
                                         T *__restrict__ dbeta, i64 nparts, i64 d) {
    typedef acc_t<T> A;
    __shared__ A sm[8][33];
    const i64 W = CEN ? 2 * d : d;
    const int lane = threadIdx.x & 31, sl = threadIdx.x >> 5;
    for (i64 c0 = (i64)blockIdx.x * 32; c0 < W; c0 += (i64)gridDim.x * 32) {
        const i64 col = c0 + lane;
        A s = 0;
        if (col < W) {
            i64 p = sl;
            for (; p + 24 < nparts; p += 32) {
                const A a0 = part[p * W + col], a1 = part[(p + 8) * W + col];
                const A a2 = part[(p + 16) * W + col], a3 = part[(p + 24) * W + col];
                s = fg_add(fg_add(fg_add(fg_add(s, a0), a1), a2), a3);
            }
            for (; p < nparts; p += 8) s = fg_add(s, part[p * W + col]);
        }
        sm[sl][lane] = s;
        __syncthreads();
        if (sl == 0 && col < W) {
            A t = sm[0][lane];
#pragma unroll
            for (int j = 1; j < 8; ++j) t = fg_add(t, sm[j][lane]);
            if (col < d) {
                if (dgamma) dgamma[col] = from_acc<T>(t);
            } else if (CEN && dbeta) {
                dbeta[col - d] = from_acc<T>(t);
            }
        }
        __syncthreads();
    }
}

}  // namespace fgn

// ===========================================================================
// The entry points: the core above, CEN = true (LayerNorm) and false (RMSNorm).
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
