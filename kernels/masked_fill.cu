// masked_fill and its backward: a select between each element and a
// constant, the boolean mask read through broadcast strides. CPU twin:
// ops/masked_fill/{mod.rs,cpu.rs} and src/mask.rs. Exported as
// masked_fill_f32/_f64/_f16/_bf16 (T = float, double, f16, bf16).
//
// ---------------------------------------------------------------------------
// masked_fill_NAME(const T* x, const unsigned char* mask, T* y, i64 n,
//                  Strides s, double value)
//   y[i] = (mask at i) ? fill : x[i], fill = from_acc<T>((acc_t<T>)value),
//   i.e. value rounded to the accumulation type, then to T, exactly as
//   T::from_f64 (so -inf stays -inf, NaN stays NaN; for f16/bf16 the same
//   two roundings f64 -> f32 -> T as the CPU).
//   x     : contiguous row-major, n elements (the tensor's shape).
//   mask  : the Mask's values, one byte per mask element in its row-major
//           order, 0 = false, nonzero = true (Vec<bool> uploaded as u8).
//   y     : output, contiguous, n elements; may alias x (each element is
//           read then written by one thread).
//   n     : element count of x.
//   s     : s.rank = rank of x (after the optional merging below),
//           s.shape[d] = x's dim d, s.a[d] = the mask's row-major stride for
//           x's dim d, 0 where the mask broadcasts. NumPy alignment, as
//           cpu::select's Layout: the mask's dims are right-aligned with
//           x's; a dim the mask lacks, or has as 1 while x's is not, gets
//           stride 0. s.b is unused (zero it). Rank 0 allowed.
//           Rank above 8: the host drops dims of size 1 and merges adjacent
//           dims d, d+1 whose mask strides satisfy a[d] == a[d+1]*shape[d+1]
//           (both 0 qualifies); e.g. scores [b, h, t, t] with a [t, t]
//           causal mask become shape [b*h, t, t], a = [0, t, 1].
//   value : the fill value as given to masked_fill (f64).
//   Geometry (grid-stride): block = 256 threads, grid = min(ceil(n / 256),
//   2^31 - 1) blocks (any grid >= 1 is correct), dynamic smem = 0. Skip the
//   launch when n == 0.
//
// Backward: the SAME kernel with x = g, y = dx and value = 0.0, giving
//   dx[i] = +0.0 where masked, g[i] elsewhere (cpu select(g, mask, T::ZERO)).
//
// Bits: identical to the CPU. Unmasked elements are copied as raw bits
// (NaN in x stays, with its payload); masked ones are the same rounded fill.
// ---------------------------------------------------------------------------

#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)

#define FG_MASKED_FILL(T, S)                                                      \
    extern "C" __global__ void masked_fill_##S(const T *x,                       \
                                               const unsigned char *mask, T *y,   \
                                               i64 n, Strides s, double value) { \
        /* One rounding path for the whole launch: f64 -> acc -> T. */            \
        const T fill = from_acc<T>((acc_t<T>)value);                              \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 om, unused;                                                       \
            strided_offsets(s, i, om, unused);                                    \
            y[i] = mask[om] ? fill : x[i];                                        \
        }                                                                         \
    }
FG_ALL_TYPES(FG_MASKED_FILL)
