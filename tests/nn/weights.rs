//! Weights in safetensors: a bit-exact round trip in every element type,
//! mismatched files refused with the module untouched, and a file laid out
//! as PyTorch writes it (Linear weights `[out, in]`) loaded correctly.

use fusegrad::nn::{load, save, Gpt, GptConfig, LayerNorm, Linear, Module, Parameters};
use fusegrad::rng::Rng;
use fusegrad::{Accum, Element, Error, Tensor};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "fusegrad-{}-{name}.safetensors",
        std::process::id()
    ))
}

fn bits<T: Element>(m: &dyn Parameters<T>) -> Vec<Vec<u64>> {
    m.params()
        .iter()
        .map(|p| {
            p.as_slice()
                .unwrap()
                .iter()
                .map(|v| v.to_acc().f64().to_bits())
                .collect()
        })
        .collect()
}

/// Randomizes every parameter (so that norms' ones and zeros are tested too).
fn scramble<T: Element>(m: &mut dyn Parameters<T>, seed: u64) {
    let mut rng = Rng::new(seed);
    for p in m.params_mut() {
        let v: Vec<T> = rng
            .vec(p.numel())
            .iter()
            .map(|x| T::from_acc(<T::Acc as Accum>::of(x - 0.5)))
            .collect();
        *p = Tensor::from_vec(p.shape().to_vec(), v).unwrap();
    }
}

fn gpt<T: Element>(seed: u64) -> Gpt<T> {
    let cfg = GptConfig {
        vocab: 7,
        context: 5,
        width: 8,
        heads: 2,
        layers: 2,
    };
    Gpt::new(cfg, &mut Rng::new(seed)).unwrap()
}

fn round_trip<T: Element>() {
    let path = tmp(&format!("rt-{}", T::NAME));
    let mut a = gpt::<T>(1);
    scramble(&mut a, 2);
    save(&a, &path).unwrap();
    let mut b = gpt::<T>(3);
    assert_ne!(bits(&a), bits(&b));
    load(&mut b, &path).unwrap();
    assert_eq!(bits(&a), bits(&b), "{}", T::NAME);
    std::fs::remove_file(&path).ok();
}

#[test]
fn save_then_load_is_bit_exact_in_every_type() {
    round_trip::<f32>();
    round_trip::<f64>();
    round_trip::<f16>();
    round_trip::<bf16>();
}

#[test]
fn names_are_pytorch_style() {
    let names: Vec<String> = gpt::<f32>(1)
        .param_names()
        .into_iter()
        .map(|n| n.name)
        .collect();
    for want in [
        "wte.weight",
        "wpe.weight",
        "blocks.0.ln1.weight",
        "blocks.1.attn.qkv.bias",
        "blocks.1.fc2.weight",
        "ln_f.bias",
        "head.weight",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

/// Each kind of mismatch is `Error::Weights` naming the tensor, and the
/// model keeps its values.
#[test]
fn mismatched_files_are_refused_and_change_nothing() {
    let path = tmp("mismatch");
    let small = gpt::<f32>(1);
    let cfg = GptConfig {
        width: 12,
        ..*small.config()
    };
    save(&Gpt::<f32>::new(cfg, &mut Rng::new(4)).unwrap(), &path).unwrap();
    let mut m = gpt::<f32>(5);
    let before = bits(&m);
    let e = load(&mut m, &path).unwrap_err();
    assert!(
        matches!(&e, Error::Weights { msg, .. } if msg.contains("wte.weight") && msg.contains("shape")),
        "{e}"
    );
    assert_eq!(bits(&m), before);
    // Another element type.
    save(&gpt::<f64>(1), &path).unwrap();
    let e = load(&mut m, &path).unwrap_err();
    assert!(
        matches!(&e, Error::Weights { msg, .. } if msg.contains("F64")),
        "{e}"
    );
    assert_eq!(bits(&m), before);
    // A name missing, and a name too many.
    let one = Linear::<f32>::new(2, 3, &mut Rng::new(1)).unwrap();
    save(&one, &path).unwrap();
    let ln = |affine| LayerNorm::<f32>::with_options(3, 1e-5, affine).unwrap();
    let mut two = (
        Linear::<f32>::new(2, 3, &mut Rng::new(2)).unwrap(),
        ln(true),
    );
    let before = bits(&two);
    let e = load(&mut two, &path).unwrap_err();
    assert!(
        matches!(&e, Error::Weights { msg, .. } if msg.contains("\"0.weight\"")),
        "{e}"
    );
    assert_eq!(bits(&two), before);
    save(&two, &path).unwrap();
    let mut lone = (
        Linear::<f32>::new(2, 3, &mut Rng::new(3)).unwrap(),
        ln(false),
    );
    let e = load(&mut lone, &path).unwrap_err();
    assert!(
        matches!(&e, Error::Weights { msg, .. } if msg.contains("\"1.bias\"") && msg.contains("not a parameter")),
        "{e}"
    );
    // Not a safetensors file at all; a path that does not exist.
    std::fs::write(&path, b"not weights").unwrap();
    assert!(matches!(load(&mut lone, &path), Err(Error::Weights { .. })));
    std::fs::remove_file(&path).ok();
    assert!(matches!(load(&mut lone, &path), Err(Error::Weights { .. })));
}

/// A file as PyTorch's `save_file(model.state_dict())` writes it for
/// `nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3))`: `0.weight` is
/// `[out, in]`. Loaded, the module computes `x W^T + b`, then the norm.
#[test]
fn loads_a_file_laid_out_as_pytorch_writes_it() {
    let path = tmp("torch");
    let w = [1.0f32, 2.0, -1.0, 0.5, 0.0, 3.0]; // [out 3, in 2]
    let b = [0.1f32, -0.2, 0.3];
    let (g, beta) = ([1.0f32, 2.0, 0.5], [0.0f32, 1.0, -1.0]);
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let blobs = [
        ("0.weight", vec![3, 2], le(&w)),
        ("0.bias", vec![3], le(&b)),
        ("1.weight", vec![3], le(&g)),
        ("1.bias", vec![3], le(&beta)),
    ];
    let views: Vec<_> = blobs
        .iter()
        .map(|(n, s, d)| {
            (
                n.to_string(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let mut m = (
        Linear::<f32>::new(2, 3, &mut Rng::new(1)).unwrap(),
        LayerNorm::<f32>::new(3).unwrap(),
    );
    load(&mut m, &path).unwrap();
    std::fs::remove_file(&path).ok();
    // fusegrad keeps the Linear weight as [in, out].
    assert_eq!(m.0.weight().shape(), &[2, 3]);
    let x = [0.5f32, -1.5];
    let y =
        m.0.predict(&Tensor::from_vec(vec![1, 2], x.to_vec()).unwrap())
            .unwrap();
    let want: Vec<f32> = (0..3)
        .map(|o| x[0] * w[o * 2] + x[1] * w[o * 2 + 1] + b[o])
        .collect();
    assert_eq!(y.as_slice().unwrap(), &want[..]);
    assert_eq!(m.1.gamma().unwrap().as_slice().unwrap(), &g);
    assert_eq!(m.1.beta().unwrap().as_slice().unwrap(), &beta);
}

#[test]
fn a_save_replaces_the_file_whole_and_a_failed_save_keeps_it() {
    let dir = std::env::temp_dir().join(format!("fusegrad-{}-saves", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let (mut a, mut b) = (gpt::<f32>(1), gpt::<f32>(2));
    scramble(&mut a, 3);
    scramble(&mut b, 4);
    save(&a, &path).unwrap();
    save(&b, &path).unwrap();
    let mut back = gpt::<f32>(5);
    load(&mut back, &path).unwrap();
    assert_eq!(bits(&back), bits(&b));
    // A save that cannot be written (here: over a folder) is an error
    // naming the path, and the earlier file and the folder stay as they were.
    let folder = dir.join("a-folder.safetensors");
    std::fs::create_dir(&folder).unwrap();
    let e = save(&a, &folder).unwrap_err().to_string();
    assert!(
        e.contains("a-folder.safetensors") && e.contains("is a folder"),
        "{e}"
    );
    assert!(folder.is_dir());
    load(&mut back, &path).unwrap();
    assert_eq!(bits(&back), bits(&b));
    // No temporary file is left beside them.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
