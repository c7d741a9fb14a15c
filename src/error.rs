//! The one error type of the public API. Every message names the op and the
//! shapes or values involved.

/// Everything that can go wrong through fusegrad's public API.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Two shapes that must be equal are not.
    #[error("{op}: shape mismatch: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    /// Two shapes cannot be broadcast together under NumPy's rules.
    #[error("{op}: cannot broadcast shape {lhs:?} with {rhs:?}")]
    BroadcastMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    /// The contracted dimensions of a matmul differ.
    #[error("{op}: inner dimensions differ: {lhs:?} @ {rhs:?} ({k_lhs} vs {k_rhs})")]
    MatmulMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        k_lhs: usize,
        k_rhs: usize,
    },
    /// A buffer's length does not match the element count of its shape.
    #[error("{op}: {len} elements cannot have shape {shape:?}")]
    ElementCount {
        op: &'static str,
        shape: Vec<usize>,
        len: usize,
    },
    /// `backward()` without a seed needs a loss with exactly one element.
    #[error("backward: loss of shape {shape:?} is not a scalar; use backward_with(seed)")]
    NonScalarLoss { shape: Vec<usize> },
    /// The seed given to `backward_with` has the wrong shape.
    #[error("backward_with: seed shape {seed:?} does not match output shape {output:?}")]
    SeedShape {
        output: Vec<usize>,
        seed: Vec<usize>,
    },
    /// Vars from different tapes were combined.
    #[error("{op}: inputs were recorded on different tapes")]
    TapeMismatch { op: &'static str },
    /// `Gradients::wrt` was asked about a Var of another tape.
    #[error("{op}: the Var (id {id}) was not recorded on this tape")]
    NotOnTape { op: &'static str, id: usize },
    /// A gradient was asked of a constant, which never gets one.
    #[error("{op}: Var {id} is a constant (or depends only on constants) and has no gradient")]
    NoGradient { op: &'static str, id: usize },
    /// An axis is outside `-rank..rank`.
    #[error("{op}: axis {axis} is out of range for rank {rank} (shape {shape:?})")]
    AxisOutOfRange {
        op: &'static str,
        axis: isize,
        rank: usize,
        shape: Vec<usize>,
    },
    /// eps must be finite and strictly positive.
    #[error("{op}: eps must be finite and > 0, got {eps}")]
    BadEps { op: &'static str, eps: f64 },
    /// A normalization over no elements.
    #[error(
        "{op}: normalized shape {normalized:?} is empty or has zero elements (input {input:?})"
    )]
    EmptyNormalized {
        op: &'static str,
        input: Vec<usize>,
        normalized: Vec<usize>,
    },
    /// `normalized_shape` is not the input's trailing dims.
    #[error("{op}: normalized shape {normalized:?} is not the trailing dims of input {input:?}")]
    NormalizedShape {
        op: &'static str,
        input: Vec<usize>,
        normalized: Vec<usize>,
    },
    /// A shape whose element count (or byte count) overflows `usize`.
    #[error("{op}: shape {shape:?} has too many elements")]
    ShapeTooLarge { op: &'static str, shape: Vec<usize> },
    /// An index (an embedding id) is not below the size it indexes.
    #[error("{op}: index {index} at position {position} is out of range for size {bound}")]
    IndexOutOfRange {
        op: &'static str,
        index: usize,
        position: usize,
        bound: usize,
    },
    /// A slice `start..start + len` runs past the end of its axis.
    #[error(
        "{op}: slice {start}..{start}+{len} along axis {axis} exceeds its size {size} \
         (shape {shape:?})"
    )]
    SliceOutOfRange {
        op: &'static str,
        axis: usize,
        start: usize,
        len: usize,
        size: usize,
        shape: Vec<usize>,
    },
    /// A probability outside its allowed range (dropout's `p` in `[0, 1)`).
    #[error("{op}: probability must be in [0, 1), got {p}")]
    BadProbability { op: &'static str, p: f64 },
    /// Any other invalid argument, described in words.
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// An op would cut the gradient graph.
    #[error("{op}: has no backward, but an input requires a gradient")]
    NoBackward { op: &'static str },
    /// Inputs live on different devices.
    #[error("{op}: inputs on different devices: {lhs} vs {rhs}")]
    DeviceMismatch {
        op: &'static str,
        lhs: String,
        rhs: String,
    },
    /// A weights file could not be written or read, or does not match the
    /// module (the first mismatch, named).
    #[error("weights file {path}: {msg}")]
    Weights { path: String, msg: String },
    /// A training checkpoint could not be written or read, is damaged, or
    /// does not match the run that loads it (what differs, named).
    #[error("checkpoint {path}: {msg}")]
    Checkpoint { path: String, msg: String },
    /// A collective operation across ranks failed or ran past its time
    /// limit (which rank, which operation, and what is known of the others).
    #[error("rank {rank} of {world}: {op}: {msg}")]
    Collective {
        rank: usize,
        world: usize,
        op: &'static str,
        msg: String,
    },
    /// A shadow replay file could not be written or read.
    #[error("shadow replay file {path}: {msg}")]
    Replay { path: String, msg: String },
    /// A shadow check found a fused result past tolerance from its
    /// composed twin, and the shadow was set to halt.
    #[error("{op} at {site}: fused {result} differs from the composed twin by {diff:e}, past the tolerance {tol:e}")]
    ShadowMismatch {
        op: &'static str,
        site: String,
        result: String,
        diff: f64,
        tol: f64,
    },
    /// A plot could not be drawn or written (`path` is the file, or
    /// `<svg>` / `<png>` for one made in memory).
    #[error("plot {path}: {msg}")]
    Plot { path: String, msg: String },
    /// CUDA was asked for but cannot be used here.
    #[error("CUDA unavailable: {reason}")]
    CudaUnavailable { reason: String },

    /// A CUDA driver, cuBLAS or NVRTC call failed; `msg` carries the
    /// library's message (for NVRTC, the compile log).
    #[error("{op} on {device}: {msg}")]
    Cuda {
        op: &'static str,
        device: String,
        msg: String,
    },
    /// The allocator refused a buffer (the shape's byte count fits in
    /// `isize`, but no such block could be had).
    #[error("{op}: out of memory allocating {bytes} bytes for shape {shape:?}")]
    OutOfMemory {
        op: &'static str,
        shape: Vec<usize>,
        bytes: usize,
    },
}

/// Result with fusegrad's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
