//! The training front ends (`fusegrad_cli::app`, `fusegrad train ...`): small
//! runs whose loss falls, fused and composed agreeing, plots that decode,
//! observers that see every step, and the command line's errors.

use fusegrad::nn::GptConfig;
use fusegrad::nn::{Observer, Step};
use fusegrad_cli::app::{spirals, transformer};
use fusegrad_cli::char_lm::CharLmConfig;
use fusegrad_cli::demo::{train_spirals_observed, SpiralConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Width and height of a PNG file, and its number of distinct colours.
fn png_facts(path: &Path) -> (u32, u32, usize) {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let mut colours: Vec<&[u8]> = buf[..info.buffer_size()].chunks_exact(3).collect();
    colours.sort_unstable();
    colours.dedup();
    (info.width, info.height, colours.len())
}

#[derive(Default)]
struct Record(Vec<Step>);

impl Observer for Record {
    fn on_step(&mut self, s: &Step) {
        self.0.push(*s);
    }
}

#[test]
fn the_observer_sees_every_step_with_its_loss() {
    let config = SpiralConfig {
        steps: 12,
        ..SpiralConfig::default()
    };
    let mut rec = Record::default();
    let report = train_spirals_observed::<f32>(&config, &mut rec).unwrap();
    let n = config.classes * config.per_class;
    assert_eq!(rec.0.len(), 12);
    for (i, s) in rec.0.iter().enumerate() {
        assert_eq!((s.step, s.steps, s.items), (i + 1, 12, (i + 1) * n));
        assert_eq!(s.loss, report.losses[i]);
        assert!(s.rate() >= 0.0 && s.seconds >= 0.0);
    }
}

#[test]
fn spirals_run_falls_agrees_and_plots() {
    let dir = tmp("app-spirals");
    let o = spirals::Options {
        config: SpiralConfig {
            steps: 60,
            ..SpiralConfig::default()
        },
        composed: true,
        plots: Some(dir.clone()),
        ..spirals::Options::default()
    };
    let s = spirals::run(&o).unwrap();
    let first = s.fused.losses[0];
    assert!(
        s.fused.final_loss < 0.7 * first,
        "{first} -> {}",
        s.fused.final_loss
    );
    let a = s.agreement.unwrap();
    assert!(
        a.max_rel_diff < 1e-3,
        "fused vs composed {}",
        a.max_rel_diff
    );
    assert_eq!(
        s.plots,
        [dir.join("spirals_loss.png"), dir.join("spirals_loss.svg")]
    );
    let (w, h, colours) = png_facts(&s.plots[0]);
    assert_eq!((w, h), (900, 560));
    assert!(colours > 20, "{colours} colours: text is anti-aliased");
    let svg = std::fs::read_to_string(&s.plots[1]).unwrap();
    assert!(svg.contains("fused LayerNorm") && svg.contains("composed LayerNorm"));
}

#[test]
fn transformer_run_falls_agrees_saves_and_resumes() {
    let dir = tmp("app-transformer");
    let text: String = (0..400)
        .map(|i| format!("fn add{}(a: i32) -> i32 {{ a + {} }}\n", i % 7, i % 3))
        .collect();
    let text_file = dir.join("text.rs");
    std::fs::write(&text_file, text).unwrap();
    let config = CharLmConfig {
        model: GptConfig {
            vocab: 0,
            context: 16,
            width: 32,
            heads: 2,
            layers: 2,
        },
        batch: 8,
        steps: 40,
        time_limit: Duration::MAX,
        lr: 3e-3,
        warmup: 5,
        eval_every: 20,
        eval_batches: 2,
        ..CharLmConfig::default()
    };
    let weights = dir.join("w.safetensors");
    let o = transformer::Options {
        config,
        text: Some(text_file),
        composed: true,
        save: Some(weights.clone()),
        plots: Some(dir.clone()),
        ..transformer::Options::default()
    };
    let s = transformer::run(&o).unwrap();
    let (first, last) = (s.fused.evals[0].val_bits, s.fused.evals[2].val_bits);
    assert!(last < 0.8 * first, "validation {first} -> {last}");
    assert!(s.max_rel_diff.unwrap() < 1e-3, "{:?}", s.max_rel_diff);
    assert_eq!(s.composed.as_ref().unwrap().losses.len(), 40);
    assert!(weights.exists());
    assert_eq!(png_facts(&s.plots[0]).0, 900);
    // Resuming from the saved weights starts where the first run ended.
    let again = transformer::Options {
        config: CharLmConfig { steps: 0, ..config },
        load: Some(weights),
        save: None,
        composed: false,
        plots: None,
        ..o
    };
    let r = transformer::run(&again).unwrap();
    assert!(r.plots.is_empty());
    let resumed = r.fused.evals[0].val_bits;
    assert!((resumed - last).abs() < 1e-9, "{resumed} vs {last}");
}

#[test]
fn defaults_on_the_command_line_match_the_library() {
    let m = transformer::command("t").get_matches_from(["t"]);
    let o = transformer::Options::from_matches(&m).unwrap();
    assert_eq!(
        o,
        transformer::Options {
            progress: true,
            ..transformer::Options::default()
        }
    );
    let m = spirals::command("s").get_matches_from(["s"]);
    let o = spirals::Options::from_matches(&m).unwrap();
    assert_eq!(
        o,
        spirals::Options {
            progress: true,
            ..spirals::Options::default()
        }
    );
    for bad in ["--minutes=-1", "--minutes=NaN"] {
        let m = transformer::command("t")
            .try_get_matches_from(["t", bad])
            .unwrap();
        assert!(transformer::Options::from_matches(&m).is_err(), "{bad}");
    }
}

fn fusegrad(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fusegrad"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn train_command_prints_plain_lines_when_piped() {
    let dir = tmp("cli-spirals");
    let plots = dir.to_str().unwrap();
    let (code, out, err) = fusegrad(&["train", "spirals", "--steps", "25", "--plots", plots]);
    assert_eq!(code, 0, "{err}");
    // No bar on a pipe: no carriage returns or escape codes in the figures.
    assert!(!out.contains('\r') && !out.contains('\u{1b}'), "{out:?}");
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "{err:?}");
    assert!(out
        .lines()
        .any(|l| l.starts_with("fused:") && l.contains("samples/s")));
    assert!(out.contains("loss plot:"));
    assert!(dir.join("spirals_loss.png").exists() && dir.join("spirals_loss.svg").exists());
}

/// `--device cuda`: where a GPU is usable (this process's own check, so
/// not the emulation the CUDA tests load) a short run must train there;
/// elsewhere it is a clear error. `FUSEGRAD_REQUIRE_GPU=1` demands the GPU.
fn cuda_trains_or_says_why() {
    let usable = fusegrad::Device::Cuda(0).ensure_available();
    if std::env::var("FUSEGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        if let Err(e) = &usable {
            panic!("FUSEGRAD_REQUIRE_GPU=1, but cuda:0 cannot be used: {e}");
        }
    }
    if usable.is_err() {
        let (code, _, err) = fusegrad(&["train", "transformer", "--device", "cuda"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("CUDA unavailable"), "{err}");
        return;
    }
    let dir = tmp("cli-transformer-cuda");
    let plots = dir.to_str().unwrap();
    let args = ["train", "transformer", "--device", "cuda", "--steps", "2"];
    let (code, out, err) = fusegrad(&[&args[..], &["--plots", plots]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("cuda:0"),
        "the run must say it trains on cuda:0:\n{out}"
    );
    let fused = out.lines().find(|l| l.starts_with("fused: 2 steps"));
    let fused = fused.unwrap_or_else(|| panic!("no loss line in\n{out}"));
    let bits = fused.split("final validation ").nth(1);
    let bits = bits.and_then(|b| b.split(' ').next()?.parse::<f64>().ok());
    assert!(bits.is_some_and(|b| b.is_finite() && b > 0.0), "{fused}");
}

#[test]
fn command_line_errors_are_clear() {
    let (code, _, err) = fusegrad(&["train", "spirals", "--bogus"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bogus") && err.contains("Usage"), "{err}");
    cuda_trains_or_says_why();
    let (code, _, err) = fusegrad(&["train", "transformer", "--steps", "many"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = fusegrad(&["stability", "--plot", "out.txt"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(".svg or .png"), "{err}");
    let (code, out, _) = fusegrad(&["train", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("spirals") && out.contains("transformer"),
        "{out}"
    );
    let (code, out, _) = fusegrad(&["train", "transformer", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--text",
        "--steps",
        "--composed",
        "--device",
        "--save",
        "--load",
        "--seed",
    ] {
        assert!(out.contains(flag), "{flag} missing from\n{out}");
    }
}

/// `train spirals --shadow 5`: the per-layer table, the verdict and the
/// plot; then `fusegrad replay` on a file made by a shadow with an injected
/// fault prints both paths and fails while they differ.
#[test]
fn shadow_table_plot_and_replay_on_the_command_line() {
    let dir = tmp("cli-shadow");
    let plots = dir.to_str().unwrap();
    let args = [
        "train", "spirals", "--steps", "20", "--shadow", "5", "--plots", plots,
    ];
    let (code, out, err) = fusegrad(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("shadow check, fused vs composed every 5 steps"),
        "{out}"
    );
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("layer_norm "))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    // Steps 5, 10, 15 and 20 are checked.
    assert!(
        rows.iter()
            .all(|r| r.split_whitespace().nth(2) == Some("4")),
        "{out}"
    );
    assert!(out.contains("every layer within tolerance"), "{out}");
    assert!(dir.join("spirals_shadow.png").exists() && dir.join("spirals_shadow.svg").exists());
    let (w, h, colours) = png_facts(&dir.join("spirals_shadow.png"));
    assert!(
        w > 400 && h > 300 && colours > 3,
        "{w}x{h}, {colours} colours"
    );

    use fusegrad::shadow::Fault;
    use fusegrad::{ops, Shadow, ShadowConfig, Tape, Tensor};
    let shadow = Shadow::new(ShadowConfig {
        replay_dir: Some(dir.join("replays")),
        fault: Some(Fault {
            op: "layer_norm".into(),
            step: 0,
            call: 0,
            result: "y".into(),
            row: 1,
            delta: 3.0,
        }),
        ..ShadowConfig::every(1)
    });
    let tape = Tape::<f32>::new();
    shadow.watch(&tape, 0);
    let x: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let x = tape.var(Tensor::from_vec(vec![3, 8], x).unwrap());
    ops::layer_norm(&x, None, None, 1e-5).unwrap();
    let file = shadow.sites()[0].replay.clone().expect("a replay file");
    let (code, out, err) = fusegrad(&["replay", file.to_str().unwrap()]);
    // Rerun without the fault, the fused and composed paths agree.
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("layer_norm (f32) at layer_norm#0, step 0, call 0: y differed"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("y ") && l.contains("within")),
        "{out}"
    );
    let (code, _, err) = fusegrad(&["replay", dir.join("missing.safetensors").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("missing.safetensors"), "{err}");
}

#[test]
fn bench_train_reports_speed_memory_and_a_breakdown_that_adds_up() {
    let args = [
        "bench", "--train", "--json", "--steps", "2", "--warmup", "1",
    ];
    let (code, out, err) = fusegrad(&[&args[..], &["--profile-every", "1"]].concat());
    assert_eq!(code, 0, "{err}");
    let json = out.trim();
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let median = v["step_ms_median"].as_f64().unwrap();
    let tps = v["tokens_per_s"].as_f64().unwrap();
    assert!(median > 0.0 && tps > 0.0, "{json}");
    // tokens/s is batch * context over the median step.
    let tokens = v["batch"].as_f64().unwrap() * v["context"].as_f64().unwrap();
    assert!((tps - tokens / (median / 1e3)).abs() / tps < 1e-3, "{json}");
    assert_eq!(v["steps"].as_u64(), Some(2));
    assert!(v["vocab"].as_u64().unwrap() > 10);
    if cfg!(target_os = "linux") {
        let peak = v["peak_rss_mb"].as_f64().unwrap();
        let rise = v["peak_rss_increase_mb"].as_f64().unwrap();
        assert!(peak > 0.0 && rise > 0.0 && rise <= peak, "{json}");
    }
    // Two profiled steps; their rows add up to their wall time, and the
    // step's big families were seen.
    let b = &v["breakdown"];
    assert_eq!(b["steps"].as_u64(), Some(2), "{json}");
    let wall = b["wall_ms"].as_f64().unwrap();
    let fams = b["families"].as_array().unwrap();
    let sum: f64 = fams.iter().map(|f| f["ms"].as_f64().unwrap()).sum();
    assert!(
        (sum - wall).abs() <= 0.01 * wall,
        "rows {sum} ms, wall {wall} ms"
    );
    let ms = |name: &str| {
        let row = fams
            .iter()
            .find(|f| f["family"].as_str().unwrap().starts_with(name));
        row.unwrap_or_else(|| panic!("no family {name}: {json}"))["ms"]
            .as_f64()
            .unwrap()
    };
    // The model's attention is the fused op: no separate softmax or mask.
    for family in ["matmul (Linear", "attention: fused", "norms", "GELU"] {
        assert!(ms(family) > 0.0, "{family}: {json}");
    }
    assert!(ms("optimizer") > 0.0 && ms("gradient clipping") > 0.0);
    // Each op of the model, forward and backward, is tallied.
    let ops = b["ops"].as_array().unwrap();
    let seen = |op: &str, phase: &str| {
        ops.iter()
            .any(|o| o["op"].as_str() == Some(op) && o["phase"].as_str() == Some(phase))
    };
    for op in [
        "linear",
        "layer_norm",
        "gelu",
        "attention_qkv",
        "cross_entropy",
        "embedding",
    ] {
        assert!(seen(op, "forward") && seen(op, "backward"), "{op}: {json}");
    }
    // The shadow check's cost: one pair of 2-step blocks, every layer in
    // tolerance, a finite overhead.
    let cost = [
        "bench", "--train", "--warmup", "1", "--shadow", "2", "--pairs", "1",
    ];
    let (code, out, err) = fusegrad(&cost);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("shadow check every 2 steps: "));
    let line = line.unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.ends_with("every layer within tolerance: true"),
        "{line}"
    );
    let pct: f64 = line
        .split(": ")
        .nth(1)
        .unwrap()
        .split('%')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pct.is_finite() && pct > -90.0, "{line}");
    // Without profiled steps there is no breakdown.
    let (code, out, err) = fusegrad(&[&args[..], &["--profile-every", "0"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("breakdown") && out.contains("tokens_per_s"),
        "{out}"
    );
    // The CPU bench takes no GPU or per-shape options.
    let (code, _, err) = fusegrad(&["bench", "--steps", "2"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = fusegrad(&["bench", "--train", "--device", "cuda"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("CPU only"), "{err}");
}
