//! A character-level transformer trained on a text.
//!
//! ```text
//! cargo run --release --example tiny_transformer -- [--text FILE] [--steps N]
//!     [--minutes M] [--composed] [--device cpu|cuda] [--seed S]
//!     [--save FILE] [--load FILE]
//! ```
//!
//! Without `--text` it reads this crate's own sources and docs. It prints
//! the text's unigram entropy and a smoothed bigram model's validation
//! loss (both in bits per character: the bars to pass), then the
//! validation loss as the model trains, and a sampled line at the end.
//! `--composed` trains the same model from the same seed twice, with the
//! fused and with the composed LayerNorm, and prints both loss curves.

use fusegrad::nn::char_lm::{new_model, sample, train_model, CharData, CharLmConfig};
use fusegrad::nn::{load, save, NormImpl};
use fusegrad::{rng::Rng, Device};
use std::path::Path;
use std::time::Duration;

fn usage() -> ! {
    eprintln!(
        "usage: tiny_transformer [--text FILE] [--steps N] [--minutes M] [--composed] [--device cpu|cuda] [--seed S] [--save FILE] [--load FILE]"
    );
    std::process::exit(2)
}

/// The crate's `.rs` and `.md` files, read at run time, in a fixed order.
fn own_text() -> std::io::Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "ops", "docs", "examples", "tests"] {
        collect(&root.join(dir), &mut files)?;
    }
    files.push(root.join("README.md"));
    files.sort();
    let mut text = String::new();
    for f in files {
        if let Ok(s) = std::fs::read_to_string(&f) {
            text.push_str(&s);
        }
    }
    Ok(text)
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
            out.push(p);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = CharLmConfig::default();
    let (mut text_file, mut composed) = (None, false);
    let (mut save_to, mut load_from) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--text" => text_file = Some(val()),
            "--steps" => config.steps = val().parse().unwrap_or_else(|_| usage()),
            "--minutes" => {
                let m: f64 = val().parse().unwrap_or_else(|_| usage());
                config.time_limit = Duration::from_secs_f64(m * 60.0);
            }
            "--seed" => config.seed = val().parse().unwrap_or_else(|_| usage()),
            "--composed" => composed = true,
            "--save" => save_to = Some(val()),
            "--load" => load_from = Some(val()),
            "--device" => match val().as_str() {
                "cpu" => {}
                "cuda" => {
                    if let Err(e) = Device::Cuda(0).ensure_available() {
                        eprintln!("--device cuda: {e}");
                        std::process::exit(1);
                    }
                }
                _ => usage(),
            },
            _ => usage(),
        }
    }
    let text = match &text_file {
        Some(f) => std::fs::read_to_string(f)?,
        None => own_text()?,
    };
    let data = CharData::new(&text, config.model.context)?;
    let m = config.model;
    println!(
        "text: {} ({} characters, alphabet {}), train {} / validation {}",
        text_file
            .as_deref()
            .unwrap_or("fusegrad's own sources and docs"),
        data.train.len() + data.val.len(),
        data.vocab(),
        data.train.len(),
        data.val.len()
    );
    println!(
        "model: {} layers, {} heads, width {}, context {}; batch {}, AdamW lr {}, at most {} steps or {:.1} min",
        m.layers,
        m.heads,
        m.width,
        m.context,
        config.batch,
        config.lr,
        config.steps,
        config.time_limit.as_secs_f64() / 60.0
    );
    let (uni, bi) = (data.unigram_bits(), data.bigram_bits());
    println!("unigram entropy:           {uni:.3} bits/char");
    println!("bigram validation loss:    {bi:.3} bits/char (add-one smoothing)");
    println!(
        "target: below {bi:.3} and below {:.3} (unigram - 1.5)",
        uni - 1.5
    );
    println!("{:>6} {:>9} {:>14}", "step", "seconds", "val bits/char");
    let show = |e: &fusegrad::nn::char_lm::EvalPoint| {
        println!("{:>6} {:>9.1} {:>14.4}", e.step, e.seconds, e.val_bits)
    };
    let mut model = new_model(&data, &config, NormImpl::Fused)?;
    if let Some(f) = &load_from {
        load(&mut model, f)?;
        println!("resumed from {f}");
    }
    let start = model.clone();
    let run = train_model(model, &data, &config, show)?;
    if let Some(f) = &save_to {
        save(&run.model, f)?;
        println!("weights written to {f} (safetensors)");
    }
    let last = run.evals.last().map_or(f64::NAN, |e| e.val_bits);
    println!(
        "fused: {} steps, {:.0} tokens/s, final validation {last:.4} bits/char: {} the bigram, {:.2} bits under the unigram",
        run.losses.len(),
        run.tokens_per_s,
        if last < bi { "below" } else { "NOT below" },
        uni - last
    );
    if composed {
        let mut c = config;
        c.steps = run.losses.len();
        c.time_limit = Duration::MAX;
        println!("composed LayerNorm, same seed, {} steps:", c.steps);
        let mut twin = start;
        twin.set_norm_impl(NormImpl::Composed);
        let twin = train_model(twin, &data, &c, show)?;
        println!(
            "{:>6} {:>12} {:>12} {:>10}",
            "step", "fused", "composed", "rel diff"
        );
        let every = (c.steps / 10).max(1);
        let mut worst = 0f64;
        for (s, (f, k)) in run.losses.iter().zip(&twin.losses).enumerate() {
            let rel = (f - k).abs() / f.abs().max(1e-12);
            worst = worst.max(rel);
            if s % every == 0 || s + 1 == c.steps {
                println!("{s:>6} {f:>12.6} {k:>12.6} {rel:>10.2e}");
            }
        }
        println!("largest relative difference of the training loss: {worst:.2e}");
    }
    let mut rng = Rng::new(config.seed + 1);
    let line = sample(&run.model, &data, "pub fn ", 120, 0.8, &mut rng)?;
    println!("sample: pub fn {}", line.lines().next().unwrap_or(""));
    Ok(())
}
