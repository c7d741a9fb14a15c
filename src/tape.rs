//! The tape: records one node per op call and runs the reverse sweep.
//!
//! A `Tape` is single-threaded (`Rc<RefCell<..>>`), so it is neither `Send`
//! nor `Sync`; the compiler rejects sharing one across threads. Separate
//! tapes on separate threads are independent. Tensors are `Send + Sync`.
//!
//! ```compile_fail
//! fn assert_send<S: Send>() {}
//! assert_send::<fusegrad::Tape<f32>>();
//! ```
//!
//! A `Var` holds its tape, so it stays on its thread too:
//!
//! ```compile_fail
//! fn assert_send<S: Send>() {}
//! assert_send::<fusegrad::Var<f32>>();
//! ```

use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::ops::elementwise::{Binary, Unary};
use crate::ops::reduce::kernel::sum_to_shape;
use crate::profile::Phase;
use crate::shadow::{Side, Twin, Watch};
use crate::tensor::{Dims, Tensor};
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// Type-erased recorded op: the op plus its saved state.
trait Backward<T: Element> {
    fn name(&self) -> &'static str;
    fn backward(&self, grad: &Tensor<T>, needs: &[bool]) -> Result<Vec<Option<Tensor<T>>>>;
    fn visit_saved(&self, f: &mut dyn FnMut(SavedItem));
}

struct Recorded<O: Op<T>, T: Element> {
    op: O,
    state: O::State,
    _t: std::marker::PhantomData<T>,
}

impl<O: Op<T>, T: Element> Backward<T> for Recorded<O, T> {
    fn name(&self) -> &'static str {
        self.op.name()
    }
    fn backward(&self, grad: &Tensor<T>, needs: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        self.op.backward(&self.state, grad, needs)
    }
    fn visit_saved(&self, f: &mut dyn FnMut(SavedItem)) {
        self.state.visit(f)
    }
}

/// A checked fused node: its own backward, then the twin's on the same
/// output gradient, compared (see [`crate::shadow`]).
struct Shadowed<T: Element> {
    fused: Box<dyn Backward<T>>,
    side: Side<T>,
}

impl<T: Element> Backward<T> for Shadowed<T> {
    fn name(&self) -> &'static str {
        self.fused.name()
    }
    fn backward(&self, grad: &Tensor<T>, needs: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let mut grads = self.fused.backward(grad, needs)?;
        self.side.backward(grad, &mut grads, needs)?;
        Ok(grads)
    }
    fn visit_saved(&self, f: &mut dyn FnMut(SavedItem)) {
        self.fused.visit_saved(f);
        f(SavedItem::Raw(self.side.saved_bytes()))
    }
}

enum Kind<T: Element> {
    /// A leaf; `var` leaves keep their value for memory accounting.
    Leaf(Option<Tensor<T>>),
    Op {
        bw: Box<dyn Backward<T>>,
        inputs: Dims,
    },
}

struct Node<T: Element> {
    requires_grad: bool,
    shape: Dims,
    kind: Kind<T>,
}

/// What a tape shares with its handles: the nodes and, while a
/// [`Shadow`] watches it, the shadow's per-tape state.
struct Inner<T: Element> {
    nodes: RefCell<Vec<Node<T>>>,
    shadow: RefCell<Option<Watch>>,
    /// False for a [`Tape::no_grad`] tape: its leaves take no gradient.
    grad: bool,
}

/// A recording of operations, shared by the `Var`s made on it.
pub struct Tape<T: Element> {
    inner: Rc<Inner<T>>,
}

impl<T: Element> Clone for Tape<T> {
    fn clone(&self) -> Self {
        Tape {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Element> Default for Tape<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A value recorded on a tape.
pub struct Var<T: Element> {
    tape: Tape<T>,
    id: usize,
    value: Tensor<T>,
    requires_grad: bool,
}

impl<T: Element> Clone for Var<T> {
    fn clone(&self) -> Self {
        Var {
            tape: self.tape.clone(),
            id: self.id,
            value: self.value.clone(),
            requires_grad: self.requires_grad,
        }
    }
}

impl<T: Element> std::fmt::Debug for Var<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Var#{}({:?}, grad={})",
            self.id, self.value, self.requires_grad
        )
    }
}

/// Per-node memory report entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMemory {
    /// Node id.
    pub id: usize,
    /// Op name.
    pub op: &'static str,
    /// Bytes this node's saved state adds (shared buffers counted once, at the
    /// first node holding them; leaf values are not counted).
    pub bytes: usize,
}

/// What one recorded node is, for analysis (memory traffic, graph size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node id.
    pub id: usize,
    /// Op name; `"leaf"` for vars, constants and untracked results.
    pub op: &'static str,
    /// Ids of the input nodes (empty for leaves).
    pub inputs: Vec<usize>,
    /// Shape of the node's value.
    pub shape: Vec<usize>,
    /// Whether a gradient flows through the node.
    pub requires_grad: bool,
}

impl<T: Element> Tape<T> {
    /// One [`NodeInfo`] per recorded node, oldest first.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.inner
            .nodes
            .borrow()
            .iter()
            .enumerate()
            .map(|(id, n)| {
                let (op, inputs) = match &n.kind {
                    Kind::Leaf(_) => ("leaf", Vec::new()),
                    Kind::Op { bw, inputs } => (bw.name(), inputs.to_vec()),
                };
                NodeInfo {
                    id,
                    op,
                    inputs,
                    shape: n.shape.to_vec(),
                    requires_grad: n.requires_grad,
                }
            })
            .collect()
    }

    /// An empty tape.
    pub fn new() -> Self {
        Self::with_grad(true)
    }

    /// A tape for values only, PyTorch's `no_grad`: every leaf, even one
    /// made by [`Tape::var`], takes no gradient, so ops save nothing for a
    /// backward pass and drop their intermediates at once. For inference
    /// and metrics; `backward` on it is an error.
    pub fn no_grad() -> Self {
        Self::with_grad(false)
    }

    fn with_grad(grad: bool) -> Self {
        Tape {
            inner: Rc::new(Inner {
                nodes: RefCell::new(Vec::new()),
                shadow: RefCell::new(None),
                grad,
            }),
        }
    }

    /// False for a [`Tape::no_grad`] tape.
    pub fn grad_enabled(&self) -> bool {
        self.inner.grad
    }

    /// `InvalidArgument` naming `op` on a [`Tape::no_grad`] tape.
    fn check_grad(&self, op: &'static str) -> Result<()> {
        if self.inner.grad {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op,
                msg: "the tape is a Tape::no_grad tape: it records values only".into(),
            })
        }
    }

    fn push(&self, node: Node<T>) -> usize {
        let mut nodes = self.inner.nodes.borrow_mut();
        nodes.push(node);
        nodes.len() - 1
    }

    fn leaf(&self, value: Tensor<T>, requires_grad: bool, keep: bool) -> Var<T> {
        let id = self.push(Node {
            requires_grad,
            shape: Dims::from_slice(value.shape()),
            kind: Kind::Leaf(keep.then(|| value.clone())),
        });
        Var {
            tape: self.clone(),
            id,
            value,
            requires_grad,
        }
    }

    /// A leaf that wants a gradient (none on a [`Tape::no_grad`] tape).
    pub fn var(&self, value: impl Into<Tensor<T>>) -> Var<T> {
        self.leaf(value.into(), self.inner.grad, true)
    }

    /// A leaf without a gradient; it costs nothing on the backward sweep.
    pub fn constant(&self, value: impl Into<Tensor<T>>) -> Var<T> {
        self.leaf(value.into(), false, true)
    }

    /// [`Tape::var`] of `value` copied to `device` (shared, no copy, when
    /// it is there already); its gradient lives on `device` too.
    pub fn var_on(&self, value: impl Into<Tensor<T>>, device: Device) -> Result<Var<T>> {
        Ok(self.var(value.into().to_device(device)?))
    }

    /// [`Tape::constant`] of `value` copied to `device`.
    pub fn constant_on(&self, value: impl Into<Tensor<T>>, device: Device) -> Result<Var<T>> {
        Ok(self.constant(value.into().to_device(device)?))
    }

    /// Number of recorded nodes.
    pub fn len(&self) -> usize {
        self.inner.nodes.borrow().len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if both handles refer to the same tape.
    pub fn same(&self, other: &Tape<T>) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// Bytes the graph holds for backward beyond the leaves' own values:
    /// every op's saved state, each shared buffer counted once.
    pub fn saved_bytes(&self) -> usize {
        self.saved_bytes_per_node().iter().map(|n| n.bytes).sum()
    }

    /// [`Tape::saved_bytes`], node by node.
    pub fn saved_bytes_per_node(&self) -> Vec<NodeMemory> {
        let nodes = self.inner.nodes.borrow();
        let mut seen: HashSet<usize> = nodes
            .iter()
            .filter_map(|n| match &n.kind {
                Kind::Leaf(Some(t)) => Some(t.storage_id()),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for (id, n) in nodes.iter().enumerate() {
            if let Kind::Op { bw, .. } = &n.kind {
                let mut bytes = 0;
                bw.visit_saved(&mut |item| match item {
                    SavedItem::Raw(b) => bytes += b,
                    SavedItem::Tensor { id, bytes: b } => {
                        if seen.insert(id) {
                            bytes += b
                        }
                    }
                });
                out.push(NodeMemory {
                    id,
                    op: bw.name(),
                    bytes,
                });
            }
        }
        out
    }

    /// Starts watching for a shadow (see [`crate::Shadow::watch`]).
    pub(crate) fn set_watch(&self, watch: Watch) {
        *self.inner.shadow.borrow_mut() = Some(watch);
    }

    /// Whether a [`crate::Shadow`] watches this tape.
    pub fn is_watched(&self) -> bool {
        self.inner.shadow.borrow().is_some()
    }

    /// Names `var` in shadow reports (a parameter's dotted name, such as
    /// `blocks.2.ln1.weight`); kept only while a shadow watches the tape.
    pub fn name_var(&self, var: &Var<T>, name: &str) {
        if let Some(w) = self.inner.shadow.borrow_mut().as_mut() {
            w.name(var.id, name);
        }
    }

    /// The name `var` was given by [`Tape::name_var`] (kept only while a
    /// shadow watches the tape).
    pub(crate) fn var_name(&self, var: &Var<T>) -> Option<String> {
        let w = self.inner.shadow.borrow();
        w.as_ref().and_then(|w| w.name_of(var.id))
    }

    /// [`Tape::apply`] for a fused op with a composed twin: on a watched
    /// tape, when the shadow picks this call, the twin also runs on the same
    /// inputs and both forward and backward are checked. `twin` is called
    /// only then, so an unwatched call costs one check.
    pub(crate) fn apply_twinned<'a, O: Op<T>>(
        op: O,
        inputs: &[&Var<T>],
        twin: impl FnOnce() -> Twin<'a, T>,
    ) -> Result<Var<T>> {
        let probe = match inputs.first() {
            Some(first) => {
                let mut w = first.tape.inner.shadow.borrow_mut();
                w.as_mut().and_then(|w| {
                    let ids: Vec<usize> = inputs.iter().map(|v| v.id).collect();
                    w.probe(op.name(), &ids)
                })
            }
            None => None,
        };
        let Some(probe) = probe else {
            return Tape::apply(op, inputs);
        };
        let mut out = Tape::apply(op, inputs)?;
        let (side, faulty) = Side::forward(probe, inputs, &out.value, twin())?;
        if let Some(y) = faulty {
            out.value = y;
        }
        let mut nodes = out.tape.inner.nodes.borrow_mut();
        let node = &mut nodes[out.id];
        if let Kind::Op { .. } = node.kind {
            if let Kind::Op { bw, inputs } = std::mem::replace(&mut node.kind, Kind::Leaf(None)) {
                node.kind = Kind::Op {
                    bw: Box::new(Shadowed { fused: bw, side }),
                    inputs,
                };
            }
        }
        drop(nodes);
        Ok(out)
    }

    /// Records `op` applied to `inputs` and returns its output. Ops whose
    /// inputs need no gradient are run but not recorded for backward.
    ///
    /// Errors: `TapeMismatch` / `DeviceMismatch` for mixed inputs,
    /// `NoBackward` for an op that is not [`Op::differentiable`] applied to
    /// an input that requires a gradient, and whatever `forward` returns.
    pub fn apply<O: Op<T>>(op: O, inputs: &[&Var<T>]) -> Result<Var<T>> {
        let name = op.name();
        let first = inputs.first().ok_or_else(|| Error::InvalidArgument {
            op: name,
            msg: "an op needs at least one input".into(),
        })?;
        for v in &inputs[1..] {
            if !first.tape.same(&v.tape) {
                return Err(Error::TapeMismatch { op: name });
            }
            if first.value.device() != v.value.device() {
                return Err(Error::DeviceMismatch {
                    op: name,
                    lhs: first.value.device().to_string(),
                    rhs: v.value.device().to_string(),
                });
            }
        }
        let requires_grad = inputs.iter().any(|v| v.requires_grad);
        if requires_grad && !op.differentiable() {
            return Err(Error::NoBackward { op: name });
        }
        // The input tensors, on the stack for the usual one to four inputs.
        let mut few = [&first.value; Dims::INLINE];
        let many: Vec<&Tensor<T>>;
        let tensors: &[&Tensor<T>] = if inputs.len() <= Dims::INLINE {
            for (t, v) in few.iter_mut().zip(inputs) {
                *t = &v.value;
            }
            &few[..inputs.len()]
        } else {
            many = inputs.iter().map(|v| &v.value).collect();
            &many
        };
        let span = crate::profile::start();
        let (value, state) = op.forward(tensors)?;
        crate::profile::stop(span, name, Phase::Forward, value.shape().len());
        let tape = first.tape.clone();
        let kind = if requires_grad {
            Kind::Op {
                bw: Box::new(Recorded {
                    op,
                    state,
                    _t: std::marker::PhantomData,
                }),
                inputs: Dims::collect(inputs.iter().map(|v| v.id)),
            }
        } else {
            Kind::Leaf(None)
        };
        let id = tape.push(Node {
            requires_grad,
            shape: Dims::from_slice(value.shape()),
            kind,
        });
        Ok(Var {
            tape,
            id,
            value,
            requires_grad,
        })
    }

    fn sweep(&self, root: usize, seed: Tensor<T>) -> Result<Gradients<T>> {
        self.sweep_notifying(root, seed, None)
    }

    /// The reverse sweep; with `notify`, each watched leaf is announced as
    /// soon as no node left to visit can add to its gradient.
    fn sweep_notifying(
        &self,
        root: usize,
        seed: Tensor<T>,
        mut notify: Option<(&[Var<T>], &mut dyn GradReady<T>)>,
    ) -> Result<Gradients<T>> {
        let nodes = self.inner.nodes.borrow();
        let mut grads: Vec<Option<Tensor<T>>> = vec![None; root + 1];
        if nodes[root].requires_grad {
            grads[root] = Some(seed);
        }
        // due[i]: the watched leaves whose last contribution comes from node
        // i, their first consumer (the sweep visits consumers newest first).
        let mut due: Vec<Vec<usize>> = Vec::new();
        let mut late = Vec::new();
        if let Some((watch, _)) = &notify {
            // first[j]: the oldest node that takes node j as an input.
            let mut first = vec![usize::MAX; root + 1];
            for (i, n) in nodes.iter().enumerate().take(root + 1) {
                if let Kind::Op { inputs, .. } = &n.kind {
                    for &j in inputs.iter() {
                        first[j] = first[j].min(i);
                    }
                }
            }
            due = vec![Vec::new(); root + 1];
            for (k, v) in watch.iter().enumerate() {
                if !self.same(&v.tape) || !v.requires_grad {
                    return Err(Error::NoGradient {
                        op: "backward_notify",
                        id: v.id,
                    });
                }
                match first.get(v.id) {
                    Some(&i) if i != usize::MAX => due[i].push(k),
                    _ => late.push(k),
                }
            }
        }
        let mut needs = Vec::new();
        for i in (0..=root).rev() {
            Self::visit(&nodes, i, &mut grads, &mut needs)?;
            if let Some((watch, hook)) = &mut notify {
                for &k in &due[i] {
                    hook.ready(k, &leaf_grad(&grads, &watch[k])?)?;
                }
                hook.tick()?;
            }
        }
        if let Some((watch, hook)) = &mut notify {
            for &k in &late {
                hook.ready(k, &leaf_grad(&grads, &watch[k])?)?;
            }
        }
        Ok(Gradients {
            tape: self.clone(),
            grads,
        })
    }

    /// Node `i`'s backward: its inputs' gradients accumulated into `grads`.
    fn visit(
        nodes: &[Node<T>],
        i: usize,
        grads: &mut [Option<Tensor<T>>],
        needs: &mut Vec<bool>,
    ) -> Result<()> {
        let node = &nodes[i];
        let Kind::Op { bw, inputs } = &node.kind else {
            return Ok(());
        };
        let Some(g) = grads[i].take() else {
            return Ok(());
        };
        needs.clear();
        needs.extend(inputs.iter().map(|&j| nodes[j].requires_grad));
        let span = crate::profile::start();
        let gin = bw.backward(&g, needs)?;
        crate::profile::stop(span, bw.name(), Phase::Backward, node.shape.len());
        grads[i] = Some(g);
        if gin.len() != inputs.len() {
            return Err(Error::InvalidArgument {
                op: bw.name(),
                msg: format!(
                    "backward returned {} gradients for {} inputs",
                    gin.len(),
                    inputs.len()
                ),
            });
        }
        for ((&j, gj), &need) in inputs.iter().zip(gin).zip(needs.iter()) {
            if !need {
                continue;
            }
            // A missing gradient would silently cut the graph.
            let Some(gj) = gj else {
                return Err(Error::NoBackward { op: bw.name() });
            };
            let rank = nodes[j].shape.len();
            let span = crate::profile::start();
            let gj = sum_to_shape(bw.name(), &gj, &nodes[j].shape)?;
            crate::profile::stop(span, bw.name(), Phase::SumToShape, rank);
            grads[j] = Some(match grads[j].take() {
                None => gj,
                Some(acc) => {
                    let span = crate::profile::start();
                    let sum = accumulate(acc, &gj)?;
                    crate::profile::stop(span, "accumulate", Phase::Accumulate, rank);
                    sum
                }
            });
        }
        Ok(())
    }
}

/// Told of each watched leaf's final gradient during a reverse sweep
/// ([`Var::backward_notify`]), e.g. to start communicating it while the
/// sweep goes on.
pub trait GradReady<T: Element> {
    /// `watch[index]`'s gradient is final (zeros if the loss does not
    /// depend on it).
    fn ready(&mut self, index: usize, grad: &Tensor<T>) -> Result<()>;
    /// Called after each node of the sweep: a place to drive communication
    /// that progresses only when polled.
    fn tick(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The gradient a sweep holds for `v`, or zeros where the loss does not
/// depend on it.
fn leaf_grad<T: Element>(grads: &[Option<Tensor<T>>], v: &Var<T>) -> Result<Tensor<T>> {
    match grads.get(v.id) {
        Some(Some(g)) => Ok(g.clone()),
        _ => Tensor::zeros(v.shape())?.to_device(v.value.device()),
    }
}

/// `acc + g` (same shapes), through the device's add kernel.
fn accumulate<T: Element>(acc: Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    crate::ops::elementwise::binary("accumulate", Binary::Add, &acc, g)
}

impl<T: Element> Var<T> {
    /// The forward value.
    pub fn value(&self) -> &Tensor<T> {
        &self.value
    }

    /// The value's shape.
    pub fn shape(&self) -> &[usize] {
        self.value.shape()
    }

    /// Node id on its tape.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The tape this Var is recorded on.
    pub fn tape(&self) -> &Tape<T> {
        &self.tape
    }

    /// Whether a gradient flows to this Var.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// Reverse sweep from a scalar (one-element) loss, seeded with 1.
    pub fn backward(&self) -> Result<Gradients<T>> {
        self.tape.check_grad("backward")?;
        if self.value.numel() != 1 {
            return Err(Error::NonScalarLoss {
                shape: self.shape().to_vec(),
            });
        }
        // Ones on the loss's own device.
        let seed = crate::ops::elementwise::unary(Unary::Fill(1.0), &self.value)?;
        self.tape.sweep(self.id, seed)
    }

    /// [`Var::backward`] that tells `hook` of each Var in `watch` as soon
    /// as its gradient is final, in the order the sweep finishes them,
    /// and calls [`GradReady::tick`] after every node. The gradients are
    /// the same as [`Var::backward`]'s.
    pub fn backward_notify(
        &self,
        watch: &[Var<T>],
        hook: &mut dyn GradReady<T>,
    ) -> Result<Gradients<T>> {
        self.tape.check_grad("backward_notify")?;
        if self.value.numel() != 1 {
            return Err(Error::NonScalarLoss {
                shape: self.shape().to_vec(),
            });
        }
        let seed = crate::ops::elementwise::unary(Unary::Fill(1.0), &self.value)?;
        self.tape
            .sweep_notifying(self.id, seed, Some((watch, hook)))
    }

    /// Reverse sweep seeded with `seed` (a cotangent of this Var's shape).
    pub fn backward_with(&self, seed: &Tensor<T>) -> Result<Gradients<T>> {
        self.tape.check_grad("backward_with")?;
        if seed.shape() != self.shape() {
            return Err(Error::SeedShape {
                output: self.shape().to_vec(),
                seed: seed.shape().to_vec(),
            });
        }
        if seed.device() != self.value.device() {
            return Err(Error::DeviceMismatch {
                op: "backward_with",
                lhs: self.value.device().to_string(),
                rhs: seed.device().to_string(),
            });
        }
        self.tape.sweep(self.id, seed.clone())
    }
}

/// The result of a backward sweep.
pub struct Gradients<T: Element> {
    tape: Tape<T>,
    grads: Vec<Option<Tensor<T>>>,
}

impl<T: Element> Gradients<T> {
    /// d(loss)/d(var): zeros if `var` does not affect the loss; an error for
    /// a Var of another tape or one that takes no gradient.
    pub fn wrt(&self, var: &Var<T>) -> Result<Tensor<T>> {
        if !self.tape.same(&var.tape) {
            return Err(Error::NotOnTape {
                op: "Gradients::wrt",
                id: var.id,
            });
        }
        if !var.requires_grad {
            return Err(Error::NoGradient {
                op: "Gradients::wrt",
                id: var.id,
            });
        }
        leaf_grad(&self.grads, var)
    }
}
