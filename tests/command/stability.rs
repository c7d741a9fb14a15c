//! The measured behaviour of the f32 variance methods (fusegrad_cli::stability).
//!
//! Bars are set from what f32 can do at all: the "floor" is the error of
//! exact arithmetic once the mean is stored in f32, measured on the same rows.

use fusegrad_cli::stability::{
    run, run_demo, Config, Method, Report, DEFAULT_CONSTANTS, DEFAULT_OFFSETS,
};

/// The variance may be this far (relative) above the floor's error, for
/// rounding in the sums themselves (`n u` with `n = 1024`, `u = 2^-24`).
const SUM_SLACK_VAR: f64 = 1e-5;
/// Same for the LayerNorm output; `xhat` is of order 1 and rounded once more.
const SUM_SLACK_LN: f64 = 1e-4;
/// "Accurate in the sense that matters": variance within 1%, normalized
/// output within 0.1 (D = 1024 rows of std 1, so |xhat| reaches about 3.5).
const USEFUL_VAR: f64 = 1e-2;
const USEFUL_LN: f64 = 1e-1;

fn default_report() -> Report {
    run(&Config::default()).expect("default config runs")
}

fn row(r: &Report, offset: f64, m: Method) -> &fusegrad_cli::stability::Row {
    r.get(offset, m)
        .unwrap_or_else(|| panic!("no entry for {m} at {offset}"))
}

#[test]
fn report_covers_every_offset_and_method() {
    let r = default_report();
    assert_eq!(r.rows.len(), DEFAULT_OFFSETS.len() * Method::ALL.len());
    assert_eq!(r.floors.len(), DEFAULT_OFFSETS.len());
    assert_eq!(
        r.constant_rows.len(),
        DEFAULT_CONSTANTS.len() * Method::ALL.len()
    );
    for &o in &DEFAULT_OFFSETS {
        assert!(r.floor(o).is_some());
        for m in Method::ALL {
            assert_eq!(row(&r, o, m).flags.rows, 16);
        }
    }
}

#[test]
fn reference_sees_the_rounded_input() {
    let r = default_report();
    let easy = r.floor(1.0).unwrap();
    assert!(
        easy.ref_var_min > 0.8 && easy.ref_var_max < 1.25,
        "{easy:?}"
    );
    // At 1e8 f32 numbers are 8 apart: |z| < 4 rounds away, most rows are
    // constant and the reference variance is exactly 0.
    let hard = r.floor(1e8).unwrap();
    assert_eq!(hard.input_ulp, 8.0);
    assert_eq!(hard.ref_var_min, 0.0);
}

#[test]
fn naive_is_fine_when_well_conditioned() {
    let r = default_report();
    let n = row(&r, 1.0, Method::Naive);
    assert!(n.var_rel_err < 1e-5, "{n:?}");
    assert!(n.flags.is_clean());
}

#[test]
fn naive_collapses_by_offset_1e4() {
    let r = default_report();
    let failed = DEFAULT_OFFSETS
        .iter()
        .filter(|&&o| o <= 1e4)
        .map(|&o| row(&r, o, Method::Naive))
        .find(|n| n.var_rel_err > 0.1 || n.var_min <= 0.0 || n.var_rel_err.is_nan());
    let n = failed.expect("naive should fail at some offset <= 1e4");
    assert!(n.offset <= 1e4);
    // At 1e4 the collapse shows in the values: negative variances, NaN rstd.
    let n = row(&r, 1e4, Method::Naive);
    assert!(n.var_min < 0.0, "{n:?}");
    assert!(n.rstd_at_min.is_nan(), "{n:?}");
    assert!(n.flags.negative > 0 && n.flags.nonfinite_rstd > 0);
    assert!(n.ln_max_err.is_nan());
    // and it never recovers
    for &o in DEFAULT_OFFSETS.iter().filter(|&&o| o >= 1e4) {
        let n = row(&r, o, Method::Naive);
        let broken = n.var_rel_err.is_nan() || n.var_rel_err >= 1.0;
        assert!(broken, "naive at {o}: {n:?}");
    }
}

#[test]
fn shifted_two_pass_tracks_the_f32_floor_up_to_1e8() {
    let r = default_report();
    for &o in &DEFAULT_OFFSETS {
        let s = row(&r, o, Method::TwoPassShifted);
        let f = r.floor(o).unwrap();
        assert!(
            s.var_rel_err <= 2.0 * f.var_rel_err + SUM_SLACK_VAR,
            "offset {o}: {s:?} vs {f:?}"
        );
        assert!(
            s.ln_max_err <= 2.0 * f.ln_max_err + SUM_SLACK_LN,
            "offset {o}: {s:?} vs {f:?}"
        );
        assert!(s.var_rel_err <= USEFUL_VAR && s.ln_max_err <= USEFUL_LN);
        assert!(s.flags.is_clean());
    }
}

#[test]
fn two_pass_is_accurate_to_1e7_and_breaks_on_constant_rows_at_1e8() {
    let r = default_report();
    for &o in DEFAULT_OFFSETS.iter().filter(|&&o| o <= 1e7) {
        let t = row(&r, o, Method::TwoPass);
        assert!(t.var_rel_err <= USEFUL_VAR, "offset {o}: {t:?}");
        assert!(t.ln_max_err <= USEFUL_LN, "offset {o}: {t:?}");
        assert!(t.flags.is_clean());
    }
    // Constant rows of 1e8: the f32 sum misses n * 1e8 by at least one ulp
    // of the mean (8), so the variance is (8k)^2 >= 64 instead of 0.
    let t = row(&r, 1e8, Method::TwoPass);
    assert!(t.var_min >= 64.0, "{t:?}");
    assert_eq!(t.var_rel_err, f64::INFINITY);
    assert!(t.ln_max_err > 1.0);
}

#[test]
fn welford_error_is_first_order_in_the_offset() {
    let r = default_report();
    for &o in DEFAULT_OFFSETS.iter().filter(|&&o| o <= 1e5) {
        let w = row(&r, o, Method::Welford);
        assert!(w.var_rel_err <= USEFUL_VAR, "offset {o}: {w:?}");
        assert!(w.ln_max_err <= USEFUL_LN, "offset {o}: {w:?}");
    }
    // kappa u = 0.6 at 1e7: Welford's first-order error is of order one,
    // two-pass's second-order error is not.
    let w = row(&r, 1e7, Method::Welford);
    let t = row(&r, 1e7, Method::TwoPass);
    assert!(w.var_rel_err > 0.1, "{w:?}");
    assert!(w.var_rel_err > 10.0 * t.var_rel_err, "{w:?} vs {t:?}");
    // A constant row has no deviation to round: exact.
    let w = row(&r, 1e8, Method::Welford);
    assert!(w.var_rel_err <= 2.0 * r.floor(1e8).unwrap().var_rel_err + SUM_SLACK_VAR);
}

#[test]
fn constant_rows_break_plain_two_pass_but_not_shifted_or_welford() {
    let r = default_report();
    let get = |c: f32, m: Method| {
        r.constant_rows
            .iter()
            .find(|x| x.value == c && x.method == m)
            .unwrap_or_else(|| panic!("no constant row {c} {m}"))
    };
    for &c in &DEFAULT_CONSTANTS {
        for m in [Method::TwoPassShifted, Method::Welford] {
            let x = get(c, m);
            assert_eq!((x.variance, x.xhat), (0.0, 0.0), "{x:?}");
        }
    }
    // The f32 mean of 1024 copies of c misses c; (c - mean) * rstd is then
    // of order one instead of 0.
    assert!(get(12345.678, Method::TwoPass).xhat.abs() > 0.5);
    assert!(get(1e8, Method::TwoPass).variance >= 64.0);
    assert!(get(1234.567, Method::Naive).xhat.is_nan());
}

#[test]
fn sequential_sums_break_plain_two_pass_earlier() {
    let config = Config {
        lanes: 1,
        ..Config::default()
    };
    let r = run(&config).unwrap();
    // One f32 accumulator over 1024 values of 1e7: the mean is off by
    // several units, and the variance by their square.
    let t = row(&r, 1e7, Method::TwoPass);
    assert!(t.var_rel_err > 1.0, "{t:?}");
    let s = row(&r, 1e7, Method::TwoPassShifted);
    assert!(s.var_rel_err <= USEFUL_VAR, "{s:?}");
    let n = row(&r, 1e3, Method::Naive);
    assert!(n.var_min < 0.0, "{n:?}");
}

#[test]
fn moments_are_exact_on_small_integers() {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
    for m in Method::ALL {
        for lanes in 1..=9 {
            let (mean, var) = m.moments(&x, lanes).unwrap();
            assert_eq!(mean, 4.0, "{m} lanes {lanes}");
            assert_eq!(var, 4.0, "{m} lanes {lanes}");
        }
    }
}

#[test]
fn constant_row_of_one_value() {
    for m in Method::ALL {
        let (mean, var) = m.moments(&[3.5], 4).unwrap();
        assert_eq!((mean, var), (3.5, 0.0), "{m}");
    }
}

#[test]
fn nan_input_propagates() {
    let x = [1.0f32, f32::NAN, 3.0];
    for m in Method::ALL {
        let (_, var) = m.moments(&x, 2).unwrap();
        assert!(var.is_nan(), "{m}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    assert!(Method::TwoPass.moments(&[], 8).is_err());
    assert!(Method::Welford.moments(&[1.0], 0).is_err());
    let bad = [
        Config {
            d: 1,
            ..Config::default()
        },
        Config {
            rows: 0,
            ..Config::default()
        },
        Config {
            lanes: 0,
            ..Config::default()
        },
        Config {
            eps: 0.0,
            ..Config::default()
        },
        Config {
            eps: f32::NAN,
            ..Config::default()
        },
        Config {
            offsets: vec![],
            ..Config::default()
        },
        Config {
            offsets: vec![1.0, f64::INFINITY],
            ..Config::default()
        },
        Config {
            constants: vec![f32::NAN],
            ..Config::default()
        },
    ];
    for c in bad {
        assert!(run(&c).is_err(), "{c:?}");
    }
}

#[test]
fn table_shows_the_collapse() {
    let text = default_report().to_string();
    assert!(text.contains("offset") && text.contains("LN maxerr"));
    // one line per offset, plus the constant-row table's header
    assert_eq!(text.matches("naive").count(), DEFAULT_OFFSETS.len() + 1);
    assert!(text.contains("NaN"));
    assert!(text.contains("var<0"));
    assert!(text.contains("f32-mean floor"));
    assert!(text.contains("Constant rows"));
}

/// Colours of the four methods in the plot, as plotters writes them in SVG.
const COLOURS: [(&str, [u8; 3]); 4] = [
    ("#D62728", [0xd6, 0x27, 0x28]),
    ("#1F77B4", [0x1f, 0x77, 0xb4]),
    ("#2CA02C", [0x2c, 0xa0, 0x2c]),
    ("#FF7F0E", [0xff, 0x7f, 0x0e]),
];

#[test]
fn svg_is_written_with_a_line_per_method_in_each_panel() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stability-test");
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("nested").join("plot.svg");
    let report = run_demo(&path).unwrap();
    assert_eq!(report.config, Config::default());
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..60.min(svg.len())]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    // two panels, one polyline per method in each (and legend strokes)
    for (hex, _) in COLOURS {
        let lines = svg
            .lines()
            .filter(|l| l.contains("<polyline") && l.contains(hex))
            .count();
        assert!(lines >= 2, "{hex}: {lines} polylines");
    }
    for m in Method::ALL {
        assert!(svg.contains(m.name()), "legend lacks {}", m.name());
    }
    // axis labels, ticks and the bands for clamped points
    assert!(svg.contains("offset (mean of the row; std = 1)"));
    assert!(svg.contains("1e8"));
    assert!(svg.contains("NaN / ∞"));
    assert!(svg.contains("exactly 0"));
    assert!(svg.contains("floor"));
}

#[test]
fn png_is_written_by_extension_with_every_method_drawn() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stability-png");
    let _ = std::fs::remove_dir_all(&dir);
    let report = default_report();
    let path = dir.join("plot.png");
    report.write_plot(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, report.to_png().unwrap());
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut rgb).unwrap();
    assert_eq!((info.width, info.height), (1110, 600));
    let pixels: Vec<&[u8]> = rgb[..info.buffer_size()].chunks_exact(3).collect();
    for (hex, c) in COLOURS {
        let n = pixels.iter().filter(|p| **p == c).count();
        assert!(n > 50, "{hex}: {n} pixels");
    }
    // Text is drawn: many near-black pixels (labels, axes) besides lines.
    let dark = pixels.iter().filter(|p| p.iter().all(|&v| v < 60)).count();
    assert!(dark > 2000, "{dark} dark pixels");
    // Another extension is an error, and nothing is written.
    let bad = dir.join("plot.jpg");
    assert!(matches!(
        report.write_plot(&bad),
        Err(fusegrad::Error::Plot { .. })
    ));
    assert!(!bad.exists());
}

#[test]
fn svg_to_an_unwritable_path_is_an_error() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stability-file");
    std::fs::write(&dir, "a file, not a folder").unwrap();
    let report = default_report();
    assert!(report.write_plot(&dir.join("plot.svg")).is_err());
}
