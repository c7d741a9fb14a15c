//! `fusegrad train ... --checkpoint DIR` and `--resume DIR` under faults: a
//! run killed with SIGKILL and resumed ends bitwise where an unbroken run
//! does (spirals and transformer, f32 and bf16); kills at random moments
//! during saves never leave a checkpoint that fails to load; a full disk
//! or a failed write leaves the previous checkpoint whole.

use fusegrad::nn::{load_checkpoint, Adam, AdamConfig, Checkpoints};
use fusegrad_cli::demo::{spiral_model, spirals_checkpoint_config, SpiralConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusegrad-{}-ckcli-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_fusegrad")
}

/// The command line of a short run of `model` in `dtype` to `steps`.
fn run_args(model: &str, dtype: &str, steps: usize, work: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        model,
        "--dtype",
        dtype,
        "--steps",
        &steps.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if model == "transformer" {
        let text = work.join("text.txt");
        // A fixed text of the project's own (its first 12,000 bytes).
        let readme =
            String::from_utf8_lossy(&include_bytes!("../../README.md")[..12_000]).into_owned();
        std::fs::write(&text, readme).unwrap();
        a.extend(["--text".into(), text.display().to_string()]);
    }
    a.extend(["--plots".into(), work.join("plots").display().to_string()]);
    a
}

fn fusegrad(args: &[String]) -> (bool, String, String) {
    let out = Command::new(exe()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with(mut a: Vec<String>, more: &[&str]) -> Vec<String> {
    a.extend(more.iter().map(|s| s.to_string()));
    a
}

/// The `checkpoint:` line printed for `step`, without its folder.
fn saved_line(out: &str, step: usize) -> String {
    let tail = format!("(step {step}, training loss");
    out.lines()
        .find(|l| l.starts_with("checkpoint:") && l.contains(&tail))
        .map(|l| l[l.find(&tail).unwrap_or(0)..].to_string())
        .unwrap_or_else(|| panic!("no checkpoint line for step {step} in {out}"))
}

/// `state.json`'s losses and validation values (not its wall-clock times).
fn history(ck: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("state.json")).unwrap()).unwrap();
    let evals = v["evals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| serde_json::json!([e["step"], e["val_bits"]]))
        .collect();
    (v["losses"].clone(), evals)
}

#[test]
fn a_run_killed_and_resumed_ends_bitwise_as_an_unbroken_one() {
    for (model, n) in [("spirals", 6), ("transformer", 3)] {
        for dtype in ["f32", "bf16"] {
            let work = tmp(&format!("resume-{model}-{dtype}"));
            let base = run_args(model, dtype, 2 * n, &work);
            let every = n.to_string();
            let (r, k, k2) = (work.join("r"), work.join("k"), work.join("k2"));
            let d = |p: &Path| p.display().to_string();
            let (ok, whole, err) = fusegrad(&with(
                base.clone(),
                &["--checkpoint", &d(&r), "--checkpoint-every", &every],
            ));
            assert!(ok, "{err}");
            // The same run, killed with SIGKILL once its step-N checkpoint exists.
            let mut child = Command::new(exe())
                .args(with(
                    base.clone(),
                    &["--checkpoint", &d(&k), "--checkpoint-every", &every],
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let first = k.join(format!("step-{n:08}"));
            let t0 = Instant::now();
            while !first.exists() && t0.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(1));
            }
            child.kill().unwrap();
            child.wait().unwrap();
            // Resumed from step N (into another folder, whether or not the
            // killed run got further).
            let (ok, resumed, err) = fusegrad(&with(
                base,
                &["--resume", &d(&first), "--checkpoint", &d(&k2)],
            ));
            assert!(ok, "{err}");
            assert!(resumed.contains(&format!("at step {n}")), "{resumed}");
            let last = format!("step-{:08}", 2 * n);
            for f in ["model.safetensors", "optimizer.safetensors"] {
                let a = std::fs::read(r.join(&last).join(f)).unwrap();
                let b = std::fs::read(k2.join(&last).join(f)).unwrap();
                assert!(
                    a == b,
                    "{model} {dtype}: {f} after a resume differs from the unbroken run's"
                );
            }
            assert_eq!(
                history(&r.join(&last)),
                history(&k2.join(&last)),
                "{model} {dtype}"
            );
            assert_eq!(saved_line(&whole, 2 * n), saved_line(&resumed, 2 * n));
            std::fs::remove_dir_all(&work).unwrap();
        }
    }
}

/// Every complete checkpoint in `dir` loads into the spirals model of
/// `config`.
fn all_load(dir: &Path, config: &SpiralConfig) -> usize {
    let list = Checkpoints::new(dir).list().unwrap();
    for (_, p) in &list {
        let mut model = spiral_model::<f32>(config).unwrap();
        let mut opt = Adam::<f32>::new(AdamConfig {
            lr: config.lr,
            ..AdamConfig::default()
        })
        .unwrap();
        if let Err(e) = load_checkpoint(p, &mut model, &mut opt, &spirals_checkpoint_config(config))
        {
            panic!("{} does not load after a kill: {e}", p.display());
        }
    }
    list.len()
}

fn hidden_leftovers(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(".step-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn kills_at_random_moments_never_leave_a_checkpoint_that_fails_to_load() {
    let work = tmp("kills");
    let ck = work.join("ck");
    let config = SpiralConfig {
        hidden: 256,
        ..SpiralConfig::default()
    };
    let base = with(
        run_args("spirals", "f32", 1_000_000, &work),
        &["--hidden", "256", "--checkpoint-every", "1", "--keep", "2"],
    );
    let mut rng = fusegrad::rng::Rng::new(11);
    let (mut kills, mut mid_save, mut newest) = (0, 0, 0);
    let t0 = Instant::now();
    while kills < 60 && t0.elapsed() < Duration::from_secs(150) {
        let resume = Checkpoints::new(&ck).latest().unwrap().is_some();
        let flag = if resume { "--resume" } else { "--checkpoint" };
        let mut child = Command::new(exe())
            .args(with(base.clone(), &[flag, &ck.display().to_string()]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(20_000 + rng.below(100_000) as u64));
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        if hidden_leftovers(&ck) > 0 {
            mid_save += 1;
        }
        all_load(&ck, &config);
        let step = Checkpoints::new(&ck)
            .list()
            .unwrap()
            .last()
            .map_or(0, |s| s.0);
        assert!(
            step >= newest,
            "the newest checkpoint went back from {newest} to {step}"
        );
        newest = step;
    }
    eprintln!(
        "{kills} kills, {mid_save} inside a save or a prune; newest checkpoint step {newest}"
    );
    assert!(kills >= 50, "only {kills} kills in the time");
    assert!(mid_save > 0, "no kill landed inside a save");
    assert!(newest > 0, "no checkpoint was ever completed");
    std::fs::remove_dir_all(&work).unwrap();
}

/// Runs `script` in bash with `$FG` the command; output and success.
fn bash(script: &str, envs: &[(&str, &Path)]) -> (bool, String) {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script).env("FG", exe());
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_full_disk_or_a_failed_write_leaves_the_previous_checkpoint() {
    let work = tmp("full");
    let config = SpiralConfig {
        hidden: 64,
        ..SpiralConfig::default()
    };
    let plots = work.join("plots");
    let run = "$FG train spirals --hidden 64 --plots \"$PLOTS\"";
    // A write past the file-size limit fails (EFBIG) the way a full disk does.
    let ck = work.join("ck");
    let script = format!(
        "{run} --steps 2 --checkpoint \"$CK\" && (trap '' XFSZ; ulimit -f 24; exec {run} --steps 4 --resume \"$CK\")"
    );
    let (ok, out) = bash(&script, &[("CK", &ck), ("PLOTS", &plots)]);
    assert!(!ok, "the limited save succeeded: {out}");
    assert!(
        out.contains("File too large") && out.contains("step-00000004"),
        "{out}"
    );
    assert_eq!(all_load(&ck, &config), 1);
    assert!(
        ck.join("step-00000002").is_dir() && hidden_leftovers(&ck) == 0,
        "{out}"
    );
    // A real full filesystem: a 96 KiB tmpfs in a private mount namespace,
    // where this machine lets one be made (as root, or with user namespaces).
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let (can, why) = bash(
        "unshare -rm sh -c 'mount -t tmpfs -o size=96k tmpfs \"$MNT\"'",
        &[("MNT", &mnt)],
    );
    if !can {
        eprintln!("no tmpfs here, the full-disk half is not run: {why}");
        return;
    }
    let kept = work.join("kept");
    let script = format!(
        "unshare -rm bash -c 'mount -t tmpfs -o size=96k tmpfs \"$MNT\" && {run} --steps 2 --checkpoint \"$MNT/ck\" && \
         {{ {run} --steps 4 --resume \"$MNT/ck\"; echo \"second rc=$?\"; cp -r \"$MNT/ck\" \"$KEPT\"; }}'"
    );
    let (ok, out) = bash(
        &script,
        &[("MNT", &mnt), ("KEPT", &kept), ("PLOTS", &plots)],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("No space left on device") && out.contains("second rc=1"),
        "{out}"
    );
    assert_eq!(all_load(&kept, &config), 1, "{out}");
    assert!(
        kept.join("step-00000002").is_dir() && hidden_leftovers(&kept) == 0,
        "{out}"
    );
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn checkpoint_options_are_checked_and_a_folder_of_another_run_is_not_overwritten() {
    let work = tmp("options");
    let ck = work.join("ck");
    let base = run_args("spirals", "f32", 3, &work);
    let d = ck.display().to_string();
    for (bad, says) in [
        (
            vec!["--checkpoint", &d, "--keep", "0"],
            "keep must be at least 1",
        ),
        (vec!["--checkpoint-every", "2"], "need --checkpoint DIR"),
        (
            vec!["--checkpoint", &d, "--checkpoint-every", "0"],
            "0 is not a number of steps",
        ),
    ] {
        let (ok, _, err) = fusegrad(&with(base.clone(), &bad));
        assert!(!ok && err.contains(says), "{bad:?}: {err}");
    }
    let (ok, _, err) = fusegrad(&with(base.clone(), &["--checkpoint", &d]));
    assert!(ok, "{err}");
    let before = std::fs::read(ck.join("step-00000003/model.safetensors")).unwrap();
    // A fresh run into a folder that holds checkpoints is refused, before
    // any step, and the folder stays as it was.
    let (ok, out, err) = fusegrad(&with(
        run_args("spirals", "f32", 5, &work),
        &["--checkpoint", &d],
    ));
    assert!(
        !ok && err.contains("already holds") && err.contains("--resume"),
        "{out}{err}"
    );
    assert_eq!(
        std::fs::read(ck.join("step-00000003/model.safetensors")).unwrap(),
        before
    );
    assert_eq!(Checkpoints::new(&ck).list().unwrap().len(), 1);
    // Resuming with another width names it.
    let (ok, _, err) = fusegrad(&with(base, &["--resume", &d, "--hidden", "16"]));
    assert!(
        !ok && err.contains("made with hidden 32, this run has hidden 16"),
        "{err}"
    );
    std::fs::remove_dir_all(&work).unwrap();
}
