//! A module's parameters in a safetensors file, under the names of
//! [`Parameters::param_names`], in the module's own element type (f32, f64,
//! f16 or bf16), little-endian and row-major as the format and PyTorch
//! write them. A `Linear` weight is stored `[out, in]`, as PyTorch keeps
//! it, so files move between the two.

use super::{ParamName, Parameters};
use crate::dtype::{Accum, Element};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeSet;
use std::path::Path;

pub(crate) fn err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Weights {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

/// The safetensors dtype of `T`.
fn dtype<T: Element>() -> Dtype {
    match T::NAME {
        "f64" => Dtype::F64,
        "f16" => Dtype::F16,
        "bf16" => Dtype::BF16,
        _ => Dtype::F32,
    }
}

/// `v`'s little-endian bytes (exact: every element type widens to f64
/// and back without rounding).
fn push_bytes<T: Element>(v: T, out: &mut Vec<u8>) {
    let x = v.to_acc().f64();
    match dtype::<T>() {
        Dtype::F64 => out.extend_from_slice(&x.to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
        Dtype::BF16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
        _ => out.extend_from_slice(&(x as f32).to_le_bytes()),
    }
}

/// The element of little-endian `b` (its dtype's width).
fn from_bytes<T: Element>(b: &[u8]) -> T {
    let x = match b.len() {
        8 => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        4 => f32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f64,
        _ => {
            let h = [b[0], b[1]];
            if dtype::<T>() == Dtype::BF16 {
                half::bf16::from_le_bytes(h).to_f64()
            } else {
                half::f16::from_le_bytes(h).to_f64()
            }
        }
    };
    T::from_acc(<T::Acc as Accum>::of(x))
}

/// `t`'s elements with its two dims swapped when `swap`.
pub(crate) fn layout<T: Element>(t: &[T], shape: &[usize], swap: bool) -> (Vec<T>, Vec<usize>) {
    match (swap, shape) {
        (true, &[r, c]) => {
            let mut out = Vec::with_capacity(t.len());
            for j in 0..c {
                out.extend((0..r).map(|i| t[i * c + j]));
            }
            (out, vec![c, r])
        }
        _ => (t.to_vec(), shape.to_vec()),
    }
}

/// Writes `model`'s parameters to `path` as safetensors, atomically: a
/// failed or interrupted save leaves the file that was there (see
/// [`crate::write_atomic`]).
pub fn save<T: Element, M: Parameters<T> + ?Sized>(
    model: &M,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let bytes = params_bytes(model, path)?;
    crate::file::write_atomic(path, &bytes).map_err(|e| err(path, e.to_string()))
}

/// Reads `model`'s parameters from the safetensors file at `path`. Every
/// parameter must be there with its shape and `T`'s dtype, and the file
/// may hold nothing else; the first mismatch is an error that names it,
/// and then the model is left unchanged.
pub fn load<T: Element, M: Parameters<T> + ?Sized>(
    model: &mut M,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| err(path, e.to_string()))?;
    let fresh = read_params(model, &bytes, path)?;
    for (p, t) in model.params_mut().into_iter().zip(fresh) {
        *p = t;
    }
    Ok(())
}

/// `model`'s parameters as the bytes of a safetensors file (`path` names
/// it in errors).
pub(crate) fn params_bytes<T: Element, M: Parameters<T> + ?Sized>(
    model: &M,
    path: &Path,
) -> Result<Vec<u8>> {
    let (params, names) = (model.params(), model.param_names());
    check_names(path, &names, params.len())?;
    let mut entries = Vec::with_capacity(params.len());
    for (p, n) in params.iter().zip(&names) {
        let (vals, shape) = layout(&p.to_vec()?, p.shape(), n.transposed);
        entries.push((n.name.clone(), shape, vals));
    }
    encode(path, entries, None)
}

/// The safetensors bytes of `entries` (name, stored shape, values), all of
/// type `T`, with `metadata` in the header.
pub(crate) fn encode<T: Element>(
    path: &Path,
    entries: Vec<(String, Vec<usize>, Vec<T>)>,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let blobs: Vec<(String, Vec<usize>, Vec<u8>)> = entries
        .into_iter()
        .map(|(n, shape, vals)| {
            let mut bytes = Vec::with_capacity(vals.len() * std::mem::size_of::<T>());
            for v in vals {
                push_bytes(v, &mut bytes);
            }
            (n, shape, bytes)
        })
        .collect();
    let views = blobs
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(dtype::<T>(), s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| err(path, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, metadata).map_err(|e| err(path, e.to_string()))
}

/// The values of tensor `name` in `file`, which must hold it as `T` with
/// the stored shape `shape`; `what` says what it is in errors.
pub(crate) fn decode<T: Element>(
    path: &Path,
    file: &SafeTensors<'_>,
    name: &str,
    shape: &[usize],
    what: &str,
) -> Result<Vec<T>> {
    let view = file
        .tensor(name)
        .map_err(|_| err(path, format!("no tensor named {name:?} ({what} {shape:?})")))?;
    if view.dtype() != dtype::<T>() {
        return Err(err(
            path,
            format!("{name:?} is {:?}, {what} is {}", view.dtype(), T::NAME),
        ));
    }
    if view.shape() != shape {
        return Err(err(
            path,
            format!(
                "{name:?} has shape {:?}, {what} needs {shape:?}",
                view.shape()
            ),
        ));
    }
    let width = view.dtype().bitsize() / 8;
    Ok(view
        .data()
        .chunks_exact(width)
        .map(from_bytes::<T>)
        .collect())
}

/// The first name in `file` that `known` lacks, as an error.
pub(crate) fn no_extra(
    path: &Path,
    file: &SafeTensors<'_>,
    known: &BTreeSet<&str>,
    what: &str,
) -> Result<()> {
    let mut extra: Vec<&str> = file
        .names()
        .into_iter()
        .filter(|n| !known.contains(n))
        .collect();
    extra.sort_unstable();
    match extra.first() {
        Some(x) => Err(err(path, format!("tensor {x:?} is not {what}"))),
        None => Ok(()),
    }
}

/// `model`'s parameters read from the safetensors `bytes`, checked as
/// [`load`] says, each on its parameter's device; the model is not changed.
pub(crate) fn read_params<T: Element, M: Parameters<T> + ?Sized>(
    model: &M,
    bytes: &[u8],
    path: &Path,
) -> Result<Vec<Tensor<T>>> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| err(path, e.to_string()))?;
    let names = model.param_names();
    let params = model.params();
    check_names(path, &names, params.len())?;
    let mut fresh = Vec::with_capacity(params.len());
    for (p, n) in params.iter().zip(&names) {
        let want = stored_shape(n, p.shape());
        let vals = decode::<T>(path, &file, &n.name, &want, "the model's parameter")?;
        let (vals, shape) = layout(&vals, &want, n.transposed);
        // On the parameter's own device (a GPU model loads onto the GPU).
        fresh.push(Tensor::from_vec(shape, vals)?.to_device(p.device())?);
    }
    let known: BTreeSet<&str> = names.iter().map(|n| n.name.as_str()).collect();
    no_extra(path, &file, &known, "a parameter of the model")?;
    Ok(fresh)
}

/// The shape a parameter of `shape` has in the file under `n`.
pub(crate) fn stored_shape(n: &ParamName, shape: &[usize]) -> Vec<usize> {
    match (n.transposed, shape) {
        (true, &[r, c]) => vec![c, r],
        (_, s) => s.to_vec(),
    }
}

/// One name per parameter, no name twice.
fn check_names(path: &Path, names: &[ParamName], params: usize) -> Result<()> {
    if names.len() != params {
        return Err(err(
            path,
            format!("{} names for {params} parameters", names.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n.name.as_str()) {
            return Err(err(
                path,
                format!("parameter name {:?} appears twice", n.name),
            ));
        }
    }
    Ok(())
}
