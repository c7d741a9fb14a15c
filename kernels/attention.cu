// Fused scaled dot-product attention, forward and backward: the CUDA twin
// of ops/attention/cpu.rs (the formulas are in ops/attention/mod.rs).
//
// Per (batch, head) "bh", query row i sees key j when j <= i (causal) or
// always. In A = acc_t<T>:
//   forward   s_ij = scale <q_i, k_j>, an online softmax over key tiles
//             (running max m and sum l, rescaled by exp(m_old - m_new)),
//             o_i = sum_j p_ij v_j / l_i, lse_i = m_i + ln l_i
//   backward  D_i = <dO_i, o_i>, p_ij = exp(s_ij - lse_i),
//             ds_ij = p_ij (<dO_i, v_j> - D_i),
//             dq_i = scale sum_j ds_ij k_j   (attention_bwd_dq)
//             dk_j = scale sum_i ds_ij q_i, dv_j = sum_i p_ij dO_i
//                                             (attention_bwd_dkv)
// A masked pair is never multiplied (the loops stop at the last visible
// key or row), so a NaN at position j reaches the same rows as on the CPU.
// fmax skips NaN in the running max, as Rust's max does; a NaN score makes
// its row's sum, and so the row, NaN.
//
// Layouts (`packed`): 0 = q, k, v, o each [BH, T, d]; 1 = one
// [B, T, 3, H, d] input (q, k, v pass the same pointer) and o [B, T, H, d].
// Gradients are written in the inputs' layout (packed: one buffer, the dq
// kernel writes the q part and the dkv kernel the k and v parts).
//
// Tiles: 32 query rows per block for the forward (4 warps x 8 rows) and dq
// kernels (8 warps x 4 rows, one row at a time per warp with the key tiles
// reloaded for each, which keeps its registers from spilling): a warp per
// row, its lanes over the 32 keys of a tile, then over columns, with the
// tile's K and V rows in shared memory; the dkv kernel
// takes 16 keys per block (4 warps x 4 keys, lanes over 32 query rows) with
// the rows' Q and dO in shared memory. Row accumulators live in registers,
// ATT_COLS per lane, so head_dim <= 32 * ATT_COLS = 64 (the host refuses
// more). Shared rows are padded to d + 1 so lanes reading different rows
// hit different banks.
//
// Determinism: every sum runs in a fixed order (lanes fold with the
// butterflies of common.cuh, key and row tiles in order); no atomics.
//
// ---------------------------------------------------------------------------
// attention_fwd(const T* q, const T* k, const T* v, T* o, A* lse,
//               i64 bh, i64 heads, i64 t, i64 d, int packed, int causal,
//               double scale)
//   block = 128, grid = min(bh * ceil(t / 32), 65535) (grid-stride over
//   tiles), smem = 0 (2 * 32 * 65 A static). lse is [bh, t].
// attention_bwd_dq(const T* q, const T* k, const T* v, const T* o,
//                  const T* dout, const A* lse, A* dd, T* dq, i64 bh,
//                  i64 heads, i64 t, i64 d, int packed, int causal,
//                  double scale)
//   block = 256, the forward's grid. Writes dq and dd = D ([bh, t]), which
//   attention_bwd_dkv reads: launch it first, on the same stream.
// attention_bwd_dkv(const T* q, const T* k, const T* v, const T* dout,
//                   const A* lse, const A* dd, T* dk, T* dv, i64 bh,
//                   i64 heads, i64 t, i64 d, int packed, int causal,
//                   double scale)
//   block = 128, grid = min(bh * ceil(t / 16), 65535), smem = 0.
// ---------------------------------------------------------------------------

#define ATT_ROWS 32   // query rows per forward/dq block; keys per tile
#define ATT_KEYS 16   // keys per dkv block
#define ATT_DQ_RPW 4  // query rows per warp in the dq kernel (8 warps)
#define ATT_COLS 2    // columns per lane: head_dim <= 64
#define ATT_MAXD (32 * ATT_COLS)
#define ATT_LD (ATT_MAXD + 1)


template <class A> __device__ __forceinline__ A att_warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fg_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Offset of row i of input w (0 q, 1 k, 2 v) of head bh.
__device__ __forceinline__ i64 att_in(i64 bh, int w, i64 i, i64 heads, i64 t, i64 d, int packed) {
    if (!packed) return (bh * t + i) * d;
    const i64 b = bh / heads, h = bh - b * heads, wd = heads * d;
    return (b * t + i) * 3 * wd + w * wd + h * d;
}

// Offset of row i of head bh's output (and of its gradient).
__device__ __forceinline__ i64 att_out(i64 bh, i64 i, i64 heads, i64 t, i64 d, int packed) {
    if (!packed) return (bh * t + i) * d;
    const i64 b = bh / heads, h = bh - b * heads;
    return (b * t + i) * heads * d + h * d;
}

// Loads rows [r0, r0 + n) (zeros past t) of input w of head bh, or of the
// output-shaped x when w < 0, into s (rows ATT_LD apart).
template <class T>
__device__ __forceinline__ void att_load(acc_t<T> *s, const T *x, int w, i64 bh, i64 r0, int n,
                                         i64 heads, i64 t, i64 d, int packed) {
    for (i64 e = threadIdx.x; e < (i64)n * d; e += blockDim.x) {
        const i64 r = e / d, c = e - r * d, i = r0 + r;
        acc_t<T> v = (acc_t<T>)0;
        if (i < t) {
            const i64 off = w < 0 ? att_out(bh, i, heads, t, d, packed)
                                  : att_in(bh, w, i, heads, t, d, packed);
            v = to_acc(x[off + c]);
        }
        s[r * ATT_LD + c] = v;
    }
}

// <x, s_row> over d: x in global memory (one address for the whole warp),
// s_row in shared memory.
template <class T>
__device__ __forceinline__ acc_t<T> att_dot(const T *x, const acc_t<T> *s_row, i64 d) {
    acc_t<T> a = (acc_t<T>)0;
    for (i64 c = 0; c < d; ++c) a += to_acc(x[c]) * s_row[c];
    return a;
}

template <class T>
__device__ __forceinline__ void att_fwd(const T *q, const T *k, const T *v, T *o, acc_t<T> *lse,
                                        i64 nbh, i64 heads, i64 t, i64 d, int packed, int causal,
                                        double scale) {
    typedef acc_t<T> A;
    __shared__ A ks[ATT_ROWS * ATT_LD];
    __shared__ A vs[ATT_ROWS * ATT_LD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A sc = (A)scale;
    const i64 tiles = (t + ATT_ROWS - 1) / ATT_ROWS;
    for (i64 blk = blockIdx.x; blk < nbh * tiles; blk += gridDim.x) {
        const i64 bh = blk / tiles, r0 = (blk - bh * tiles) * ATT_ROWS;
        A m[8], l[8], acc[8][ATT_COLS];
#pragma unroll
        for (int rr = 0; rr < 8; ++rr) {
            m[rr] = fg_neg_inf<A>();
            l[rr] = (A)0;
#pragma unroll
            for (int cc = 0; cc < ATT_COLS; ++cc) acc[rr][cc] = (A)0;
        }
        const i64 kend = causal ? min(t, r0 + ATT_ROWS) : t;
        for (i64 k0 = 0; k0 < kend; k0 += ATT_ROWS) {
            __syncthreads();  // the previous tile's readers are done
            att_load(ks, k, 1, bh, k0, ATT_ROWS, heads, t, d, packed);
            att_load(vs, v, 2, bh, k0, ATT_ROWS, heads, t, d, packed);
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < 8; ++rr) {
                const i64 i = r0 + warp * 8 + rr;
                if (i >= t || (causal && k0 > i)) continue;  // warp-uniform
                const int nvis = (int)(causal ? min(i - k0 + 1, (i64)ATT_ROWS)
                                              : min(t - k0, (i64)ATT_ROWS));
                A s = fg_neg_inf<A>();
                if (lane < nvis)
                    s = att_dot(q + att_in(bh, 0, i, heads, t, d, packed), ks + lane * ATT_LD, d) * sc;
                const A mn = fg_max(m[rr], att_warp_max(s));
                const A p = lane < nvis ? fg_exp(s - mn) : (A)0;
                const A corr = fg_exp(m[rr] - mn);
                l[rr] = l[rr] * corr + warp_sum(p);
                m[rr] = mn;
#pragma unroll
                for (int cc = 0; cc < ATT_COLS; ++cc) acc[rr][cc] *= corr;
                for (int jj = 0; jj < nvis; ++jj) {
                    const A pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                    for (int cc = 0; cc < ATT_COLS; ++cc) {
                        const i64 c = lane + 32 * cc;
                        if (c < d) acc[rr][cc] += pj * vs[jj * ATT_LD + c];
                    }
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < 8; ++rr) {
            const i64 i = r0 + warp * 8 + rr;
            if (i >= t) continue;
            const A r = (A)1 / l[rr];
            T *orow = o + att_out(bh, i, heads, t, d, packed);
#pragma unroll
            for (int cc = 0; cc < ATT_COLS; ++cc) {
                const i64 c = lane + 32 * cc;
                if (c < d) orow[c] = from_acc<T>(acc[rr][cc] * r);
            }
            if (lane == 0) lse[bh * t + i] = m[rr] + fg_log(l[rr]);
        }
    }
}

template <class T>
__device__ __forceinline__ void att_bwd_dq(const T *q, const T *k, const T *v, const T *o,
                                           const T *dout, const acc_t<T> *lse, acc_t<T> *dd, T *dq,
                                           i64 nbh, i64 heads, i64 t, i64 d, int packed,
                                           int causal, double scale) {
    typedef acc_t<T> A;
    __shared__ A ks[ATT_ROWS * ATT_LD];
    __shared__ A vs[ATT_ROWS * ATT_LD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A sc = (A)scale;
    const i64 tiles = (t + ATT_ROWS - 1) / ATT_ROWS;
    for (i64 blk = blockIdx.x; blk < nbh * tiles; blk += gridDim.x) {
        const i64 bh = blk / tiles, r0 = (blk - bh * tiles) * ATT_ROWS;
        const i64 kend = causal ? min(t, r0 + ATT_ROWS) : t;
        // One row per warp at a time, the key tiles reloaded for each (a
        // row's accumulator is then ATT_COLS registers: no spills). Every
        // warp runs the same trip counts, so the barriers line up.
#pragma unroll 1
        for (int rr = 0; rr < ATT_DQ_RPW; ++rr) {
            const i64 i = r0 + warp * ATT_DQ_RPW + rr;
            A dsum = (A)0;
            if (i < t) {
                const T *gr = dout + att_out(bh, i, heads, t, d, packed);
                const T *orow = o + att_out(bh, i, heads, t, d, packed);
                for (i64 c = lane; c < d; c += 32) dsum += to_acc(gr[c]) * to_acc(orow[c]);
            }
            dsum = warp_sum(dsum);
            if (i < t && lane == 0) dd[bh * t + i] = dsum;
            A acc[ATT_COLS];
#pragma unroll
            for (int cc = 0; cc < ATT_COLS; ++cc) acc[cc] = (A)0;
            for (i64 k0 = 0; k0 < kend; k0 += ATT_ROWS) {
                __syncthreads();  // the previous tile's readers are done
                att_load(ks, k, 1, bh, k0, ATT_ROWS, heads, t, d, packed);
                att_load(vs, v, 2, bh, k0, ATT_ROWS, heads, t, d, packed);
                __syncthreads();
                if (i >= t || (causal && k0 > i)) continue;  // warp-uniform
                const int nvis = (int)(causal ? min(i - k0 + 1, (i64)ATT_ROWS)
                                              : min(t - k0, (i64)ATT_ROWS));
                A ds = (A)0;
                if (lane < nvis) {
                    const A s = att_dot(q + att_in(bh, 0, i, heads, t, d, packed), ks + lane * ATT_LD, d) * sc;
                    const A p = fg_exp(s - lse[bh * t + i]);
                    const A dp = att_dot(dout + att_out(bh, i, heads, t, d, packed), vs + lane * ATT_LD, d);
                    ds = p * (dp - dsum);
                }
                for (int jj = 0; jj < nvis; ++jj) {
                    const A dj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
                    for (int cc = 0; cc < ATT_COLS; ++cc) {
                        const i64 c = lane + 32 * cc;
                        if (c < d) acc[cc] += dj * ks[jj * ATT_LD + c];
                    }
                }
            }
            if (i < t) {
                T *row = dq + att_in(bh, 0, i, heads, t, d, packed);
#pragma unroll
                for (int cc = 0; cc < ATT_COLS; ++cc) {
                    const i64 c = lane + 32 * cc;
                    if (c < d) row[c] = from_acc<T>(acc[cc] * sc);
                }
            }
        }
    }
}

template <class T>
__device__ __forceinline__ void att_bwd_dkv(const T *q, const T *k, const T *v, const T *dout,
                                            const acc_t<T> *lse, const acc_t<T> *dd, T *dk, T *dv,
                                            i64 nbh, i64 heads, i64 t, i64 d, int packed,
                                            int causal, double scale) {
    typedef acc_t<T> A;
    __shared__ A qs[ATT_ROWS * ATT_LD];
    __shared__ A gs[ATT_ROWS * ATT_LD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const A sc = (A)scale;
    const i64 tiles = (t + ATT_KEYS - 1) / ATT_KEYS;
    for (i64 blk = blockIdx.x; blk < nbh * tiles; blk += gridDim.x) {
        const i64 bh = blk / tiles, j0 = (blk - bh * tiles) * ATT_KEYS;
        A kacc[4][ATT_COLS], vacc[4][ATT_COLS];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int cc = 0; cc < ATT_COLS; ++cc) kacc[kk][cc] = vacc[kk][cc] = (A)0;
        // Causal: rows before j0 see none of these keys.
        for (i64 q0 = causal ? j0 : 0; q0 < t; q0 += ATT_ROWS) {
            __syncthreads();
            att_load(qs, q, 0, bh, q0, ATT_ROWS, heads, t, d, packed);
            att_load(gs, dout, -1, bh, q0, ATT_ROWS, heads, t, d, packed);
            __syncthreads();
            const i64 i = q0 + lane;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const i64 j = j0 + warp * 4 + kk;
                if (j >= t) continue;  // warp-uniform
                // Rows [lo, hi) of this tile see key j.
                const int lo = (int)(causal ? max(j - q0, (i64)0) : (i64)0);
                const int hi = (int)min(t - q0, (i64)ATT_ROWS);
                if (lo >= hi) continue;
                A p = (A)0, ds = (A)0;
                if (lane >= lo && lane < hi) {
                    const A s = att_dot(k + att_in(bh, 1, j, heads, t, d, packed), qs + lane * ATT_LD, d) * sc;
                    p = fg_exp(s - lse[bh * t + i]);
                    const A dp = att_dot(v + att_in(bh, 2, j, heads, t, d, packed), gs + lane * ATT_LD, d);
                    ds = p * (dp - dd[bh * t + i]);
                }
                for (int ii = lo; ii < hi; ++ii) {
                    const A pi = __shfl_sync(0xffffffffu, p, ii);
                    const A di = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
                    for (int cc = 0; cc < ATT_COLS; ++cc) {
                        const i64 c = lane + 32 * cc;
                        if (c < d) {
                            vacc[kk][cc] += pi * gs[ii * ATT_LD + c];
                            kacc[kk][cc] += di * qs[ii * ATT_LD + c];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const i64 j = j0 + warp * 4 + kk;
            if (j >= t) continue;
            T *krow = dk + att_in(bh, 1, j, heads, t, d, packed);
            T *vrow = dv + att_in(bh, 2, j, heads, t, d, packed);
#pragma unroll
            for (int cc = 0; cc < ATT_COLS; ++cc) {
                const i64 c = lane + 32 * cc;
                if (c < d) {
                    krow[c] = from_acc<T>(kacc[kk][cc] * sc);
                    vrow[c] = from_acc<T>(vacc[kk][cc]);
                }
            }
        }
    }
}

#define K_ATTENTION(T, S)                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                          \
        attention_fwd_##S(const T *q, const T *k, const T *v, T *o, acc_t<T> *lse, i64 bh,      \
                          i64 heads, i64 t, i64 d, int packed, int causal, double scale) {     \
        att_fwd<T>(q, k, v, o, lse, bh, heads, t, d, packed, causal, scale);                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) attention_bwd_dq_##S(                     \
        const T *q, const T *k, const T *v, const T *o, const T *dout, const acc_t<T> *lse,    \
        acc_t<T> *dd, T *dq, i64 bh, i64 heads, i64 t, i64 d, int packed, int causal,          \
        double scale) {                                                                        \
        att_bwd_dq<T>(q, k, v, o, dout, lse, dd, dq, bh, heads, t, d, packed, causal, scale);  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) attention_bwd_dkv_##S(                    \
        const T *q, const T *k, const T *v, const T *dout, const acc_t<T> *lse,                \
        const acc_t<T> *dd, T *dk, T *dv, i64 bh, i64 heads, i64 t, i64 d, int packed,         \
        int causal, double scale) {                                                            \
        att_bwd_dkv<T>(q, k, v, dout, lse, dd, dk, dv, bh, heads, t, d, packed, causal,        \
                       scale);                                                                 \
    }

FG_ALL_TYPES(K_ATTENTION)
