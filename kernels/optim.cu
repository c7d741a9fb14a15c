// Optimizer update rules, one fused elementwise kernel per rule: SGD, SGD
// with momentum, Adam (L2 decay in the gradient) and AdamW (decoupled
// decay). CPU twin: src/nn/optim/{mod.rs,cpu.rs} (Rule and cpu::update).
// Exported as NAME_f32/_f64/_f16/_bf16 (T = float, double, f16, bf16: the
// parameter and gradient type). A = acc_t<T> (double for f64, float
// otherwise) is the CPU's T::Acc: all arithmetic and the optimizer state
// (velocity, moments) are in A, the state buffers being A arrays.
//
// Exactness: each formula is evaluated in the CPU's operation order with
// the _rn intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn and the
// double ones), which the compiler never contracts into FMAs; the CPU (Rust)
// never fuses either. Hyper-parameters come in as f64 and are rounded once
// to A (Accum::of); `1 - b1` and `1 - b2` are formed in f64 first, as the
// CPU does. So p, v, m match the CPU bit for bit (up to NaN payloads).
//
// In/out buffers: every kernel reads p, g (and the old state) and writes
// p_out (and the new state). Outputs may alias their inputs (p_out == p,
// m_out == m_in, v_out == v_in, for an in-place update) because each
// element is read and then written by the same thread; they may also be
// fresh buffers (the CPU builds new tensors, which matters if the old
// storage is shared). The gradient g is never written.
//
// Launch geometry, every kernel (grid-stride, so any grid >= 1 works):
//   block = 256 threads (any multiple of 32 up to 1024),
//   grid  = min(ceil(n / 256), 2^31 - 1) blocks,
//   dynamic shared memory = 0 bytes. Skip the launch when n == 0.
// One launch per parameter tensor (n = its element count).
//
// ---------------------------------------------------------------------------
// sgd_NAME(const T* p, const T* g, T* p_out, i64 n, double lr, double wd)
//   Rule::Sgd: p_out = w - lr * (g + wd * w), w = p. No state.
//
// momentum_NAME(const T* p, const T* g, const A* v_in, T* p_out, A* v_out,
//               i64 n, double lr, double mu, double wd, int first)
//   Rule::Momentum: g' = g + wd * w;
//     v = g'                    when first != 0 (no state yet; v_in is not
//                               read and may be null),
//     v = mu * v_in + g'        otherwise;
//   v_out = v; p_out = w - lr * v.
//   first = 1 exactly when the CPU's `prev` is empty (Sgd::velocity[k] is
//   empty: the first step, or the first after reset()); the host then
//   allocates v_out (n elements of A) and it becomes the state.
//
// adam_NAME(const T* p, const T* g, const A* m_in, const A* v_in,
//           T* p_out, A* m_out, A* v_out, i64 n, double lr, double b1,
//           double b2, double c1, double c2, double eps, double wd,
//           int first)
//   Rule::Adam with decoupled = false (Adam, L2 decay):
//     g' = g + wd * w
//     m  = b1 * m0 + (1 - b1) * g'
//     v  = b2 * v0 + (1 - b2) * g' * g'      (left to right: ((1-b2) g') g')
//     p_out = w - lr * (m / c1) / (sqrt(v / c2) + eps)
//            (as w - ((lr * (m / c1)) / (sqrt(v / c2) + eps)))
//   m_out = m, v_out = v. m0, v0 = m_in[i], v_in[i], or +0.0 when first != 0
//   (then m_in, v_in are not read and may be null; the host allocates m_out,
//   v_out as n elements of A each). first = 1 exactly when the CPU's state
//   for this parameter is empty (first step or first after reset()).
//   c1 = 1 - b1^t and c2 = 1 - b2^t are the bias corrections the host
//   computes in f64 exactly as Adam::update does (t = step count from 1,
//   beta.powi(t)); pass Rule::Adam's c1, c2 unchanged.
//
// adamw_NAME(same parameters as adam_NAME)
//   Rule::Adam with decoupled = true (AdamW): w is first decayed,
//     w' = w - lr * wd * w                   (as w - ((lr * wd) * w)),
//   then the Adam update above with g' = g (no decay in the gradient) and
//   w' in place of w: p_out = w' - lr * (m / c1) / (sqrt(v / c2) + eps).
// ---------------------------------------------------------------------------

#define FG_GRID_STRIDE(i, n)                                                      \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (i64)gridDim.x * blockDim.x)

// Rule::Sgd: w - lr (g + wd w).
template <class T>
__device__ __forceinline__ void sgd_impl(const T *p, const T *g, T *p_out, i64 n,
                                         double lr_, double wd_) {
    typedef acc_t<T> A;
    const A lr = (A)lr_, wd = (A)wd_;
    FG_GRID_STRIDE(i, n) {
        A w = to_acc(p[i]), gi = to_acc(g[i]);
        p_out[i] = from_acc<T>(fg_sub(w, fg_mul(lr, fg_add(gi, fg_mul(wd, w)))));
    }
}

// Rule::Momentum: g' = g + wd w; v = g' (first) or mu v + g'; w - lr v.
template <class T>
__device__ __forceinline__ void momentum_impl(const T *p, const T *g, const acc_t<T> *v_in,
                                              T *p_out, acc_t<T> *v_out, i64 n, double lr_,
                                              double mu_, double wd_, int first) {
    typedef acc_t<T> A;
    const A lr = (A)lr_, mu = (A)mu_, wd = (A)wd_;
    FG_GRID_STRIDE(i, n) {
        A w = to_acc(p[i]), gi = to_acc(g[i]);
        gi = fg_add(gi, fg_mul(wd, w));
        A v = first ? gi : fg_add(fg_mul(mu, v_in[i]), gi);
        v_out[i] = v;
        p_out[i] = from_acc<T>(fg_sub(w, fg_mul(lr, v)));
    }
}

// Rule::Adam; DECOUPLED selects AdamW's weight decay. The state is read as
// +0 on the first step, exactly like the CPU's `old(k, i)`.
template <class T, bool DECOUPLED>
__device__ __forceinline__ void adam_impl(const T *p, const T *g, const acc_t<T> *m_in,
                                          const acc_t<T> *v_in, T *p_out, acc_t<T> *m_out,
                                          acc_t<T> *v_out, i64 n, double lr_, double b1_,
                                          double b2_, double c1_, double c2_, double eps_,
                                          double wd_, int first) {
    typedef acc_t<T> A;
    // (1 - b) in f64, then rounded: the CPU's acc(1.0 - b1).
    const A one_b1 = (A)__dsub_rn(1.0, b1_), one_b2 = (A)__dsub_rn(1.0, b2_);
    const A b1 = (A)b1_, b2 = (A)b2_, c1 = (A)c1_, c2 = (A)c2_;
    const A lr = (A)lr_, eps = (A)eps_, wd = (A)wd_;
    const A zero = (A)0;
    FG_GRID_STRIDE(i, n) {
        A w = to_acc(p[i]), gi = to_acc(g[i]);
        if (DECOUPLED) w = fg_sub(w, fg_mul(fg_mul(lr, wd), w));
        else gi = fg_add(gi, fg_mul(wd, w));
        A m0 = first ? zero : m_in[i];
        A v0 = first ? zero : v_in[i];
        A m = fg_add(fg_mul(b1, m0), fg_mul(one_b1, gi));
        A v = fg_add(fg_mul(b2, v0), fg_mul(fg_mul(one_b2, gi), gi));
        A den = fg_add(fg_sqrt(fg_div(v, c2)), eps);
        A step = fg_div(fg_mul(lr, fg_div(m, c1)), den);
        m_out[i] = m;
        v_out[i] = v;
        p_out[i] = from_acc<T>(fg_sub(w, step));
    }
}

#define FG_OPTIM(T, S)                                                            \
    extern "C" __global__ void sgd_##S(const T *p, const T *g, T *p_out, i64 n,  \
                                       double lr, double wd) {                    \
        sgd_impl<T>(p, g, p_out, n, lr, wd);                                      \
    }                                                                             \
    extern "C" __global__ void momentum_##S(const T *p, const T *g,              \
                                            const acc_t<T> *v_in, T *p_out,       \
                                            acc_t<T> *v_out, i64 n, double lr,    \
                                            double mu, double wd, int first) {    \
        momentum_impl<T>(p, g, v_in, p_out, v_out, n, lr, mu, wd, first);         \
    }                                                                             \
    extern "C" __global__ void adam_##S(                                         \
        const T *p, const T *g, const acc_t<T> *m_in, const acc_t<T> *v_in,       \
        T *p_out, acc_t<T> *m_out, acc_t<T> *v_out, i64 n, double lr, double b1,  \
        double b2, double c1, double c2, double eps, double wd, int first) {      \
        adam_impl<T, false>(p, g, m_in, v_in, p_out, m_out, v_out, n, lr, b1, b2, \
                            c1, c2, eps, wd, first);                              \
    }                                                                             \
    extern "C" __global__ void adamw_##S(                                        \
        const T *p, const T *g, const acc_t<T> *m_in, const acc_t<T> *v_in,       \
        T *p_out, acc_t<T> *m_out, acc_t<T> *v_out, i64 n, double lr, double b1,  \
        double b2, double c1, double c2, double eps, double wd, int first) {      \
        adam_impl<T, true>(p, g, m_in, v_in, p_out, m_out, v_out, n, lr, b1, b2,  \
                           c1, c2, eps, wd, first);                               \
    }
FG_ALL_TYPES(FG_OPTIM)
