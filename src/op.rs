//! The `Op` trait: a forward that returns its output plus a typed record of
//! what its backward needs, and a backward that maps the output gradient to
//! input gradients.

use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// One item an op's saved state holds, for memory accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedItem {
    /// A tensor; `id` identifies its storage so shared buffers count once.
    Tensor { id: usize, bytes: usize },
    /// Plain bytes owned by the state (statistics and the like).
    Raw(usize),
}

/// What an op keeps between forward and backward. Implementations list every
/// buffer they hold, so `Tape::saved_bytes` is exact.
pub trait Saved {
    /// Calls `f` once per held buffer.
    fn visit(&self, f: &mut dyn FnMut(SavedItem));
}

impl Saved for () {
    fn visit(&self, _: &mut dyn FnMut(SavedItem)) {}
}

impl<T: Element> Saved for Tensor<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        f(SavedItem::Tensor {
            id: self.storage_id(),
            bytes: self.nbytes(),
        })
    }
}

impl<S: Saved> Saved for Option<S> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        if let Some(s) = self {
            s.visit(f)
        }
    }
}

/// Plain numeric vectors (e.g. per-row statistics) count their bytes.
macro_rules! saved_vec {
    ($($t:ty),*) => {$(
        impl Saved for Vec<$t> {
            fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
                f(SavedItem::Raw(self.len() * std::mem::size_of::<$t>()))
            }
        }
    )*};
}
saved_vec!(f32, f64, usize, u8);

macro_rules! saved_tuple {
    ($($n:tt $t:ident),*) => {
        impl<$($t: Saved),*> Saved for ($($t,)*) {
            fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
                $(self.$n.visit(f);)*
            }
        }
    };
}
saved_tuple!(0 A);
saved_tuple!(0 A, 1 B);
saved_tuple!(0 A, 1 B, 2 C);
saved_tuple!(0 A, 1 B, 2 C, 3 D);

/// A differentiable operation.
///
/// `forward` computes the output and returns the [`Op::State`] its backward
/// needs; nothing else is kept. `backward` returns one entry per input: the
/// gradient for inputs with `needs[i]`, else `None`. A returned gradient may
/// have the broadcast output shape; the tape sums it back to the input's
/// shape in one place (`sum_to_shape` in `ops/reduce/kernel.rs`).
///
/// The gradient graph is never cut silently: an op that cannot
/// differentiate says so with [`Op::differentiable`] (then applying it to an
/// input that requires a gradient is `Error::NoBackward`), and a backward
/// that returns `None` for an input with `needs[i]` makes the sweep fail
/// with `Error::NoBackward` instead of leaving that gradient at zero.
pub trait Op<T: Element>: 'static {
    /// What backward needs, as a type (burn-style).
    type State: Saved + 'static;
    /// The op's name, used in errors and reports.
    fn name(&self) -> &'static str;
    /// False for an op with no backward: [`crate::Tape::apply`] then refuses
    /// inputs that require a gradient with `Error::NoBackward`.
    fn differentiable(&self) -> bool {
        true
    }
    /// Inputs to output plus saved state.
    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)>;
    /// Output gradient to input gradients.
    fn backward(
        &self,
        state: &Self::State,
        grad: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>>;
}
