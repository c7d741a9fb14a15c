//! `Tensor<T>`: a shape plus shared, immutable, row-major storage on one
//! device. Cloning is cheap (the storage is reference counted).

use crate::device::pool::Buffer;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::checked_numel;
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;

/// A short list of `usize` (a shape, a node's inputs) kept inline up to
/// [`Dims::INLINE`] entries, so that small tensors and tape nodes cost no
/// allocation for it.
#[derive(Clone)]
pub(crate) enum Dims {
    Inline(u8, [usize; Dims::INLINE]),
    Heap(Vec<usize>),
}

impl Dims {
    /// Entries kept without allocating.
    pub(crate) const INLINE: usize = 4;

    /// A copy of `s`.
    #[inline]
    pub(crate) fn from_slice(s: &[usize]) -> Self {
        if s.len() <= Self::INLINE {
            let mut a = [0; Self::INLINE];
            a[..s.len()].copy_from_slice(s);
            Dims::Inline(s.len() as u8, a)
        } else {
            Dims::Heap(s.to_vec())
        }
    }

    /// `v`, moved to inline storage when short.
    #[inline]
    pub(crate) fn from_vec(v: Vec<usize>) -> Self {
        if v.len() <= Self::INLINE {
            Self::from_slice(&v)
        } else {
            Dims::Heap(v)
        }
    }

    /// No entries.
    #[inline]
    pub(crate) const fn new() -> Self {
        Dims::Inline(0, [0; Self::INLINE])
    }

    /// Appends `v`, moving to the heap past [`Dims::INLINE`] entries.
    #[inline]
    pub(crate) fn push(&mut self, v: usize) {
        match self {
            Dims::Inline(n, a) if (*n as usize) < Self::INLINE => {
                a[*n as usize] = v;
                *n += 1;
            }
            Dims::Inline(n, a) => {
                let mut h = a[..*n as usize].to_vec();
                h.push(v);
                *self = Dims::Heap(h);
            }
            Dims::Heap(h) => h.push(v),
        }
    }

    /// The entries of an iterator.
    #[inline]
    pub(crate) fn collect(it: impl ExactSizeIterator<Item = usize>) -> Self {
        if it.len() <= Self::INLINE {
            let mut a = [0; Self::INLINE];
            let mut n = 0;
            for (d, v) in a.iter_mut().zip(it) {
                *d = v;
                n += 1;
            }
            Dims::Inline(n as u8, a)
        } else {
            Dims::Heap(it.collect())
        }
    }
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    #[inline]
    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline(n, a) => &a[..(*n as usize).min(Self::INLINE)],
            Dims::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for Dims {
    #[inline]
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline(n, a) => &mut a[..(*n as usize).min(Self::INLINE)],
            Dims::Heap(v) => v,
        }
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Where a tensor's elements live. The device of a tensor is read from
/// here and nowhere else, so data and device cannot disagree.
pub(crate) enum Storage<T: Element> {
    /// Host memory: a pooled, 64-byte aligned buffer.
    Cpu(Buffer<T>),
    /// GPU memory: at least `len` elements on one device.
    #[cfg(feature = "cuda")]
    Cuda(CudaBuf<T>),
}

/// A tensor's elements on a GPU.
#[cfg(feature = "cuda")]
pub(crate) struct CudaBuf<T: Element> {
    pub(crate) gpu: std::sync::Arc<crate::device::cuda::Gpu>,
    pub(crate) data: cudarc::driver::CudaSlice<T>,
    pub(crate) len: usize,
}

impl<T: Element> Storage<T> {
    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Storage::Cpu(b) => b.len(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(b) => b.len,
        }
    }

    /// The device holding the elements.
    pub(crate) fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(b) => Device::Cuda(b.gpu.ordinal),
        }
    }
}

/// An n-dimensional array on a device. It knows nothing of autodiff.
#[derive(Clone)]
pub struct Tensor<T: Element> {
    shape: Dims,
    data: Arc<Storage<T>>,
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}>{:?} on {}",
            T::NAME,
            self.shape,
            self.device()
        )
    }
}

impl<T: Element> Tensor<T> {
    /// Builds a CPU tensor from a vector in row-major order.
    pub fn from_vec(shape: Vec<usize>, data: Vec<T>) -> Result<Self> {
        let n = checked_numel("Tensor::from_vec", &shape, std::mem::size_of::<T>())?;
        if n != data.len() {
            return Err(Error::ElementCount {
                op: "Tensor::from_vec",
                shape,
                len: data.len(),
            });
        }
        Ok(Tensor {
            shape: Dims::from_vec(shape),
            data: Arc::new(Storage::Cpu(Buffer::from_vec(data))),
        })
    }

    /// [`Tensor::from_vec`] with a borrowed shape (no allocation for short
    /// shapes).
    pub(crate) fn from_shape(shape: &[usize], data: Vec<T>) -> Result<Self> {
        Self::wrap("Tensor::from_vec", shape, Buffer::from_vec(data))
    }

    /// `data` with `shape`, if their element counts agree (`op` names the
    /// caller in the error).
    fn wrap(op: &'static str, shape: &[usize], data: Buffer<T>) -> Result<Self> {
        let n = checked_numel(op, shape, std::mem::size_of::<T>())?;
        if n != data.len() {
            return Err(Error::ElementCount {
                op,
                shape: shape.to_vec(),
                len: data.len(),
            });
        }
        Ok(Tensor {
            shape: Dims::from_slice(shape),
            data: Arc::new(Storage::Cpu(data)),
        })
    }

    /// Builds a CPU tensor from a copy of `data` in row-major order. Like
    /// the other constructors that allocate, the kernels' outputs and the
    /// same-shape elementwise outputs (and unlike a vector handed to
    /// [`Tensor::from_vec`], which is kept as it is), the copy starts on a
    /// 64-byte cache line, which the row kernels read fastest.
    pub fn from_slice(shape: &[usize], data: &[T]) -> Result<Self> {
        Self::wrap("Tensor::from_slice", shape, Buffer::copied(data))
    }

    /// Builds a CPU tensor from any ndarray array (copied into row-major
    /// order, 64-byte aligned like [`Tensor::from_slice`]).
    pub fn from_array<D: ndarray::Dimension>(a: ndarray::Array<T, D>) -> Self {
        let shape = Dims::from_slice(a.shape());
        let data = match a.as_slice() {
            Some(s) => Buffer::copied(s),
            None => Buffer::collect(a.len(), a.iter().copied()),
        };
        Tensor {
            shape,
            data: Arc::new(Storage::Cpu(data)),
        }
    }

    /// A tensor of one value.
    pub fn scalar(v: T) -> Self {
        Tensor {
            shape: Dims::from_slice(&[]),
            data: Arc::new(Storage::Cpu(Buffer::from_vec(vec![v]))),
        }
    }

    /// A buffer of `n` elements for a kernel to fill completely, 64-byte
    /// aligned, recycled from the pool when one of that size is free
    /// (contents unspecified). Crate-private: `n` must be the size of a
    /// tensor that already exists.
    pub(crate) fn scratch(n: usize) -> Buffer<T> {
        Buffer::take(n)
    }

    /// A tensor over a kernel's output buffer (see [`Tensor::scratch`]).
    pub(crate) fn from_buffer(shape: &[usize], data: Buffer<T>) -> Result<Self> {
        Self::wrap("Tensor::from_buffer", shape, data)
    }

    /// A tensor filled with `v`. `ShapeTooLarge` if the element or byte
    /// count overflows, `OutOfMemory` if the allocator refuses the buffer.
    pub fn full(shape: &[usize], v: T) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let n = checked_numel("Tensor::full", shape, size)?;
        let data = Buffer::try_filled(n, v).ok_or_else(|| Error::OutOfMemory {
            op: "Tensor::full",
            shape: shape.to_vec(),
            bytes: n.saturating_mul(size),
        })?;
        Self::wrap("Tensor::full", shape, data)
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Result<Self> {
        Self::full(shape, T::ZERO)
    }

    /// Copies the values out as an ndarray array (from any device).
    pub fn to_array(&self) -> Result<ArrayD<T>> {
        ArrayD::from_shape_vec(IxDyn(&self.shape), self.to_vec()?).map_err(|e| {
            Error::InvalidArgument {
                op: "Tensor::to_array",
                msg: e.to_string(),
            }
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The rank (number of dims).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Bytes of element data.
    pub fn nbytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<T>()
    }

    /// The device the data lives on (read from the storage).
    pub fn device(&self) -> Device {
        self.data.device()
    }

    /// The storage, for the device-level kernels to match on.
    pub(crate) fn storage(&self) -> &Storage<T> {
        &self.data
    }

    /// The values, row-major. Host data only: a tensor on any other device
    /// is an error (copy it with [`Tensor::to_device`] first).
    pub fn as_slice(&self) -> Result<&[T]> {
        match &*self.data {
            Storage::Cpu(b) => Ok(b),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::InvalidArgument {
                op: "Tensor::as_slice",
                msg: format!(
                    "the tensor is on {}; copy it to the host with to_device(Device::Cpu) \
                     or to_vec()",
                    self.device()
                ),
            }),
        }
    }

    /// The values, row-major, copied to a host vector from any device.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        match &*self.data {
            Storage::Cpu(b) => Ok(b.to_vec()),
            #[cfg(feature = "cuda")]
            Storage::Cuda(b) => b.gpu.download(&b.data, b.len),
        }
    }

    /// A tensor of `shape` over GPU data (crate-internal constructor for
    /// the CUDA kernels' outputs).
    #[cfg(feature = "cuda")]
    pub(crate) fn from_cuda(
        shape: &[usize],
        gpu: std::sync::Arc<crate::device::cuda::Gpu>,
        data: cudarc::driver::CudaSlice<T>,
    ) -> Result<Self> {
        let len = checked_numel("Tensor", shape, std::mem::size_of::<T>())?;
        Ok(Tensor {
            shape: Dims::from_slice(shape),
            data: Arc::new(Storage::Cuda(CudaBuf { gpu, data, len })),
        })
    }

    /// A copy on `device`; the same tensor (shared storage, no copy) when
    /// it is already there. A device this build or machine cannot use is
    /// `Err(CudaUnavailable)`; nothing panics.
    pub fn to_device(&self, device: Device) -> Result<Self> {
        if device == self.device() {
            return Ok(self.clone());
        }
        device.ensure_available()?;
        #[cfg(feature = "cuda")]
        {
            let host;
            let src: &[T] = match &*self.data {
                Storage::Cpu(b) => b,
                Storage::Cuda(b) => {
                    host = b.gpu.download(&b.data, b.len)?;
                    &host
                }
            };
            match device {
                Device::Cpu => Tensor::from_slice(&self.shape, src),
                Device::Cuda(n) => {
                    let gpu = crate::device::cuda::gpu(n)?;
                    let data = gpu.upload(src)?;
                    Tensor::from_cuda(&self.shape, gpu, data)
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        Err(Error::InvalidArgument {
            op: "Tensor::to_device",
            msg: format!("no copy path from {} to {device}", self.device()),
        })
    }

    /// Same data, new shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        let n = checked_numel("reshape", shape, std::mem::size_of::<T>())?;
        if n != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape.to_vec(),
                rhs: shape.to_vec(),
            });
        }
        Ok(Tensor {
            shape: Dims::from_slice(shape),
            data: self.data.clone(),
        })
    }

    /// Converts every element to another element type.
    /// On a GPU the values make a round trip through the host.
    pub fn cast<U: Element>(&self) -> Result<Tensor<U>> {
        let s = self.to_vec()?;
        Tensor::from_shape(
            &self.shape,
            s.iter().map(|v| U::from_f64(v.to_f64())).collect(),
        )?
        .to_device(self.device())
    }

    /// The values widened to f64, copied to the host from any device.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_vec()?.iter().map(|v| v.to_f64()).collect())
    }

    /// Identity of the storage, used to count shared buffers once.
    pub(crate) fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.data) as usize
    }

    /// Takes the values out as a host vector, copying only if the storage
    /// is shared (a kernel's aligned output is moved to the front of its
    /// allocation). From a GPU it is a copy to the host.
    pub fn into_vec(self) -> Result<Vec<T>> {
        match Arc::try_unwrap(self.data) {
            Ok(Storage::Cpu(b)) => Ok(b.into_vec()),
            #[cfg(feature = "cuda")]
            Ok(Storage::Cuda(b)) => b.gpu.download(&b.data, b.len),
            Err(a) => match &*a {
                Storage::Cpu(b) => {
                    let mut v = crate::device::pool::take::<T>(b.len());
                    v.copy_from_slice(b);
                    Ok(v)
                }
                #[cfg(feature = "cuda")]
                Storage::Cuda(b) => b.gpu.download(&b.data, b.len),
            },
        }
    }
}

// Tensors may be sent to and shared between threads (the storage is an
// `Arc` of immutable data); checked at compile time.
const _: () = {
    const fn send_sync<S: Send + Sync>() {}
    send_sync::<Tensor<f32>>();
    send_sync::<Tensor<f64>>();
    send_sync::<Tensor<half::f16>>();
    send_sync::<Tensor<half::bf16>>();
};

impl<T: Element, D: ndarray::Dimension> From<ndarray::Array<T, D>> for Tensor<T> {
    fn from(a: ndarray::Array<T, D>) -> Self {
        Tensor::from_array(a)
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::{ops, Tape};

    // The tests, run by `tests/unit.rs`.
    unit_tests![tensors_fusegrad_allocates_start_on_a_cache_line];

    fn on_a_line<T: Element>(t: &Tensor<T>) -> bool {
        t.as_slice()
            .is_ok_and(|s| (s.as_ptr() as usize).is_multiple_of(64))
    }

    fn tensors_fusegrad_allocates_start_on_a_cache_line() {
        // 70,000 f32 are past glibc's mmap threshold (blocks 16 bytes past a
        // page); 300,000 are pooled.
        for n in [3usize, 1000, 70_000, 300_000] {
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
            let s = Tensor::from_slice(&[n], &data).unwrap();
            let a = Tensor::from_array(ndarray::Array1::from(data.clone()));
            let t = ndarray::Array2::from_shape_vec((2, n), [data.clone(), data.clone()].concat())
                .unwrap()
                .reversed_axes();
            assert!(t.as_slice().is_none());
            let t = Tensor::from_array(t);
            let f = Tensor::<f32>::full(&[n], 2.5).unwrap();
            let tape = Tape::new();
            let m = ops::scalar_mul(&tape.var(s.clone()), 2.0)
                .unwrap()
                .value()
                .clone();
            let z = ops::add(&tape.var(s.clone()), &tape.var(f.clone()))
                .unwrap()
                .value()
                .clone();
            for (name, t) in [("from_slice", &s), ("from_array", &a), ("transposed", &t)] {
                assert!(on_a_line(t), "{name} n={n}");
            }
            for (name, t) in [("full", &f), ("scalar_mul", &m), ("add", &z)] {
                assert!(on_a_line(t), "{name} n={n}");
            }
            assert_eq!(s.as_slice().unwrap(), &data[..]);
            assert_eq!(a.as_slice().unwrap(), &data[..]);
            let tv = t.as_slice().unwrap();
            assert!((0..n).all(|i| tv[2 * i] == data[i] && tv[2 * i + 1] == data[i]));
            assert!(f.as_slice().unwrap().iter().all(|&v| v == 2.5));
            let (mv, zv) = (m.as_slice().unwrap(), z.as_slice().unwrap());
            assert!((0..n).all(|i| mv[i] == data[i] * 2.0 && zv[i] == data[i] + 2.5));
        }
        fn typed<T: Element>() {
            let n = 70_000;
            let f = Tensor::<T>::full(&[n], T::from_f64(1.5)).unwrap();
            assert!(on_a_line(&f), "full {}", T::NAME);
            let s = Tensor::<T>::from_slice(&[n], f.as_slice().unwrap()).unwrap();
            assert!(on_a_line(&s), "from_slice {}", T::NAME);
            assert!(s.as_slice().unwrap().iter().all(|&v| v == T::from_f64(1.5)));
        }
        typed::<f64>();
        typed::<half::f16>();
        typed::<half::bf16>();
    }
}
