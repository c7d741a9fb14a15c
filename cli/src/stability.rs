//! Why LayerNorm computes its variance the way it does: catastrophic
//! cancellation in f32, measured.
//!
//! Each row holds `x_i = offset + z_i` with `z_i ~ N(0, 1)`, rounded to f32.
//! The larger the offset against the spread (the condition number
//! `kappa = |mean| / std`), the harder the variance is to compute:
//!
//! - **naive**: `var = E[x^2] - E[x]^2`. Both terms are about `offset^2` and
//!   carry a rounding error of about `u * offset^2` (`u = 2^-24`), so the
//!   relative error of their difference grows like `u * kappa^2`. It passes
//!   100% near `kappa = 1/sqrt(u) = 4096`, after which the result is noise:
//!   zero, negative (then `rsqrt(var + eps)` is NaN) or far too large.
//! - **two-pass**: `mean = sum(x) / n`, then `var = sum((x - mean)^2) / n`.
//!   If the computed mean is off by `d`, the result is `var + d^2`: the
//!   error is *second order* in the mean's error, about `(u * kappa)^2`
//!   relative (plus `n u` from the sums).
//! - **two-pass, shifted**: the same with the first element `k = x_0` as a
//!   pivot for the mean, `mean = k + sum(x - k) / n`. For large offsets
//!   `x - k` is exact (Sterbenz), so the mean is as good as f32 can hold;
//!   a constant row gives exactly `var = 0`.
//! - **Welford**: the running update `m += (x - m) / k`,
//!   `M2 += (x - m_old) * (x - m_new)`. Each step rounds `m`, and that error
//!   enters `M2` to *first order*: relative error about `n u kappa` (Chan,
//!   Golub and LeVeque's bound), far worse than two-pass at large `kappa`.
//!
//! All four accumulate in `lanes` independent partial sums (element `i` goes
//! to lane `i % lanes`, as a vectorized CPU loop or the threads of a GPU warp
//! do), then combine the lanes pairwise in a tree (Chan's merge for Welford).
//! `lanes = 1` is the plain sequential loop.
//!
//! The reference is the same f32-rounded data in f64, by a shifted two-pass,
//! so rounding of the input is not counted as an error of any method. The
//! *floor* is what remains even with exact arithmetic once the mean is stored
//! in f32: with `d = mean - fl32(mean)`, a variance of `var + d^2` and an
//! output error of `|d| * rstd`.
//!
//! Rows of D copies of one value `c` ([`Config::constants`]) have the exact
//! answer var = 0, xhat = 0; plain two-pass misses the mean of `c` by an ulp
//! or two and returns `xhat` of order one once `|c|` is in the thousands.
//!
//! [`run`] measures, [`Report`] prints as a table and draws itself as an SVG
//! or PNG plot ([`Report::write_plot`]); [`run_demo`] does both with the
//! defaults.

use fusegrad::error::{Error, Result};
use fusegrad::rng::Rng;
use std::fmt;

use std::path::Path;

/// The offsets of the default demonstration, `1e0, 1e1, ..., 1e8`.
pub const DEFAULT_OFFSETS: [f64; 9] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8];

/// The constant rows of the default demonstration.
pub const DEFAULT_CONSTANTS: [f32; 7] = [0.1, 3.3, 123.456, 1234.567, 12345.678, 1_000_000.7, 1e8];

const OP: &str = "stability";

/// A way to compute the per-row variance in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `E[x^2] - E[x]^2` in one pass.
    Naive,
    /// Mean, then the mean of squared deviations.
    TwoPass,
    /// Two-pass with the row's first element as the pivot of the mean.
    TwoPassShifted,
    /// Welford's running update, lanes merged by Chan's formula.
    Welford,
}

impl Method {
    /// Every method, in table order.
    pub const ALL: [Method; 4] = [
        Method::Naive,
        Method::TwoPass,
        Method::TwoPassShifted,
        Method::Welford,
    ];

    /// Short name used in the table and the plot.
    pub fn name(self) -> &'static str {
        match self {
            Method::Naive => "naive",
            Method::TwoPass => "two-pass",
            Method::TwoPassShifted => "two-pass, shifted",
            Method::Welford => "Welford",
        }
    }

    /// Mean and (population) variance of `row` in f32, accumulated in
    /// `lanes` partial sums. Errors on an empty row or zero lanes.
    pub fn moments(self, row: &[f32], lanes: usize) -> Result<(f32, f32)> {
        if row.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "moments of an empty row".into(),
            });
        }
        if lanes == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "lanes must be at least 1".into(),
            });
        }
        // Lanes past the row's length would only hold zeros (and could not
        // be allocated for absurd counts).
        let lanes = lanes.min(row.len());
        let n = row.len() as f32;
        Ok(match self {
            Method::Naive => {
                let s = lane_sum(row.iter().copied(), lanes);
                let sq = lane_sum(row.iter().map(|&x| x * x), lanes);
                let mean = s / n;
                (mean, sq / n - mean * mean)
            }
            Method::TwoPass => {
                let mean = lane_sum(row.iter().copied(), lanes) / n;
                (mean, squared_deviations(row, mean, lanes) / n)
            }
            Method::TwoPassShifted => {
                let k = row.first().copied().unwrap_or(0.0);
                let mean = k + lane_sum(row.iter().map(|&x| x - k), lanes) / n;
                (mean, squared_deviations(row, mean, lanes) / n)
            }
            Method::Welford => {
                let m = welford(row, lanes);
                (m.mean, m.m2 / n)
            }
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `sum((x - mean)^2)` in lanes.
fn squared_deviations(row: &[f32], mean: f32, lanes: usize) -> f32 {
    lane_sum(
        row.iter().map(|&x| {
            let d = x - mean;
            d * d
        }),
        lanes,
    )
}

/// Sum with element `i` in lane `i % lanes`, lanes added pairwise.
fn lane_sum(values: impl Iterator<Item = f32>, lanes: usize) -> f32 {
    let mut acc = vec![0.0f32; lanes.max(1)];
    let width = acc.len();
    for (i, v) in values.enumerate() {
        if let Some(a) = acc.get_mut(i % width) {
            *a += v;
        }
    }
    tree(acc, |a, b| a + b).unwrap_or(0.0)
}

/// Welford state of one lane.
#[derive(Clone, Copy)]
struct Welford {
    count: f32,
    mean: f32,
    m2: f32,
}

/// Welford per lane, then Chan's merge:
/// `n = na + nb`, `d = mb - ma`, `mean = ma + d * nb / n`,
/// `M2 = M2a + M2b + d^2 * na * nb / n`.
fn welford(row: &[f32], lanes: usize) -> Welford {
    let empty = Welford {
        count: 0.0,
        mean: 0.0,
        m2: 0.0,
    };
    let mut acc = vec![empty; lanes.max(1)];
    let width = acc.len();
    for (i, &x) in row.iter().enumerate() {
        if let Some(w) = acc.get_mut(i % width) {
            w.count += 1.0;
            let d = x - w.mean;
            w.mean += d / w.count;
            w.m2 += d * (x - w.mean);
        }
    }
    tree(acc, |a, b| {
        if a.count == 0.0 {
            return b;
        }
        if b.count == 0.0 {
            return a;
        }
        let n = a.count + b.count;
        let d = b.mean - a.mean;
        Welford {
            count: n,
            mean: a.mean + d * (b.count / n),
            m2: a.m2 + b.m2 + d * d * (a.count * b.count / n),
        }
    })
    .unwrap_or(empty)
}

/// Pairwise reduction: neighbours combined level by level.
fn tree<T: Copy>(mut v: Vec<T>, f: impl Fn(T, T) -> T) -> Option<T> {
    while v.len() > 1 {
        v = v
            .chunks(2)
            .filter_map(|c| c.iter().copied().reduce(&f))
            .collect();
    }
    v.first().copied()
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Values per row (the normalized size D).
    pub d: usize,
    /// Rows per offset; every offset reuses the same `z`.
    pub rows: usize,
    /// Partial sums per row (1 = sequential).
    pub lanes: usize,
    /// Seed of [`Rng`] for `z`.
    pub seed: u64,
    /// LayerNorm's eps.
    pub eps: f32,
    /// The offsets added to `z`.
    pub offsets: Vec<f64>,
    /// Values `c` for rows of D copies of `c` (exact: var 0, xhat 0).
    pub constants: Vec<f32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            d: 1024,
            rows: 16,
            lanes: 8,
            seed: 0x57AB_1E5E,
            eps: 1e-5,
            offsets: DEFAULT_OFFSETS.to_vec(),
            constants: DEFAULT_CONSTANTS.to_vec(),
        }
    }
}

impl Config {
    fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument { op: OP, msg });
        if self.d < 2 || self.d > 1 << 24 {
            return bad(format!("d must be in 2..=2^24, got {}", self.d));
        }
        if self.rows == 0 {
            return bad("rows must be at least 1".into());
        }
        if self.lanes == 0 {
            return bad("lanes must be at least 1".into());
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::BadEps {
                op: OP,
                eps: self.eps as f64,
            });
        }
        if self.offsets.is_empty() {
            return bad("no offsets".into());
        }
        if let Some(o) = self
            .offsets
            .iter()
            .find(|o| !(o.is_finite() && **o > 0.0 && **o < 1e30))
        {
            return bad(format!("offsets must be finite, > 0 and < 1e30, got {o}"));
        }
        if let Some(c) = self.constants.iter().find(|c| !c.is_finite()) {
            return bad(format!("constants must be finite, got {c}"));
        }
        Ok(())
    }
}

/// Rows where a method's variance went wrong in kind, not just in size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    /// Rows with a negative variance.
    pub negative: usize,
    /// Rows with variance exactly 0 where the reference is not.
    pub zero: usize,
    /// Rows whose `rsqrt(var + eps)` is NaN or infinite.
    pub nonfinite_rstd: usize,
    /// Rows measured.
    pub rows: usize,
}

impl Flags {
    /// Whether nothing was flagged.
    pub fn is_clean(&self) -> bool {
        self.negative == 0 && self.zero == 0 && self.nonfinite_rstd == 0
    }
}

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.negative > 0 {
            parts.push(format!("var<0 {}/{}", self.negative, self.rows));
        }
        if self.zero > 0 {
            parts.push(format!("var=0 {}/{}", self.zero, self.rows));
        }
        if self.nonfinite_rstd > 0 {
            parts.push(format!("rstd NaN {}/{}", self.nonfinite_rstd, self.rows));
        }
        if parts.is_empty() {
            f.write_str("-")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// One method at one offset. Errors are the worst over all rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The offset added to `z`.
    pub offset: f64,
    /// The method.
    pub method: Method,
    /// Computed f32 variance of the worst row (largest variance error).
    pub variance: f32,
    /// f64 reference variance of that row.
    pub ref_variance: f64,
    /// Lowest computed variance over the rows (NaN if any is NaN).
    pub var_min: f32,
    /// `1 / sqrt(var_min + eps)` in f32 (NaN once `var_min < -eps`).
    pub rstd_at_min: f32,
    /// Max over rows of `|var - ref| / ref` (0 if both are 0, infinite if
    /// only the reference is 0, NaN if the variance is NaN).
    pub var_rel_err: f64,
    /// Max over all elements of `|xhat - xhat_ref|`, NaN if any is NaN.
    pub ln_max_err: f64,
    /// Rows gone wrong in kind.
    pub flags: Flags,
}

/// The error left with exact arithmetic once the mean is rounded to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Floor {
    /// The offset added to `z`.
    pub offset: f64,
    /// Spacing of f32 numbers at the offset (how coarsely `x` is rounded).
    pub input_ulp: f64,
    /// Smallest reference variance over the rows.
    pub ref_var_min: f64,
    /// Largest reference variance over the rows.
    pub ref_var_max: f64,
    /// Max over rows of `d^2 / var`, `d = mean - fl32(mean)`.
    pub var_rel_err: f64,
    /// Max over rows of `|d| / sqrt(var + eps)`.
    pub ln_max_err: f64,
}

/// A row of D copies of `value`: the exact variance and output are 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConstantRow {
    /// The value repeated D times.
    pub value: f32,
    /// The method.
    pub method: Method,
    /// Computed f32 variance.
    pub variance: f32,
    /// Computed `xhat = (value - mean) * rsqrt(variance + eps)`, the same
    /// for every element of the row.
    pub xhat: f32,
}

/// Everything measured by [`run`]; `Display` prints it as a table.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// What was measured.
    pub config: Config,
    /// One entry per offset and method, offsets in config order.
    pub rows: Vec<Row>,
    /// One entry per offset.
    pub floors: Vec<Floor>,
    /// One entry per constant and method.
    pub constant_rows: Vec<ConstantRow>,
}

impl Report {
    /// The entry for `method` at `offset`.
    pub fn get(&self, offset: f64, method: Method) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.offset == offset && r.method == method)
    }

    /// The floor at `offset`.
    pub fn floor(&self, offset: f64) -> Option<&Floor> {
        self.floors.iter().find(|f| f.offset == offset)
    }

    /// The plot as a standalone SVG document (drawn by `plotters`).
    pub fn to_svg(&self) -> Result<String> {
        crate::plot::svg_of(self)
    }

    /// The plot as PNG bytes.
    pub fn to_png(&self) -> Result<Vec<u8>> {
        crate::plot::png_of(self)
    }

    /// Writes the plot to `path`, SVG or PNG by its extension (`.svg`,
    /// `.png`; anything else is an error), creating missing parent folders.
    pub fn write_plot(&self, path: &Path) -> Result<()> {
        crate::plot::write_figure(self, path)
    }
}

/// NaN-propagating max.
fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Relative error against a reference that may be 0.
fn rel_err(got: f64, want: f64) -> f64 {
    if got.is_nan() {
        f64::NAN
    } else if want == 0.0 {
        if got == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (got - want).abs() / want.abs()
    }
}

/// Mean and variance in f64, shifted two-pass.
fn reference(row: &[f64]) -> (f64, f64) {
    let n = row.len() as f64;
    let k = row.first().copied().unwrap_or(0.0);
    let mean = k + row.iter().map(|x| x - k).sum::<f64>() / n;
    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

/// Measures every method of [`Method::ALL`] at every offset of `config`.
pub fn run(config: &Config) -> Result<Report> {
    config.validate()?;
    let mut rng = Rng::new(config.seed);
    let z: Vec<Vec<f64>> = (0..config.rows)
        .map(|_| (0..config.d).map(|_| rng.normal()).collect())
        .collect();
    let eps32 = config.eps;
    let eps = eps32 as f64;
    let mut rows = Vec::new();
    let mut floors = Vec::new();

    for &offset in &config.offsets {
        let data: Vec<Vec<f32>> = z
            .iter()
            .map(|r| r.iter().map(|&v| (offset + v) as f32).collect())
            .collect();
        let wide: Vec<Vec<f64>> = data
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect();
        let refs: Vec<(f64, f64)> = wide.iter().map(|r| reference(r)).collect();

        let mut floor = Floor {
            offset,
            input_ulp: ulp32(offset as f32),
            ref_var_min: f64::INFINITY,
            ref_var_max: 0.0,
            var_rel_err: 0.0,
            ln_max_err: 0.0,
        };
        for &(mean, var) in &refs {
            let d = mean - (mean as f32) as f64;
            floor.ref_var_min = floor.ref_var_min.min(var);
            floor.ref_var_max = floor.ref_var_max.max(var);
            floor.var_rel_err = worse(floor.var_rel_err, rel_err(var + d * d, var));
            floor.ln_max_err = worse(floor.ln_max_err, d.abs() / (var + eps).sqrt());
        }
        floors.push(floor);

        for method in Method::ALL {
            let mut entry = Row {
                offset,
                method,
                variance: 0.0,
                ref_variance: 0.0,
                var_min: f32::INFINITY,
                rstd_at_min: 0.0,
                var_rel_err: 0.0,
                ln_max_err: 0.0,
                flags: Flags {
                    rows: config.rows,
                    ..Flags::default()
                },
            };
            let mut worst = f64::NEG_INFINITY;
            for ((x, xw), &(ref_mean, ref_var)) in data.iter().zip(&wide).zip(&refs) {
                let (mean, var) = method.moments(x, config.lanes)?;
                let rstd = 1.0 / (var + eps32).sqrt();
                let err = rel_err(var as f64, ref_var);
                let rank = if err.is_nan() { f64::INFINITY } else { err };
                if rank > worst {
                    worst = rank;
                    entry.variance = var;
                    entry.ref_variance = ref_var;
                }
                if var.is_nan() || var < entry.var_min {
                    entry.var_min = var;
                    entry.rstd_at_min = rstd;
                }
                entry.var_rel_err = worse(entry.var_rel_err, err);
                let ref_rstd = 1.0 / (ref_var + eps).sqrt();
                for (&xi, &xwi) in x.iter().zip(xw) {
                    let got = ((xi - mean) * rstd) as f64;
                    let want = (xwi - ref_mean) * ref_rstd;
                    entry.ln_max_err = worse(entry.ln_max_err, (got - want).abs());
                }
                entry.flags.negative += usize::from(var < 0.0);
                entry.flags.zero += usize::from(var == 0.0 && ref_var != 0.0);
                entry.flags.nonfinite_rstd += usize::from(!rstd.is_finite());
            }
            rows.push(entry);
        }
    }
    let mut constant_rows = Vec::new();
    for &value in &config.constants {
        let row = vec![value; config.d];
        for method in Method::ALL {
            let (mean, variance) = method.moments(&row, config.lanes)?;
            let xhat = (value - mean) * (1.0 / (variance + eps32).sqrt());
            constant_rows.push(ConstantRow {
                value,
                method,
                variance,
                xhat,
            });
        }
    }
    Ok(Report {
        config: config.clone(),
        rows,
        floors,
        constant_rows,
    })
}

/// Runs the default [`Config`] and writes the plot to `plot_path` (SVG or
/// PNG by its extension).
pub fn run_demo(plot_path: &Path) -> Result<Report> {
    let report = run(&Config::default())?;
    report.write_plot(plot_path)?;
    Ok(report)
}

/// Spacing of f32 numbers at `x` (distance to the next one up).
fn ulp32(x: f32) -> f64 {
    let x = x.abs();
    if !x.is_finite() {
        return f64::NAN;
    }
    (f32::from_bits(x.to_bits() + 1) as f64) - x as f64
}

/// `1e8` for 1e8, otherwise every digit (`1.00000005e7`).
fn short(v: f64) -> String {
    let s = format!("{v:.0e}");
    if s.parse::<f64>().ok() == Some(v) {
        s
    } else {
        format!("{v:e}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "f32 variance of x = offset + z, z ~ N(0,1): D = {}, {} rows per offset, {} lane(s), \
             eps = {:e}, seed = {:#x}",
            c.d, c.rows, c.lanes, c.eps, c.seed
        )?;
        writeln!(
            f,
            "Reference: f64 two-pass on the same f32-rounded rows. worst var / ref var: the row \
             with the largest variance error;"
        )?;
        writeln!(
            f,
            "min var / rstd: the lowest variance over the rows and its f32 rsqrt(var + eps). \
             Errors are maxima over all rows."
        )?;
        let line = |f: &mut fmt::Formatter<'_>, cols: [&str; 10]| {
            let [a, b, c, d, e, g, h, i, j, k] = cols;
            writeln!(
                f,
                "{a:<6} {b:<7} {c:<17} {d:>13} {e:>10} {g:>13} {h:>10} {i:>10} {j:>9}  {k}"
            )
        };
        line(
            f,
            [
                "offset",
                "ulp(x)",
                "method",
                "worst var",
                "ref var",
                "min var",
                "rstd",
                "var relerr",
                "LN maxerr",
                "flags",
            ],
        )?;
        for fl in &self.floors {
            let ulp = format!("{:.1e}", fl.input_ulp);
            for r in self.rows.iter().filter(|r| r.offset == fl.offset) {
                line(
                    f,
                    [
                        &short(r.offset),
                        &ulp,
                        r.method.name(),
                        &format!("{:.5e}", r.variance),
                        &format!("{:.3e}", r.ref_variance),
                        &format!("{:.5e}", r.var_min),
                        &format!("{:.3e}", r.rstd_at_min),
                        &format!("{:.2e}", r.var_rel_err),
                        &format!("{:.2e}", r.ln_max_err),
                        &r.flags.to_string(),
                    ],
                )?;
            }
            line(
                f,
                [
                    &short(fl.offset),
                    &ulp,
                    "f32-mean floor",
                    "",
                    &format!("{:.3e}", fl.ref_var_max),
                    "",
                    "",
                    &format!("{:.2e}", fl.var_rel_err),
                    &format!("{:.2e}", fl.ln_max_err),
                    &format!("ref var >= {:.3e}", fl.ref_var_min),
                ],
            )?;
        }
        if self.constant_rows.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "\nConstant rows: D copies of c (exact: var = 0, xhat = 0). Each cell: f32 var / xhat."
        )?;
        write!(f, "{:<14}", "c")?;
        for m in Method::ALL {
            write!(f, " {:>24}", m.name())?;
        }
        writeln!(f)?;
        for chunk in self.constant_rows.chunks(Method::ALL.len()) {
            if let Some(first) = chunk.first() {
                write!(f, "{:<14}", format!("{:e}", first.value))?;
            }
            for r in chunk {
                write!(f, " {:>24}", format!("{:.3e} / {:.2e}", r.variance, r.xhat))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

mod plot;
