// Softmax and log-softmax along one axis, forward and backward: the CUDA
// twin of ops/softmax/cpu.rs.
//
// The tensor is [outer, d, inner] around the axis (d = axis length, inner =
// product of the later dims); a "lane" is the d elements x[o, :, i]. Per
// lane, in A = acc_t<T> (float, or double for f64), exactly the CPU's
// formulas:
//   m = max_k x_k     (fmax: NaNs skipped, as Rust's max; starts at -inf)
//   s = sum_k exp(x_k - m)
//   softmax      y_k = exp(x_k - m) * (1 / s)
//   log-softmax  y_k = (x_k - m) - ln s
// backward from the saved output y and its gradient g:
//   softmax      t = sum_k g_k y_k,  dx_k = y_k (g_k - t)
//   log-softmax  t = sum_k g_k,      dx_k = g_k - exp(y_k) t
// A NaN in a lane makes its s (and so the whole lane) NaN, as on the CPU.
// Each +, -, *, / is one IEEE operation (no FMA contraction); exp/log are
// CUDA's (within ulps of Rust's libm); the sums s and t run in a fixed
// order that differs from the CPU's sequential one.
//
// Exported per element type as NAME_f32/_f64/_f16/_bf16. `log` is an int:
// 0 softmax, 1 log-softmax. y/dx may not alias the inputs (the lane is read
// again after the reductions). Empty tensors: no launch.
//
// Determinism: fixed order for given blockDim.x (lane sums: each thread
// folds its elements in order, then the warp/block butterflies of
// common.cuh); the host picks blockDim.x from d alone. No atomics.
//
// Which kernel (the host's choice, by shape only):
//   inner == 1, d <= 1024  -> *_warp  (a warp per row; rows = outer)
//   inner == 1, d  > 1024  -> *_block (a block per row; rows = outer)
//   inner  > 1             -> *_cols  (a thread per lane)
//
// ---------------------------------------------------------------------------
// softmax_fwd_warp(const T* x, T* y, i64 rows, i64 d, int log)
//   Rows of d contiguous elements (inner == 1); one warp per row.
//   block = 256 (any multiple of 32), grid = min(ceil(rows / 8), 65535),
//   smem = 0.
// softmax_fwd_block(const T* x, T* y, i64 rows, i64 d, int log)
//   Same, one block per row (grid-stride over rows).
//   block = 1024 if d >= 8192 else 256 (multiple of 32, <= 1024),
//   grid = min(rows, 65535), smem = 0 (32 A statically).
// softmax_fwd_cols(const T* x, T* y, i64 outer, i64 d, i64 inner, int log)
//   Any inner (>= 1); one thread per lane (o, i), element k at
//   (o*d + k)*inner + i; adjacent threads read adjacent columns.
//   block = 256, grid = min(ceil(outer*inner / 256), 65535), smem = 0.
//
// softmax_bwd_warp(const T* y, const T* g, T* dx, i64 rows, i64 d, int log)
// softmax_bwd_block(const T* y, const T* g, T* dx, i64 rows, i64 d, int log)
// softmax_bwd_cols(const T* y, const T* g, T* dx, i64 outer, i64 d,
//                  i64 inner, int log)
//   y = the forward's output, g = dL/dy (same shape), dx = dL/dx. Geometry
//   exactly as the matching forward.
// ---------------------------------------------------------------------------


// Butterfly max (fmax, NaN-skipping; the order is irrelevant for max but
// kept fixed anyway).
template <class A> __device__ __forceinline__ A sm_warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fg_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The row group: one warp (BLK = false) or the whole block (BLK = true).
template <bool BLK, class A> __device__ __forceinline__ A grp_sum(A v, A *sh) {
    if constexpr (BLK) return block_sum(v, sh);
    else return warp_sum(v);
}
template <bool BLK, class A> __device__ __forceinline__ A grp_max(A v, A *sh) {
    v = sm_warp_max(v);
    if constexpr (BLK) {
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads();  // earlier readers of sh are done
        if (lane == 0) sh[w] = v;
        __syncthreads();
        v = lane < nw ? sh[lane] : fg_neg_inf<A>();
        v = sm_warp_max(v);
    }
    return v;
}

// Rows per step and this group's first row / step; rank and size within it.
template <bool BLK> __device__ __forceinline__ i64 grp_first() {
    return BLK ? (i64)blockIdx.x : (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
template <bool BLK> __device__ __forceinline__ i64 grp_step() {
    return BLK ? (i64)gridDim.x : (i64)gridDim.x * (blockDim.x >> 5);
}
template <bool BLK> __device__ __forceinline__ int grp_rank() {
    return BLK ? (int)threadIdx.x : (int)(threadIdx.x & 31);
}
template <bool BLK> __device__ __forceinline__ int grp_size() {
    return BLK ? (int)blockDim.x : 32;
}

// Rows (inner == 1): three passes over the row (max, sum, write); the
// second and third reads mostly hit L1/L2. The row loop is group-uniform.
template <class T, bool BLK>
__device__ __forceinline__ void fwd_rows(const T *x, T *y, i64 rows, i64 d, int log) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const int t0 = grp_rank<BLK>(), nt = grp_size<BLK>();
    for (i64 r = grp_first<BLK>(); r < rows; r += grp_step<BLK>()) {
        const T *xr = x + r * d;
        T *yr = y + r * d;
        A m = fg_neg_inf<A>();
        for (i64 k = t0; k < d; k += nt) m = fg_max(m, to_acc(xr[k]));
        m = grp_max<BLK>(m, sh);
        A s = (A)0;
        for (i64 k = t0; k < d; k += nt) s += fg_exp(fg_sub(to_acc(xr[k]), m));
        s = grp_sum<BLK>(s, sh);
        if (log) {
            const A ls = fg_log(s);
            for (i64 k = t0; k < d; k += nt) yr[k] = from_acc<T>(fg_sub(fg_sub(to_acc(xr[k]), m), ls));
        } else {
            const A rs = fg_recip(s);
            for (i64 k = t0; k < d; k += nt) yr[k] = from_acc<T>(fg_mul(fg_exp(fg_sub(to_acc(xr[k]), m)), rs));
        }
    }
}

template <class T, bool BLK>
__device__ __forceinline__ void bwd_rows(const T *y, const T *g, T *dx, i64 rows, i64 d, int log) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const int t0 = grp_rank<BLK>(), nt = grp_size<BLK>();
    for (i64 r = grp_first<BLK>(); r < rows; r += grp_step<BLK>()) {
        const T *yr = y + r * d, *gr = g + r * d;
        T *dr = dx + r * d;
        A t = (A)0;
        if (log) {
            for (i64 k = t0; k < d; k += nt) t += to_acc(gr[k]);
        } else {
            for (i64 k = t0; k < d; k += nt) t += fg_mul(to_acc(gr[k]), to_acc(yr[k]));
        }
        t = grp_sum<BLK>(t, sh);
        if (log) {
            for (i64 k = t0; k < d; k += nt)
                dr[k] = from_acc<T>(fg_sub(to_acc(gr[k]), fg_mul(fg_exp(to_acc(yr[k])), t)));
        } else {
            for (i64 k = t0; k < d; k += nt)
                dr[k] = from_acc<T>(fg_mul(to_acc(yr[k]), fg_sub(to_acc(gr[k]), t)));
        }
    }
}

// Lanes strided by inner: a thread per lane, k in order (this is the CPU's
// own order for the sums).
template <class T>
__device__ __forceinline__ void fwd_cols(const T *x, T *y, i64 outer, i64 d, i64 inner, int log) {
    typedef acc_t<T> A;
    for (i64 l = (i64)blockIdx.x * blockDim.x + threadIdx.x; l < outer * inner;
         l += (i64)gridDim.x * blockDim.x) {
        const i64 o = l / inner, i = l - o * inner;
        const T *xl = x + o * d * inner + i;
        T *yl = y + o * d * inner + i;
        A m = fg_neg_inf<A>();
        for (i64 k = 0; k < d; ++k) m = fg_max(m, to_acc(xl[k * inner]));
        A s = (A)0;
        for (i64 k = 0; k < d; ++k) s += fg_exp(fg_sub(to_acc(xl[k * inner]), m));
        if (log) {
            const A ls = fg_log(s);
            for (i64 k = 0; k < d; ++k)
                yl[k * inner] = from_acc<T>(fg_sub(fg_sub(to_acc(xl[k * inner]), m), ls));
        } else {
            const A rs = fg_recip(s);
            for (i64 k = 0; k < d; ++k)
                yl[k * inner] = from_acc<T>(fg_mul(fg_exp(fg_sub(to_acc(xl[k * inner]), m)), rs));
        }
    }
}

template <class T>
__device__ __forceinline__ void bwd_cols(const T *y, const T *g, T *dx, i64 outer, i64 d,
                                         i64 inner, int log) {
    typedef acc_t<T> A;
    for (i64 l = (i64)blockIdx.x * blockDim.x + threadIdx.x; l < outer * inner;
         l += (i64)gridDim.x * blockDim.x) {
        const i64 o = l / inner, i = l - o * inner;
        const i64 base = o * d * inner + i;
        const T *yl = y + base, *gl = g + base;
        T *dl = dx + base;
        A t = (A)0;
        if (log) {
            for (i64 k = 0; k < d; ++k) t += to_acc(gl[k * inner]);
            for (i64 k = 0; k < d; ++k)
                dl[k * inner] = from_acc<T>(
                    fg_sub(to_acc(gl[k * inner]), fg_mul(fg_exp(to_acc(yl[k * inner])), t)));
        } else {
            for (i64 k = 0; k < d; ++k) t += fg_mul(to_acc(gl[k * inner]), to_acc(yl[k * inner]));
            for (i64 k = 0; k < d; ++k)
                dl[k * inner] =
                    from_acc<T>(fg_mul(to_acc(yl[k * inner]), fg_sub(to_acc(gl[k * inner]), t)));
        }
    }
}

#define K_SOFTMAX(T, S)                                                                        \
    extern "C" __global__ void softmax_fwd_warp_##S(const T *x, T *y, i64 rows, i64 d,          \
                                                    int log) {                                 \
        fwd_rows<T, false>(x, y, rows, d, log);                                                \
    }                                                                                          \
    extern "C" __global__ void softmax_fwd_block_##S(const T *x, T *y, i64 rows, i64 d,         \
                                                     int log) {                                \
        fwd_rows<T, true>(x, y, rows, d, log);                                                 \
    }                                                                                          \
    extern "C" __global__ void softmax_fwd_cols_##S(const T *x, T *y, i64 outer, i64 d,         \
                                                    i64 inner, int log) {                      \
        fwd_cols<T>(x, y, outer, d, inner, log);                                               \
    }                                                                                          \
    extern "C" __global__ void softmax_bwd_warp_##S(const T *y, const T *g, T *dx, i64 rows,    \
                                                    i64 d, int log) {                          \
        bwd_rows<T, false>(y, g, dx, rows, d, log);                                            \
    }                                                                                          \
    extern "C" __global__ void softmax_bwd_block_##S(const T *y, const T *g, T *dx, i64 rows,   \
                                                     i64 d, int log) {                         \
        bwd_rows<T, true>(y, g, dx, rows, d, log);                                             \
    }                                                                                          \
    extern "C" __global__ void softmax_bwd_cols_##S(const T *y, const T *g, T *dx, i64 outer,   \
                                                    i64 d, i64 inner, int log) {               \
        bwd_cols<T>(y, g, dx, outer, d, inner, log);                                           \
    }

FG_ALL_TYPES(K_SOFTMAX)
