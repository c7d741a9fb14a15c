// Shape ops that copy: permute/transpose, narrow and its backward (pad),
// concat and its backward. CPU twin: ops/shape/{mod.rs,cpu.rs,slice.rs}.
// Pure data movement: every element is moved as raw bits (no conversion,
// no arithmetic), so results equal the CPU's bit for bit, NaN payloads
// included. Every kernel is exported as NAME_f32, NAME_f64, NAME_f16,
// NAME_bf16 (T = float, double, f16, bf16).
//
// Launch geometry, the same for every kernel below (all grid-stride):
//   block = 256 threads (any multiple of 32 up to 1024 works),
//   grid  = min(ceil(N / 256), 2^31 - 1) blocks (any grid >= 1 is correct;
//           capping it, e.g. at 32 * SM count, only trades parallelism),
//   dynamic shared memory = 0 bytes.
// N is the element count of the OUTPUT named in each kernel; the host skips
// the launch when N == 0 (the CPU also produces an empty tensor then).
//
// ---------------------------------------------------------------------------
// permute_NAME(const T* x, T* y, i64 n, Strides s)
//   y = x with its axes reordered (permute, transpose; also the backward,
//   which is permute by the inverse order). Mirrors cpu::permute.
//   x : input, contiguous row-major, n elements.
//   y : output, contiguous row-major, n elements (must not alias x).
//   n : element count of y (= of x). N = n.
//   s : s.rank = output rank r (0..=8); s.shape[d] = output dim d
//       (= x.shape[perm[d]]); s.a[d] = row-major stride of x's axis perm[d],
//       in elements (the `src` vector of permute_tensor); s.b unused (zero it).
//       Rank 0 (a scalar) is allowed: y[0] = x[0].
//   Writes y[i] = x[sum_d idx_d(i) * s.a[d]] for i in 0..n, where idx(i) is
//   the row-major multi-index of i in s.shape.
//   Rank above 8: the host first drops size-1 output dims and merges each
//   pair of adjacent output dims d, d+1 with s.a[d] == s.a[d+1]*s.shape[d+1]
//   (they are then one dim of size shape[d]*shape[d+1], stride s.a[d+1]);
//   this never changes the result. Any permutation of up to 8 axes fits.
//
// block_copy_NAME(const T* x, T* y, i64 outer, i64 width,
//                 i64 src_stride, i64 src_off, i64 dst_stride, i64 dst_off)
//   Copies `outer` blocks of `width` contiguous elements:
//     y[b*dst_stride + dst_off + r] = x[b*src_stride + src_off + r]
//   for b in 0..outer, r in 0..width. Elements of y outside those blocks are
//   NOT written. N = outer * width. x and y must not overlap.
//   Seeing a tensor around axis `ax` as [outer, d, inner] (outer = product
//   of dims before ax, inner = product after), its three uses are:
//   * narrow forward (cpu::take_rows), x is [outer, d, inner], y is
//     [outer, len, inner]:
//       width = len*inner, src_stride = d*inner, src_off = start*inner,
//       dst_stride = len*inner, dst_off = 0.
//   * concat forward (cpu::concat_rows): ONE LAUNCH PER INPUT k, in any
//     order (the slabs are disjoint and together cover y, so after all k
//     launches every element of y is written exactly once). Input k is
//     [outer, d_k, inner], y is [outer, D, inner] with D = sum_k d_k, and
//     off_k = d_0 + .. + d_{k-1}:
//       width = d_k*inner, src_stride = d_k*inner, src_off = 0,
//       dst_stride = D*inner, dst_off = off_k*inner.
//     An input with d_k == 0 needs no launch.
//   * concat backward, dx_k = g[.., off_k..off_k+d_k, ..]: the narrow
//     forward of g with start = off_k, len = d_k (one launch per input
//     whose gradient is needed).
//
// narrow_backward_NAME(const T* g, T* dx, i64 outer, i64 d, i64 inner,
//                      i64 start, i64 len)
//   Narrow's adjoint (cpu::pad_rows): dx ([outer, d, inner]) is g
//   ([outer, len, inner]) at rows start..start+len of each block and +0.0
//   elsewhere. Writes EVERY element of dx (zeros included), so dx needs no
//   memset. N = outer * d * inner. g and dx must not overlap.
//   Requires start + len <= d (checked by the host, as check_narrow does).
// ---------------------------------------------------------------------------

// Grid-stride loop over [0, n) with 64-bit indices.
#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)

// Output element i (row-major in s.shape) reads x at its permuted offset;
// writes are coalesced, reads follow the input strides.
#define FG_PERMUTE(T, S)                                                          \
    extern "C" __global__ void permute_##S(const T *x, T *y, i64 n, Strides s) { \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 oa, ob;                                                           \
            strided_offsets(s, i, oa, ob);                                        \
            y[i] = x[oa];                                                         \
        }                                                                         \
    }
FG_ALL_TYPES(FG_PERMUTE)

// Block b's element r goes from x[b*src_stride + src_off + r] to
// y[b*dst_stride + dst_off + r]: consecutive threads move consecutive
// elements of a block, so both sides are coalesced.
#define FG_BLOCK_COPY(T, S)                                                       \
    extern "C" __global__ void block_copy_##S(const T *x, T *y, i64 outer,       \
                                              i64 width, i64 src_stride,          \
                                              i64 src_off, i64 dst_stride,        \
                                              i64 dst_off) {                      \
        i64 n = outer * width;                                                    \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 b = i / width, r = i - b * width;                                 \
            y[b * dst_stride + dst_off + r] = x[b * src_stride + src_off + r];    \
        }                                                                         \
    }
FG_ALL_TYPES(FG_BLOCK_COPY)

// dx element (b, row, c) of [outer, d, inner]: g's (b, row - start, c) when
// start <= row < start + len, else +0 (all-zero bits, T::ZERO on the CPU).
#define FG_NARROW_BACKWARD(T, S)                                                  \
    extern "C" __global__ void narrow_backward_##S(const T *g, T *dx, i64 outer, \
                                                   i64 d, i64 inner, i64 start,   \
                                                   i64 len) {                     \
        i64 blk = d * inner, n = outer * blk;                                     \
        i64 lo = start * inner, hi = (start + len) * inner, w = len * inner;      \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 b = i / blk, r = i - b * blk;                                     \
            T v;                                                                  \
            if (r >= lo && r < hi) v = g[b * w + (r - lo)];                       \
            else v = from_acc<T>((acc_t<T>)0);                                    \
            dx[i] = v;                                                            \
        }                                                                         \
    }
FG_ALL_TYPES(FG_NARROW_BACKWARD)
