// Sums over axes (and means, by the divisor): the CUDA twin of
// ops/reduce/cpu.rs, used by sum/mean/sum_axes/mean_axes and the tape's
// sum_to_shape.
//
// Exported per element type as NAME_f32/_f64/_f16/_bf16 (T = float, double,
// f16, bf16; A = acc_t<T>: float, or double for f64). Sums accumulate in A;
// each output is from_acc<T>(sum / (A)div). `div` is a double: 1.0 for a
// sum (s / 1 is s), the count for a mean (rounded to A inside, as the CPU's
// `T::Acc::of(count as f64)`).
//
// Layout: the host drops size-1 dims and merges adjacent dims that are both
// reduced or both kept (ops/reduce/cpu.rs `blocks`). If the reduced dims
// then form one block the input is [outer, r, inner] (sum over r):
//   inner == 1 -> row sums   (sum_rows, or sum_rows_part + sum_rows_final)
//   inner  > 1 -> column sums (sum_cols, or sum_cols_part + sum_cols_final)
// (outer = 1 and/or r = 1 allowed; r = 1 with inner = 1 is a copy.) Any
// other axis set takes sum_strided. Empty cases are the host's: if the
// input has no elements the outputs are 0 (sum) or NaN (mean, 0/0) - a
// fill, no launch here.
//
// Determinism: every sum has a fixed order given (r, chunk, blockDim.x):
// each thread folds its elements in index order, then warps/blocks combine
// with common.cuh's fixed butterflies, and partials are added in chunk
// order. No atomics. The host must pick chunk and blockDim.x from the
// shape alone (the rules below do), never from the device, so two runs
// (and two devices) give the same bits. The bits differ from the CPU's
// (another summation order); both are sums in A.
//
// ---------------------------------------------------------------------------
// sum_rows(const T* x, T* y, i64 outer, i64 r, double div)
//   y[o] = sum_k x[o*r + k] / div, o < outer. One warp per row; rows
//   grid-stride in warp units.
//   block = 256 (any multiple of 32), grid = min(ceil(outer / 8), 65535),
//   smem = 0.
//   Use when outer >= 2048 or r <= 32768 (enough rows to fill the GPU, or
//   rows short enough for a warp); otherwise the split path below.
//
// sum_rows_part(const T* x, A* part, i64 outer, i64 r, i64 chunk)
//   Split path for long rows, launch 1 of 2. nchunk = ceil(r / chunk);
//   item w < outer*nchunk is (o = w / nchunk, c = w % nchunk); one block per
//   item (grid-stride): part[w] = sum of x[o*r + c*chunk ..
//   o*r + min(r, (c+1)*chunk)).
//   Scratch: part, outer*nchunk values of A (float for f32/f16/bf16,
//   double for f64).
//   block = 256 (fixed: the order depends on it), chunk = 16384,
//   grid = min(outer*nchunk, 65535), smem = 0.
// sum_rows_final(const A* part, T* y, i64 outer, i64 nchunk, double div)
//   Launch 2 of 2: exactly sum_rows over part as [outer, nchunk] (A in):
//   y[o] = sum_c part[o*nchunk + c] / div. Same geometry as sum_rows with
//   r = nchunk: block = 256, grid = min(ceil(outer / 8), 65535), smem = 0.
//
// sum_cols(const T* x, T* y, i64 outer, i64 r, i64 inner, double div)
//   y[o*inner + i] = sum_k x[(o*r + k)*inner + i] / div; one thread per
//   output (o, i), k in order (adjacent threads read adjacent columns).
//   block = 256, grid = min(ceil(outer*inner / 256), 65535), smem = 0.
//   Use when outer*inner >= 16384 or r <= 1024; otherwise the split path.
//
// sum_cols_part(const T* x, A* part, i64 outer, i64 r, i64 inner, i64 chunk)
//   Split path for few, long columns, launch 1 of 2. nchunk =
//   ceil(r / chunk); one thread per (o, c, i) (grid-stride, i fastest):
//   part[(o*nchunk + c)*inner + i] = sum over k in [c*chunk,
//   min(r, (c+1)*chunk)) of x[(o*r + k)*inner + i].
//   Scratch: part, outer*nchunk*inner values of A.
//   chunk = 256, block = 256, grid = min(ceil(outer*nchunk*inner / 256),
//   65535), smem = 0.
// sum_cols_final(const A* part, T* y, i64 outer, i64 nchunk, i64 inner,
//                double div)
//   Launch 2 of 2: exactly sum_cols over part as [outer, nchunk, inner].
//   block = 256, grid = min(ceil(outer*inner / 256), 65535), smem = 0.
//
// sum_strided(const T* x, T* y, Strides s, int nkeep, i64 nout, i64 nred,
//             double div)
//   Any axis set. s.shape[0..nkeep) = the kept dims (row-major output
//   order), s.shape[nkeep..s.rank) = the reduced dims (rank <= 8 after
//   merging); s.a[d] = x's stride (elements) along each of those dims;
//   s.b unused. nout = product of the kept dims (numel of y), nred =
//   product of the reduced dims. One block per output (grid-stride):
//   y[o] = sum over j < nred (row-major over the reduced dims, thread t
//   folding j = t, t + blockDim.x, ...) of x[off_keep(o) + off_red(j)] / div.
//   block = 32 if nred <= 1024, 128 if nred <= 16384, else 512 (a multiple
//   of 32, <= 1024; the order depends on it), grid = min(nout, 65535),
//   smem = 0 (32 A statically).
// ---------------------------------------------------------------------------

#define RD_BLOCK_LOOP(w, n) for (i64 w = blockIdx.x; w < (n); w += gridDim.x)
#define RD_THREAD_LOOP(t, n)                                                         \
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < (n);               \
         t += (i64)gridDim.x * blockDim.x)

// Row sums, a warp per row: lane l folds k = l, l+32, ... in order, then the
// warp butterfly. Tin is T (sum_rows) or A (sum_rows_final).
template <class Tin, class T>
__device__ __forceinline__ void rows_body(const Tin *x, T *y, i64 outer, i64 r, double div) {
    typedef acc_t<T> A;
    const A d = (A)div;
    const int lane = threadIdx.x & 31;
    const i64 wpb = blockDim.x >> 5;
    for (i64 o = (i64)blockIdx.x * wpb + (threadIdx.x >> 5); o < outer;
         o += (i64)gridDim.x * wpb) {
        const Tin *row = x + o * r;
        A s = (A)0;
#pragma unroll 4
        for (i64 k = lane; k < r; k += 32) s += to_acc(row[k]);
        s = warp_sum(s);
        if (lane == 0) y[o] = from_acc<T>(fg_div(s, d));
    }
}

// One block per (row, chunk) item: thread t folds its elements in order,
// then block_sum.
template <class T>
__device__ __forceinline__ void rows_part_body(const T *x, acc_t<T> *part, i64 outer, i64 r,
                                               i64 chunk) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const i64 nchunk = (r + chunk - 1) / chunk;
    RD_BLOCK_LOOP(w, outer * nchunk) {
        const i64 o = w / nchunk, c = w - o * nchunk;
        const i64 k0 = c * chunk, k1 = min(r, k0 + chunk);
        const T *row = x + o * r;
        A s = (A)0;
#pragma unroll 4
        for (i64 k = k0 + threadIdx.x; k < k1; k += blockDim.x) s += to_acc(row[k]);
        s = block_sum(s, sh);
        if (threadIdx.x == 0) part[w] = s;
    }
}

// Column sums, a thread per output column: k in order.
template <class Tin, class T>
__device__ __forceinline__ void cols_body(const Tin *x, T *y, i64 outer, i64 r, i64 inner,
                                          double div) {
    typedef acc_t<T> A;
    const A d = (A)div;
    RD_THREAD_LOOP(t, outer * inner) {
        const i64 o = t / inner, i = t - o * inner;
        const Tin *p = x + o * r * inner + i;
        A s = (A)0;
#pragma unroll 4
        for (i64 k = 0; k < r; ++k) s += to_acc(p[k * inner]);
        y[t] = from_acc<T>(fg_div(s, d));
    }
}

template <class T>
__device__ __forceinline__ void cols_part_body(const T *x, acc_t<T> *part, i64 outer, i64 r,
                                               i64 inner, i64 chunk) {
    typedef acc_t<T> A;
    const i64 nchunk = (r + chunk - 1) / chunk;
    RD_THREAD_LOOP(t, outer * nchunk * inner) {
        const i64 oc = t / inner, i = t - oc * inner;
        const i64 o = oc / nchunk, c = oc - o * nchunk;
        const i64 k0 = c * chunk, k1 = min(r, k0 + chunk);
        const T *p = x + o * r * inner + i;
        A s = (A)0;
#pragma unroll 4
        for (i64 k = k0; k < k1; ++k) s += to_acc(p[k * inner]);
        part[t] = s;
    }
}

// Offset of index j over dims [d0, d1) of s (row-major), stride s.a.
__device__ __forceinline__ i64 rd_offset(const Strides &s, int d0, int d1, i64 j) {
    i64 off = 0;
    for (int d = d1 - 1; d >= d0; --d) {
        const i64 n = s.shape[d];
        const i64 k = j % n;
        j /= n;
        off += k * s.a[d];
    }
    return off;
}

// Same, 32-bit division (j and every dim below 2^32).
__device__ __forceinline__ i64 rd_offset32(const Strides &s, int d0, int d1, unsigned int j) {
    i64 off = 0;
    for (int d = d1 - 1; d >= d0; --d) {
        const unsigned int n = (unsigned int)s.shape[d];
        const unsigned int k = j % n;
        j /= n;
        off += (i64)k * s.a[d];
    }
    return off;
}

template <class T>
__device__ __forceinline__ void strided_body(const T *x, T *y, const Strides &s, int nkeep,
                                             i64 nout, i64 nred, double div) {
    typedef acc_t<T> A;
    __shared__ A sh[32];
    const A d = (A)div;
    const bool small = nred <= 0xFFFFFFFFll;
    RD_BLOCK_LOOP(o, nout) {
        const T *base = x + rd_offset(s, 0, nkeep, o);
        A acc = (A)0;
        if (small) {
            for (i64 j = threadIdx.x; j < nred; j += blockDim.x)
                acc += to_acc(base[rd_offset32(s, nkeep, s.rank, (unsigned int)j)]);
        } else {
            for (i64 j = threadIdx.x; j < nred; j += blockDim.x)
                acc += to_acc(base[rd_offset(s, nkeep, s.rank, j)]);
        }
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) y[o] = from_acc<T>(fg_div(acc, d));
    }
}

#define K_REDUCE(T, S)                                                                        \
    extern "C" __global__ void sum_rows_##S(const T *x, T *y, i64 outer, i64 r, double div) { \
        rows_body<T, T>(x, y, outer, r, div);                                                 \
    }                                                                                         \
    extern "C" __global__ void sum_rows_part_##S(const T *x, acc_t<T> *part, i64 outer, i64 r, \
                                                 i64 chunk) {                                 \
        rows_part_body<T>(x, part, outer, r, chunk);                                          \
    }                                                                                         \
    extern "C" __global__ void sum_rows_final_##S(const acc_t<T> *part, T *y, i64 outer,       \
                                                  i64 nchunk, double div) {                   \
        rows_body<acc_t<T>, T>(part, y, outer, nchunk, div);                                  \
    }                                                                                         \
    extern "C" __global__ void sum_cols_##S(const T *x, T *y, i64 outer, i64 r, i64 inner,     \
                                            double div) {                                     \
        cols_body<T, T>(x, y, outer, r, inner, div);                                          \
    }                                                                                         \
    extern "C" __global__ void sum_cols_part_##S(const T *x, acc_t<T> *part, i64 outer, i64 r, \
                                                 i64 inner, i64 chunk) {                      \
        cols_part_body<T>(x, part, outer, r, inner, chunk);                                   \
    }                                                                                         \
    extern "C" __global__ void sum_cols_final_##S(const acc_t<T> *part, T *y, i64 outer,       \
                                                  i64 nchunk, i64 inner, double div) {        \
        cols_body<acc_t<T>, T>(part, y, outer, nchunk, inner, div);                           \
    }                                                                                         \
    extern "C" __global__ void sum_strided_##S(const T *x, T *y, Strides s, int nkeep,         \
                                               i64 nout, i64 nred, double div) {              \
        strided_body<T>(x, y, s, nkeep, nout, nred, div);                                     \
    }

FG_ALL_TYPES(K_REDUCE)
