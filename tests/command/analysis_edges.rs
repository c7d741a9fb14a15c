//! The LayerNorm analysis (`fusegrad_cli::analysis`) and the other helper
//! modules on long rows and degenerate arguments.

use fusegrad::rng::Rng;
use fusegrad::{ops, tolerance, Error, Tape, Tensor, Var};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A dimension no allocation can hold.
const HUGE: usize = 1 << 56;

#[test]
fn long_rows_three_way() {
    use fusegrad_cli::analysis::{self, Case, Norm};
    let c = Case::new(Norm::LayerNorm, &[3, 16384], &[16384]);
    let row = analysis::three_way(&c, 16).unwrap();
    assert!(
        row.fc.max() <= tolerance::norm_fused_vs_composed_f64(row.cond).rtol,
        "{row}"
    );
    assert!(
        row.fd.max_diff <= tolerance::norm_vs_fd_f64(row.cond).rtol,
        "{row}"
    );
    let lo = analysis::fused_vs_composed::<f32>(&c).unwrap();
    assert!(lo.max() <= tolerance::norm_f32(row.cond).rtol, "{lo}");
}

#[test]
fn helper_modules_never_panic_on_degenerate_arguments() {
    use fusegrad::gradcheck::{self, Options};
    use fusegrad_cli::analysis::{self, Case, Norm};
    use fusegrad_cli::stability;
    let m = usize::MAX;
    let mut panics = Vec::new();
    let mut try_it = |what: &str, f: &mut dyn FnMut()| {
        if catch_unwind(AssertUnwindSafe(f)).is_err() {
            panics.push(what.to_string());
        }
    };
    // analysis
    for norm in [Norm::LayerNorm, Norm::RmsNorm] {
        for (shape, nd) in [
            (vec![], vec![]),
            (vec![0, 4], vec![4]),
            (vec![2, 0], vec![0]),
            (vec![m, m], vec![m]),
            (vec![HUGE, 2], vec![2]),
            (vec![2, 3], vec![5]),
            (vec![0, m, m], vec![m, m]),
        ] {
            let mut c = Case::new(norm, &shape, &nd);
            try_it(&format!("Case::d {shape:?}"), &mut || {
                let _ = c.d();
            });
            try_it(&format!("Case::values {shape:?}"), &mut || {
                let _ = c.values();
            });
            try_it(&format!("fused_vs_composed {shape:?}"), &mut || {
                let _ = analysis::fused_vs_composed::<f32>(&c);
            });
            try_it(&format!("vs_f64 {shape:?}"), &mut || {
                let _ = analysis::vs_f64::<half::f16>(&c);
            });
            try_it(&format!("fd_error {shape:?}"), &mut || {
                let _ = analysis::fd_error(&c, 0);
            });
            c.eps = f64::NAN;
            c.scale = f64::INFINITY;
            try_it(&format!("three_way {shape:?}"), &mut || {
                let _ = analysis::three_way(&c, 2);
            });
        }
        for d in [0, 1, 3, m] {
            try_it("condition", &mut || {
                let _ = analysis::condition(norm, &[1.0, f64::NAN, 3.0], d, 0.0);
                let _ = analysis::condition(norm, &[], d, -1.0);
            });
        }
        try_it("random_case", &mut || {
            let _ = analysis::random_case(&mut Rng::new(1), norm, f64::INFINITY);
        });
    }
    try_it("scaled_diff", &mut || {
        let _ = analysis::scaled_diff(&[1.0], &[], 0.0);
        let _ = analysis::scaled_diff(&[], &[], f64::NAN);
    });
    try_it("fd_x_step", &mut || {
        let _ = analysis::fd_x_step(f64::NAN, m);
    });
    try_it("node_traffic", &mut || {
        let tape = Tape::<f32>::new();
        let x = tape.var(Tensor::<f32>::zeros(&[m, 0]).unwrap());
        let _ = ops::layer_norm(&x, None, None, 1e-5);
        let _ = ops::sum(&x);
        let _ = analysis::node_traffic(&tape.nodes(), m, 0);
        let _ = analysis::node_traffic(&[], 0, 0);
    });
    try_it("analysis::report", &mut || {
        let _ = analysis::report(0, 0);
        let _ = analysis::report(m, m);
        let _ = analysis::report(1, 1);
    });
    try_it("sweep", &mut || {
        let _ = analysis::sweep(0, 0);
    });
    // stability
    for method in stability::Method::ALL {
        for row in [
            &[][..],
            &[1.0f32],
            &[f32::NAN, f32::INFINITY],
            &[f32::MAX, -f32::MAX],
        ] {
            for lanes in [0, 1, 3, m] {
                try_it(&format!("moments {method} {row:?} {lanes}"), &mut || {
                    let _ = method.moments(row, lanes);
                });
            }
        }
    }
    for (d, rows, lanes) in [(0, 1, 1), (1, 0, 1), (1, 1, 0), (2, 1, m), (3, 2, 2)] {
        let config = stability::Config {
            d,
            rows,
            lanes,
            offsets: vec![0.0, f64::NAN, f64::INFINITY, 1e300],
            constants: vec![f32::NAN, 0.0],
            ..stability::Config::default()
        };
        try_it(
            &format!("stability::run d {d} rows {rows} lanes {lanes}"),
            &mut || {
                if let Ok(r) = stability::run(&config) {
                    let _ = r.to_svg();
                    let _ = r.floor(f64::NAN);
                }
            },
        );
    }
    // gradcheck
    try_it("gradcheck", &mut || {
        let opts = Options {
            max_checks: 0,
            step: f64::NAN,
            ..Options::default()
        };
        let first = |v: &[Var<f64>]| {
            v.first().cloned().ok_or(Error::InvalidArgument {
                op: "test",
                msg: "no inputs".into(),
            })
        };
        let _ = gradcheck::check(|v| ops::sum(&first(v)?), &[], &opts);
        let e = Tensor::<f64>::zeros(&[0, 3]).unwrap();
        let _ = gradcheck::check(|v| ops::sum(&v[0]), std::slice::from_ref(&e), &opts);
        let _ = gradcheck::check(
            |v| ops::exp(&v[0]),
            &[Tensor::from_vec(vec![2], vec![1.0, f64::NAN]).unwrap()],
            &Options::default(),
        );
        // A function that fails, or returns a Var of another tape.
        let other = Tape::<f64>::new();
        let foreign = other.var(Tensor::scalar(1.0));
        let _ = gradcheck::check(|_| Ok(foreign.clone()), std::slice::from_ref(&e), &opts);
        let _ = gradcheck::check(
            |v| ops::matmul(&v[0], &v[0]),
            std::slice::from_ref(&e),
            &opts,
        );
        let _ = gradcheck::rel_diff(&[1.0], &[]);
        let first32 = |v: &[Var<f32>]| {
            v.first().cloned().ok_or(Error::InvalidArgument {
                op: "test",
                msg: "no inputs".into(),
            })
        };
        let _ = gradcheck::fused_vs_composed::<f32, _, _>(
            |v| ops::sum(&first32(v)?),
            |v| ops::mean(&first32(v)?),
            &[],
            0,
        );
    });
    // rng
    try_it("rng", &mut || {
        let mut r = Rng::new(0);
        let _ = r.below(0);
        let _ = r.range(f64::INFINITY, f64::NEG_INFINITY);
        let _ = r.vec(0);
    });
    assert!(panics.is_empty(), "panicked: {panics:#?}");
}
