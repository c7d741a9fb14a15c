//! `fusegrad train transformer|spirals --data-parallel`: without a launcher it is
//! a world of one and trains exactly as a plain run; under a launcher it
//! needs the `mpi` build and `--data-parallel`. With a `fusegrad` built
//! with the `mpi` feature named by `FUSEGRAD_MPI_EXE` (its own step in
//! `.ci/run`): two ranks under `mpirun` follow one process on the doubled
//! batch, repeat bit for bit, and a rank that is killed or stopped ends
//! the run with an error that names it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusegrad-{}-dp-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_fusegrad")
}

/// A short transformer run on a fixed text, checkpointed into `work/ck`.
fn args(work: &Path, steps: usize, more: &[&str]) -> Vec<String> {
    let text = work.join("text.txt");
    let readme = String::from_utf8_lossy(&include_bytes!("../../README.md")[..12_000]).into_owned();
    std::fs::write(&text, readme).unwrap();
    let mut a: Vec<String> = ["train", "transformer", "--steps", &steps.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (k, v) in [
        ("--text", text),
        ("--plots", work.join("plots")),
        ("--checkpoint", work.join("ck")),
    ] {
        a.extend([k.to_string(), v.display().to_string()]);
    }
    a.extend(more.iter().map(|s| s.to_string()));
    a
}

/// Success, stdout and stderr of `cmd`.
fn output(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn last_checkpoint(work: &Path) -> PathBuf {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(work.join("ck"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
        })
        .collect();
    steps.sort();
    steps.pop().expect("no checkpoint")
}

/// The two checkpoints hold the same weights, optimizer state and losses,
/// byte for byte.
fn assert_same_state(a: &Path, b: &Path) {
    for f in ["model.safetensors", "optimizer.safetensors"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(losses(a), losses(b));
}

fn losses(ck: &Path) -> Vec<f64> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("state.json")).unwrap()).unwrap();
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn data_parallel_without_a_launcher_trains_exactly_as_a_plain_run() {
    let (a, b) = (tmp("plain"), tmp("world1"));
    let (ok, out, err) = output(Command::new(exe()).args(args(&a, 6, &[])));
    assert!(ok, "{out}{err}");
    let (ok, out, err) =
        output(Command::new(exe()).args(args(&b, 6, &["--data-parallel", "--bucket-mb", "0.01"])));
    assert!(ok, "{out}{err}");
    assert!(out.contains("data parallel: 1 ranks"), "{out}");
    let (ca, cb) = (last_checkpoint(&a), last_checkpoint(&b));
    assert_same_state(&ca, &cb);
}

/// A spirals run checkpointed into `work/ck`.
fn spiral_args(work: &Path, steps: usize, more: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "spirals", "--steps", &steps.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (k, v) in [
        ("--plots", work.join("plots")),
        ("--checkpoint", work.join("ck")),
    ] {
        a.extend([k.to_string(), v.display().to_string()]);
    }
    a.extend(more.iter().map(|s| s.to_string()));
    a
}

#[test]
fn spirals_with_data_parallel_and_no_launcher_train_exactly_as_a_plain_run() {
    let (a, b) = (tmp("spirals-plain"), tmp("spirals-world1"));
    let (ok, out, err) = output(Command::new(exe()).args(spiral_args(&a, 15, &[])));
    assert!(ok, "{out}{err}");
    let (ok, out, err) = output(Command::new(exe()).args(spiral_args(
        &b,
        15,
        &["--data-parallel", "--bucket-mb", "0.001"],
    )));
    assert!(ok, "{out}{err}");
    assert!(out.contains("data parallel: 1 ranks"), "{out}");
    let (ca, cb) = (last_checkpoint(&a), last_checkpoint(&b));
    assert_same_state(&ca, &cb);
    assert_eq!(losses(&ca).len(), 15);
}

#[test]
fn a_launcher_needs_data_parallel_and_data_parallel_options_are_checked() {
    let w = tmp("refused");
    let env = |more: &[&str]| {
        let mut c = Command::new(exe());
        c.args(args(&w, 2, more)).env("OMPI_COMM_WORLD_SIZE", "2");
        output(&mut c)
    };
    let (ok, _, err) = env(&[]);
    assert!(
        !ok && err.contains("one of 2 ranks") && err.contains("add --data-parallel"),
        "{err}"
    );
    #[cfg(not(feature = "mpi"))]
    {
        let (ok, _, err) = env(&["--data-parallel"]);
        assert!(
            !ok && err.contains("built without MPI") && err.contains("--features mpi"),
            "{err}"
        );
    }
    for (flag, value, says) in [
        ("--bucket-mb", "0", "bucket size"),
        ("--bucket-mb", "nan", "bucket size"),
        ("--collective-timeout", "0", "not a time limit"),
        ("--collective-timeout", "nan", "not a time limit"),
    ] {
        let (ok, _, err) =
            output(Command::new(exe()).args(args(&w, 2, &["--data-parallel", flag, value])));
        assert!(!ok && err.contains(says), "{flag} {value}: {err}");
    }
    assert!(!w.join("ck").exists() || std::fs::read_dir(w.join("ck")).unwrap().next().is_none());
}

mod mpi {
    use super::*;
    use std::time::{Duration, Instant};

    /// The `mpi` build of `fusegrad` to test, if `FUSEGRAD_MPI_EXE` names
    /// one; else the test says it was not run.
    fn mpi_exe() -> Option<String> {
        let exe = std::env::var("FUSEGRAD_MPI_EXE").ok();
        if exe.is_none() {
            eprintln!(
                "not run: FUSEGRAD_MPI_EXE does not name a fusegrad built with --features mpi"
            );
        }
        exe
    }

    fn mpirun(n: usize, launcher: &[&str], a: &[String]) -> Command {
        let exe = mpi_exe().unwrap_or_default();
        let mut c = Command::new("mpirun");
        c.args(["-np", &n.to_string(), "--oversubscribe"])
            .args(launcher)
            .arg(exe)
            .args(a)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        c
    }

    /// The tensors of a safetensors file of f32 or f64 values, by name.
    fn tensors(path: &Path) -> Vec<(String, Vec<f64>)> {
        let bytes = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let data = &bytes[8 + n..];
        let mut out = Vec::new();
        for (name, t) in header.as_object().unwrap() {
            if name == "__metadata__" {
                continue;
            }
            let off = t["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let v = match t["dtype"].as_str().unwrap() {
                "F64" => data[a..b]
                    .chunks(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                "F32" => data[a..b]
                    .chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("{other}"),
            };
            out.push((name.clone(), v));
        }
        out
    }

    /// Largest difference relative to the larger of the two magnitudes
    /// of the whole series (per step for losses, per tensor for weights).
    fn worst(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        let scale = a.iter().chain(b).fold(0.0f64, |m, v| m.max(v.abs()));
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0, f64::max)
    }

    /// ||a - b|| / ||b||, the relative error of a whole tensor.
    fn norm_rel(a: &[f64], b: &[f64]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let n: f64 = b.iter().map(|y| y * y).sum();
        (d / n.max(f64::MIN_POSITIVE)).sqrt()
    }

    fn pair(dtype: &str, steps: usize) -> (PathBuf, PathBuf, String) {
        let (one, two) = (tmp(&format!("one-{dtype}")), tmp(&format!("two-{dtype}")));
        let (ok, out, err) = output(Command::new(exe()).args(args(
            &one,
            steps,
            &["--batch", "16", "--dtype", dtype],
        )));
        assert!(ok, "{out}{err}");
        let (ok, out, err) = output(&mut mpirun(
            2,
            &[],
            &args(
                &two,
                steps,
                &[
                    "--batch",
                    "8",
                    "--dtype",
                    dtype,
                    "--data-parallel",
                    "--bucket-mb",
                    "0.25",
                ],
            ),
        ));
        assert!(ok, "{out}{err}");
        (last_checkpoint(&one), last_checkpoint(&two), out)
    }

    #[test]
    fn two_ranks_follow_one_process_on_the_doubled_batch_f32_200_steps() {
        if mpi_exe().is_none() {
            return;
        }
        let (one, two, out) = pair("f32", 200);
        // Rank 0 alone prints: one header, one summary, one sample.
        assert_eq!(out.matches("val bits/char").count(), 1, "{out}");
        assert_eq!(out.matches("fused: 200 steps").count(), 1, "{out}");
        assert!(out.contains("data parallel: 2 ranks"), "{out}");
        let (a, b) = (losses(&one), losses(&two));
        assert_eq!(a.len(), 200);
        let rel = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / x.abs())
            .fold(0.0, f64::max);
        eprintln!("f32, 200 steps: worst relative loss difference {rel:e}");
        assert!(rel < TOL_F32_200, "{rel:e}");
    }

    /// Rounding differences of f32 sums in another order, grown by 200
    /// AdamW steps (docs/distributed.md has the measured growth).
    const TOL_F32_200: f64 = 1e-5;

    #[test]
    fn two_ranks_follow_one_process_in_f64_to_1e_12_and_repeat_bit_for_bit() {
        if mpi_exe().is_none() {
            return;
        }
        let (one, two, _) = pair("f64", 20);
        let rel = worst(&losses(&one), &losses(&two));
        assert!(rel < 1e-12, "losses: {rel:e}");
        let (ta, tb) = (
            tensors(&one.join("model.safetensors")),
            tensors(&two.join("model.safetensors")),
        );
        assert_eq!(ta.len(), tb.len());
        for ((na, a), (nb, b)) in ta.iter().zip(&tb) {
            assert_eq!(na, nb);
            // Looser per tensor: the key bias has a gradient that is zero
            // in exact arithmetic (softmax ignores a shift of the scores),
            // so AdamW moves it by normalized rounding noise.
            let rel = norm_rel(a, b);
            assert!(rel < 1e-10, "{na}: {rel:e}");
        }
        let all =
            |t: &[(String, Vec<f64>)]| t.iter().flat_map(|(_, v)| v.clone()).collect::<Vec<_>>();
        let rel = norm_rel(&all(&ta), &all(&tb));
        assert!(rel < 1e-12, "the parameters: {rel:e}");
        let again = tmp("two-f64-again");
        let (ok, out, err) = output(&mut mpirun(
            2,
            &[],
            &args(
                &again,
                20,
                &[
                    "--batch",
                    "8",
                    "--dtype",
                    "f64",
                    "--data-parallel",
                    "--bucket-mb",
                    "0.25",
                ],
            ),
        ));
        assert!(ok, "{out}{err}");
        assert_same_state(&two, &last_checkpoint(&again));
    }

    /// Spirals is one full batch: its points shared out over 2 ranks
    /// (150 each) or 7 (42 or 43: each rank's loss is weighted by its
    /// share) train as one process does, to f64 rounding.
    #[test]
    fn spirals_on_2_and_7_ranks_follow_one_process_in_f64() {
        if mpi_exe().is_none() {
            return;
        }
        let one = tmp("spirals-one");
        let (ok, out, err) =
            output(Command::new(exe()).args(spiral_args(&one, 30, &["--dtype", "f64"])));
        assert!(ok, "{out}{err}");
        let one = last_checkpoint(&one);
        for n in [2, 7] {
            let w = tmp(&format!("spirals-{n}"));
            let (ok, out, err) = output(&mut mpirun(
                n,
                &[],
                &spiral_args(&w, 30, &["--dtype", "f64", "--data-parallel"]),
            ));
            assert!(ok, "{out}{err}");
            assert_eq!(out.matches("fused:").count(), 1, "{out}");
            assert!(out.contains(&format!("data parallel: {n} ranks")), "{out}");
            let many = last_checkpoint(&w);
            let rel = worst(&losses(&one), &losses(&many));
            assert!(rel < 1e-12, "{n} ranks, losses: {rel:e}");
            let all = |c: &Path| -> Vec<f64> {
                tensors(&c.join("model.safetensors"))
                    .into_iter()
                    .flat_map(|(_, v)| v)
                    .collect()
            };
            let rel = norm_rel(&all(&many), &all(&one));
            assert!(rel < 1e-12, "{n} ranks, the parameters: {rel:e}");
        }
    }

    /// The pid of rank `rank`, a child of the launcher `launcher`.
    fn rank_pid(launcher: u32, rank: usize) -> Option<u32> {
        for e in std::fs::read_dir("/proc").ok()? {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid != Some(launcher) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let want = format!("OMPI_COMM_WORLD_RANK={rank}");
            if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
                return Some(pid);
            }
        }
        None
    }

    /// Starts a long 2-rank run, sends `signal` to rank 1 once step 5 is
    /// saved, and returns how long the run took to end after it, its
    /// success and its output.
    fn hurt(name: &str, launcher: &[&str], signal: &str) -> (Duration, bool, String) {
        let w = tmp(name);
        let a = args(
            &w,
            100_000,
            &[
                "--data-parallel",
                "--collective-timeout",
                "5",
                "--checkpoint-every",
                "5",
                "--keep",
                "1",
            ],
        );
        let mut child = mpirun(2, launcher, &a)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !w.join("ck").join("step-00000005").exists() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "the run did not reach step 5"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let pid = rank_pid(child.id(), 1).expect("rank 1 not found");
        assert!(Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap()
            .success());
        let hit = Instant::now();
        let out = loop {
            if child.try_wait().unwrap().is_some() {
                break child.wait_with_output().unwrap();
            }
            if hit.elapsed() > Duration::from_secs(60) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                let _ = child.kill();
                panic!("the run did not end within 60 s of {signal} to rank 1");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The last checkpoint before the fault loads: it is whole.
        assert!(last_checkpoint(&w).join("checksums.txt").exists());
        (hit.elapsed(), out.status.success(), text)
    }

    #[test]
    fn a_killed_rank_ends_the_run_and_is_named() {
        if mpi_exe().is_none() {
            return;
        }
        // mpirun itself ends the job when a rank dies, and names it.
        let (took, ok, out) = hurt("kill", &[], "-KILL");
        assert!(!ok && took < Duration::from_secs(10), "{took:?} {out}");
        assert!(out.contains("rank 1"), "{out}");
        // A launcher that lets the job go on: the time limit ends it, with
        // the dead rank named by the survivor.
        let (took, ok, out) = hurt(
            "kill-kept",
            &["--mca", "orte_abort_on_non_zero_status", "0"],
            "-KILL",
        );
        assert!(!ok && took < Duration::from_secs(20), "{took:?} {out}");
        assert!(
            out.contains("rank 0 of 2")
                && out.contains("did not complete within the time limit of 5 s"),
            "{out}"
        );
        assert!(
            out.contains("rank 1 (pid") && out.contains("has exited"),
            "{out}"
        );
    }

    #[test]
    fn a_hung_rank_ends_the_run_at_the_time_limit_and_is_named() {
        if mpi_exe().is_none() {
            return;
        }
        let (took, ok, out) = hurt("stop", &[], "-STOP");
        assert!(
            !ok && took >= Duration::from_secs(4) && took < Duration::from_secs(20),
            "{took:?} {out}"
        );
        assert!(
            out.contains("rank 1 (pid") && out.contains("is stopped"),
            "{out}"
        );
    }
}
