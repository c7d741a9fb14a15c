// Embedding: a row gather from a [vocab, dim] table, and its adjoint, a
// deterministic scatter-add done as a gather over a host-built CSR (no
// atomics). CPU twin: ops/embedding/{mod.rs,cpu.rs}. Exported as NAME_f32,
// NAME_f64, NAME_f16, NAME_bf16 (T = float, double, f16, bf16; A = acc_t<T>:
// double for f64, float otherwise).
//
// Launch geometry, both kernels (grid-stride, so any grid >= 1 is correct):
//   block = 256 threads (any multiple of 32 up to 1024),
//   grid  = min(ceil(N / 256), 2^31 - 1) blocks,
//   dynamic shared memory = 0 bytes.
// The host skips the launch when N == 0.
//
// ---------------------------------------------------------------------------
// embedding_NAME(const T* w, const i64* ids, T* y, i64 n_ids, i64 dim)
//   Forward (cpu::gather): y[p, c] = w[ids[p], c].
//   w   : the weight, [vocab, dim] row-major.
//   ids : n_ids ids (the host's Vec<usize> uploaded as i64, row-major in
//         ids_shape); every id is in 0..vocab (the host checks, as check()
//         does; the kernel does not).
//   y   : output, [n_ids, dim] row-major (shape ids_shape + [dim]).
//   N = n_ids * dim. Copies raw bits, so y equals the CPU's bit for bit.
//
// embedding_backward_NAME(const T* g, const i64* row_start, const i64* pos,
//                         T* dw, i64 vocab, i64 dim)
//   Backward (cpu::scatter_add): dw[v, c] = sum over k in
//   row_start[v]..row_start[v+1] of g[pos[k], c], summed in A from +0.0 in
//   increasing k, then rounded once to T; rows no position uses are +0.0.
//   Writes EVERY element of dw (no memset needed).
//   g         : the output gradient, [n_ids, dim] row-major.
//   row_start : vocab + 1 entries (i64), the CSR row pointer:
//               row_start[0] = 0, row_start[v+1] = row_start[v] + (number of
//               positions p with ids[p] == v); row_start[vocab] = n_ids.
//   pos       : n_ids entries (i64): pos[row_start[v]..row_start[v+1]] are
//               the positions p with ids[p] == v, ASCENDING. This is exactly
//               the stable counting sort cpu::scatter_add builds (`start`
//               and `pos` there), e.g. on the host:
//                 start[id+1] += 1 for each id; prefix-sum start;
//                 next = start; for p in 0..n_ids { pos[next[ids[p]]++] = p }
//   dw        : output, [vocab, dim] row-major.
//   N = vocab * dim. When dim == 0 or n_ids == 0 the CPU returns all zeros:
//   the host may launch anyway (row_start all 0 gives zeros) or memset.
//   Bits: the same as the CPU's. Each dw[v, c] is the same sequence of A
//   additions (+0.0, then g[p, c] for p ascending) as the CPU's acc[c]
//   loop, with no multiply to fuse, then the same round-to-nearest-even
//   narrowing; an empty row is +0.0 on both.
// ---------------------------------------------------------------------------

#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)

// Output element (p, c) copies w[ids[p], c]; consecutive threads take
// consecutive c, so reads of a row and writes are coalesced.
#define FG_EMBEDDING(T, S)                                                        \
    extern "C" __global__ void embedding_##S(const T *w, const i64 *ids, T *y,   \
                                             i64 n_ids, i64 dim) {                \
        i64 n = n_ids * dim;                                                      \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 p = i / dim, c = i - p * dim;                                     \
            y[i] = w[ids[p] * dim + c];                                           \
        }                                                                         \
    }
FG_ALL_TYPES(FG_EMBEDDING)

// One thread owns dw[v, c] and walks row v's positions in CSR order, so the
// sum's order is fixed by the ids alone (no atomics, same bits every run).
// Threads of a warp share v (or its neighbour) and read consecutive c of the
// same g row: coalesced.
#define FG_EMBEDDING_BACKWARD(T, S)                                               \
    extern "C" __global__ void embedding_backward_##S(                           \
        const T *g, const i64 *row_start, const i64 *pos, T *dw, i64 vocab,       \
        i64 dim) {                                                                \
        typedef acc_t<T> A;                                                       \
        i64 n = vocab * dim;                                                      \
        FG_GRID_STRIDE(i, n) {                                                    \
            i64 v = i / dim, c = i - v * dim;                                     \
            i64 k0 = row_start[v], k1 = row_start[v + 1];                         \
            A acc = (A)0;                                                         \
            for (i64 k = k0; k < k1; ++k) acc += to_acc(g[pos[k] * dim + c]);     \
            dw[i] = from_acc<T>(acc);                                             \
        }                                                                         \
    }
FG_ALL_TYPES(FG_EMBEDDING_BACKWARD)
