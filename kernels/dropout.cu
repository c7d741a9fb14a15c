// Dropout: multiply by a host-drawn keep mask and the scale, forward and
// backward. CPU twin: ops/dropout/{mod.rs,cpu.rs}. Exported as
// dropout_f32/_f64/_f16/_bf16 (T = float, double, f16, bf16; A = acc_t<T>).
//
// The mask is NOT drawn on the device: the host calls cpu::draw_keep with
// the caller's Rng (one rng.uniform() >= p draw per element, row-major), so
// CPU and GPU runs with the same seed keep the same elements, and uploads
// those bytes unchanged.
//
// ---------------------------------------------------------------------------
// dropout_NAME(const T* x, const unsigned char* keep, T* y, i64 n,
//              double scale)
//   y[i] = from_acc<T>(to_acc(x[i]) * (kept(i) ? (A)scale : (A)0)),
//   kept(i) = (keep[i >> 3] >> (i & 7)) & 1.
//   x     : n elements, contiguous.
//   keep  : ceil(n / 8) bytes, the CPU's packed form: element i is bit
//           (i % 8) (LSB first) of byte i / 8; bits past n are ignored.
//   y     : n elements; may alias x (each element read then written by one
//           thread).
//   n     : element count.
//   scale : 1 / (1 - p) computed in f64 by the host (Dropout::scale); the
//           kernel rounds it once to A, as Accum::of does.
//   Geometry (grid-stride): block = 256 threads, grid = min(ceil(n / 256),
//   2^31 - 1) blocks (any grid >= 1 is correct), dynamic smem = 0. Skip the
//   launch when n == 0.
//
// Backward: the SAME kernel with x = g, y = dx, the same keep bytes and the
// same scale (dx_i = g_i * m_i).
//
// Bits: identical to the CPU: one IEEE multiply in A (round to nearest, no
// FMA possible), then the same round-to-nearest-even narrowing. Dropped
// elements are x * 0, so NaN or infinite x gives NaN, and -x gives -0.0,
// exactly as the CPU's `x * zero`.
// ---------------------------------------------------------------------------

#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)


#define FG_DROPOUT(T, S)                                                          \
    extern "C" __global__ void dropout_##S(const T *x, const unsigned char *keep, \
                                           T *y, i64 n, double scale) {           \
        typedef acc_t<T> A;                                                       \
        const A s = (A)scale, zero = (A)0;                                        \
        FG_GRID_STRIDE(i, n) {                                                    \
            bool kept = (keep[i >> 3] >> (i & 7)) & 1;                            \
            y[i] = from_acc<T>(fg_mul(to_acc(x[i]), kept ? s : zero));         \
        }                                                                         \
    }
FG_ALL_TYPES(FG_DROPOUT)
