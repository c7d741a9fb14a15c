// Scalar losses, forward and backward: the CUDA twin of ops/loss/cpu.rs
// (mean squared error, softmax cross-entropy with its saved row statistics).
//
// Exported per element type as NAME_f32/_f64/_f16/_bf16 (T = float, double,
// f16, bf16; A = acc_t<T>: float, or double for f64). Counts are i64 and are
// converted to A inside ((A)n, round to nearest: the CPU's `acc_of`).
// Each +, -, *, / is one IEEE operation (no FMA contraction); exp/log are
// CUDA's (within ulps of Rust's libm).
//
// Scalars are reduced in two stages with a fixed order, no atomics: a first
// kernel writes per-item partials (A) in item order, then loss_final, one
// block, folds them (thread t takes items t, t + blockDim.x, ... in order,
// then common.cuh's block_sum) and divides by n. The bits depend only on
// (chunk, blockDim.x), which the host fixes as below; they differ from the
// CPU's sequential sum in order only.
//
// ---------------------------------------------------------------------------
// loss_final(const A* part, T* y, i64 nparts, i64 n)
//   y[0] = from_acc<T>((sum_{j < nparts} part[j]) / (A)n). nparts = 0 gives
//   0 / (A)n (NaN for n = 0, as the CPU's empty mean).
//   grid = 1, block = 1024 (fixed; a multiple of 32), smem = 0 (32 A
//   statically).
//
// mse_part(const T* p, const T* t, A* part, i64 n, i64 chunk)
//   MSE launch 1 of 2. nchunk = ceil(n / chunk); one block per chunk
//   (grid-stride): part[c] = sum over i in [c*chunk, min(n, (c+1)*chunk))
//   of (p[i] - t[i])^2 in A (difference rounded, square rounded, added).
//   Scratch: part, nchunk values of A.
//   chunk = 16384, block = 256 (both fixed), grid = min(nchunk, 65535),
//   smem = 0 (32 A statically).
//   MSE launch 2 of 2: loss_final(part, y, nchunk, n) -> y[0] = L.
//   n = 0: skip mse_part, launch loss_final(part, y, 0, 0) -> NaN (part may
//   be any valid pointer; it is not read).
//
// mse_grad(const T* g, const T* p, const T* t, T* dx, i64 n, double sign)
//   dx[i] = ks (p[i] - t[i]) with ks = ((2 g[0]) / (A)n) * (A)sign:
//   sign = +1 for d/dp, -1 for d/dt (the CPU's two calls). g is the scalar
//   output gradient on the device (one T).
//   block = 256, grid = min(ceil(n / 256), 65535), smem = 0.
//
// Cross-entropy of [n, c] logits x against targets (i64 class indices,
// one per row, each in [0, c): checked by the host; not checked here).
// Per row r with m_r = max_j x_{r,j} (fmax, NaN-skipping as Rust's max),
// s_r = sum_j exp(x_{r,j} - m_r): l_r = (m_r - x_{r,t_r}) + ln s_r;
// L = (1/n) sum_r l_r.
//
// ce_fwd_warp(const T* x, const i64* targets, A* row_max, A* row_lse,
//             A* row_loss, i64 n, i64 c)
// ce_fwd_block(same parameters)
//   CE launch 1 of 2: per row r < n writes row_max[r] = m_r, row_lse[r] =
//   ln s_r (the saved statistics, CeStats: 2 n values of A, kept on the
//   device for backward) and row_loss[r] = l_r (scratch, n values of A).
//   _warp: a warp per row, for c <= 1024: block = 256 (multiple of 32),
//          grid = min(ceil(n / 8), 65535), smem = 0.
//   _block: a block per row, for c > 1024: block = 1024 if c >= 8192 else
//          256 (multiple of 32), grid = min(n, 65535), smem = 0 (32 A).
//   CE launch 2 of 2: loss_final(row_loss, y, n, n) -> y[0] = L.
//   n = 0 (then c may be 0): skip launch 1; loss_final(.., y, 0, 0) -> NaN.
//
// ce_bwd(const T* g, const T* x, const i64* targets, const A* row_max,
//        const A* row_lse, T* dx, i64 n, i64 c)
//   dx[r, j] = k (p - [j == t_r]) with k = g[0] / (A)n and
//   p = exp((x[r, j] - m_r) - ln s_r), from the forward's statistics.
//   One thread per element. block = 256, grid = min(ceil(n*c / 256),
//   65535), smem = 0.
// ---------------------------------------------------------------------------


template <class A> __device__ __forceinline__ A ls_warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fg_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ----- scalar finalize ---------------------------------------------------------
template <class T>
__device__ __forceinline__ void final_body(const acc_t<T> *part, T *y, i64 nparts, i64 n) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    if (blockIdx.x != 0) return;  // one block does it all (uniform exit)
    A s = (A)0;
    for (i64 j = threadIdx.x; j < nparts; j += blockDim.x) s = fg_add(s, part[j]);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) y[0] = from_acc<T>(fg_div(s, (A)n));
}

// ----- mse ----------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void mse_part_body(const T *p, const T *t, acc_t<T> *part, i64 n,
                                              i64 chunk) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const i64 nchunk = (n + chunk - 1) / chunk;
    for (i64 c = blockIdx.x; c < nchunk; c += gridDim.x) {
        const i64 i0 = c * chunk, i1 = min(n, i0 + chunk);
        A s = (A)0;
#pragma unroll 4
        for (i64 i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
            const A d = fg_sub(to_acc(p[i]), to_acc(t[i]));
            s = fg_add(s, fg_mul(d, d));
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) part[c] = s;
    }
}

template <class T>
__device__ __forceinline__ void mse_grad_body(const T *g, const T *p, const T *t, T *dx, i64 n,
                                              double sign) {
    typedef acc_t<T> A;
    // k = two g / N, ks = k sign (two = 1 + 1 = 2 exactly).
    const A k = fg_div(fg_mul((A)2, to_acc(g[0])), (A)n);
    const A ks = fg_mul(k, (A)sign);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        dx[i] = from_acc<T>(fg_mul(ks, fg_sub(to_acc(p[i]), to_acc(t[i]))));
}

// ----- cross-entropy ---------------------------------------------------------------
// A row group is a warp (BLK = false) or the whole block (BLK = true); the
// row loop is group-uniform so the shuffles and barriers are safe.
template <class T, bool BLK>
__device__ __forceinline__ void ce_fwd_body(const T *x, const i64 *targets, acc_t<T> *row_max,
                                            acc_t<T> *row_lse, acc_t<T> *row_loss, i64 n, i64 c) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const int lane = threadIdx.x & 31;
    const int t0 = BLK ? (int)threadIdx.x : lane;
    const int nt = BLK ? (int)blockDim.x : 32;
    const i64 first = BLK ? (i64)blockIdx.x : (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const i64 step = BLK ? (i64)gridDim.x : (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 r = first; r < n; r += step) {
        const T *xr = x + r * c;
        A m = fg_neg_inf<A>();
        for (i64 j = t0; j < c; j += nt) m = fg_max(m, to_acc(xr[j]));
        m = ls_warp_max(m);
        if constexpr (BLK) {
            const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
            __syncthreads();
            if (lane == 0) sh[w] = m;
            __syncthreads();
            m = ls_warp_max(lane < nw ? sh[lane] : fg_neg_inf<A>());
        }
        A s = (A)0;
        for (i64 j = t0; j < c; j += nt) s = fg_add(s, fg_exp(fg_sub(to_acc(xr[j]), m)));
        if constexpr (BLK) s = block_sum(s, sh);
        else s = warp_sum(s);
        if (t0 == 0) {
            const A ls = fg_log(s);
            row_max[r] = m;
            row_lse[r] = ls;
            row_loss[r] = fg_add(fg_sub(m, to_acc(xr[targets[r]])), ls);
        }
    }
}

template <class T>
__device__ __forceinline__ void ce_bwd_body(const T *g, const T *x, const i64 *targets,
                                            const acc_t<T> *row_max, const acc_t<T> *row_lse,
                                            T *dx, i64 n, i64 c) {
    typedef acc_t<T> A;
    const A k = fg_div(to_acc(g[0]), (A)n);
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n * c;
         e += (i64)gridDim.x * blockDim.x) {
        const i64 r = e / c, j = e - r * c;
        const A p = fg_exp(fg_sub(fg_sub(to_acc(x[e]), row_max[r]), row_lse[r]));
        const A onehot = j == targets[r] ? (A)1 : (A)0;
        dx[e] = from_acc<T>(fg_mul(k, fg_sub(p, onehot)));
    }
}

#define K_LOSS(T, S)                                                                          \
    extern "C" __global__ void loss_final_##S(const acc_t<T> *part, T *y, i64 nparts, i64 n) { \
        final_body<T>(part, y, nparts, n);                                                    \
    }                                                                                         \
    extern "C" __global__ void mse_part_##S(const T *p, const T *t, acc_t<T> *part, i64 n,     \
                                            i64 chunk) {                                      \
        mse_part_body<T>(p, t, part, n, chunk);                                               \
    }                                                                                         \
    extern "C" __global__ void mse_grad_##S(const T *g, const T *p, const T *t, T *dx, i64 n,  \
                                            double sign) {                                    \
        mse_grad_body<T>(g, p, t, dx, n, sign);                                               \
    }                                                                                         \
    extern "C" __global__ void ce_fwd_warp_##S(const T *x, const i64 *targets,                 \
                                               acc_t<T> *row_max, acc_t<T> *row_lse,          \
                                               acc_t<T> *row_loss, i64 n, i64 c) {            \
        ce_fwd_body<T, false>(x, targets, row_max, row_lse, row_loss, n, c);                  \
    }                                                                                         \
    extern "C" __global__ void ce_fwd_block_##S(const T *x, const i64 *targets,                \
                                                acc_t<T> *row_max, acc_t<T> *row_lse,         \
                                                acc_t<T> *row_loss, i64 n, i64 c) {           \
        ce_fwd_body<T, true>(x, targets, row_max, row_lse, row_loss, n, c);                   \
    }                                                                                         \
    extern "C" __global__ void ce_bwd_##S(const T *g, const T *x, const i64 *targets,          \
                                          const acc_t<T> *row_max, const acc_t<T> *row_lse,   \
                                          T *dx, i64 n, i64 c) {                              \
        ce_bwd_body<T>(g, x, targets, row_max, row_lse, dx, n, c);                            \
    }

FG_ALL_TYPES(K_LOSS)
