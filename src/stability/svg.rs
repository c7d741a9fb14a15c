//! Hand-written SVG: two log-log panels (variance error, LayerNorm error).

use super::{Method, Report};
use std::fmt::Write as _;

const W: f64 = 1110.0;
const H: f64 = 565.0;
const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 400.0;
const TOP: f64 = 60.0;
const LEFT: [f64; 2] = [90.0, 640.0];
/// Height of the bands for non-finite (top) and exact-zero (bottom) points.
const BAND: f64 = 26.0;

fn color(m: Method) -> &'static str {
    match m {
        Method::Naive => "#d62728",
        Method::TwoPass => "#1f77b4",
        Method::TwoPassShifted => "#2ca02c",
        Method::Welford => "#ff7f0e",
    }
}

fn id(m: Method) -> &'static str {
    match m {
        Method::Naive => "naive",
        Method::TwoPass => "two-pass",
        Method::TwoPassShifted => "shifted-two-pass",
        Method::Welford => "welford",
    }
}

/// Where a value lands on the y axis.
#[derive(Clone, Copy)]
enum Y {
    Log(f64),
    NonFinite,
    Zero,
}

fn classify(v: f64) -> Y {
    if !v.is_finite() {
        Y::NonFinite
    } else if v <= 0.0 {
        Y::Zero
    } else {
        Y::Log(v.log10())
    }
}

struct Panel {
    left: f64,
    x_lo: f64,
    x_hi: f64,
    y_lo: f64,
    y_hi: f64,
}

impl Panel {
    fn plot_top(&self) -> f64 {
        TOP + BAND
    }
    fn plot_bottom(&self) -> f64 {
        TOP + PANEL_H - BAND
    }
    fn x(&self, offset: f64) -> f64 {
        let t = (offset.log10() - self.x_lo) / (self.x_hi - self.x_lo).max(1e-9);
        self.left + t * PANEL_W
    }
    fn y(&self, v: Y) -> f64 {
        match v {
            Y::NonFinite => TOP + BAND / 2.0,
            Y::Zero => TOP + PANEL_H - BAND / 2.0,
            Y::Log(l) => {
                let t = (l - self.y_lo) / (self.y_hi - self.y_lo).max(1e-9);
                self.plot_bottom() - t * (self.plot_bottom() - self.plot_top())
            }
        }
    }
}

fn text(out: &mut String, x: f64, y: f64, anchor: &str, size: u32, s: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}">{s}</text>"#
    );
}

fn marker(out: &mut String, x: f64, y: f64, v: Y, fill: &str) {
    let _ = match v {
        Y::Log(_) => writeln!(
            out,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{fill}"/>"#
        ),
        Y::NonFinite => writeln!(
            out,
            r#"<path d="M{:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1} Z" fill="white" stroke="{fill}" stroke-width="2"/>"#,
            x,
            y - 6.0,
            x - 6.0,
            y + 5.0,
            x + 6.0,
            y + 5.0
        ),
        Y::Zero => writeln!(
            out,
            r#"<path d="M{:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1} Z" fill="white" stroke="{fill}" stroke-width="2"/>"#,
            x,
            y + 6.0,
            x - 6.0,
            y - 5.0,
            x + 6.0,
            y - 5.0
        ),
    };
}

/// One panel: axes, bands, ticks, the floor and a line per method.
fn panel(
    out: &mut String,
    report: &Report,
    left: f64,
    title: &str,
    y_label: &str,
    value: impl Fn(&super::Row) -> f64,
    floor: impl Fn(&super::Floor) -> f64,
) {
    let offsets = &report.config.offsets;
    let lx: Vec<f64> = offsets.iter().map(|o| o.log10()).collect();
    let x_lo = lx.iter().copied().fold(f64::INFINITY, f64::min).floor();
    let mut x_hi = lx.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
    if x_hi <= x_lo {
        x_hi = x_lo + 1.0;
    }
    let logs: Vec<f64> = report
        .rows
        .iter()
        .map(&value)
        .chain(report.floors.iter().map(&floor))
        .filter_map(|v| match classify(v) {
            Y::Log(l) => Some(l),
            _ => None,
        })
        .collect();
    let y_lo = logs
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .floor()
        .max(-300.0);
    let mut y_hi = logs
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .ceil()
        .min(300.0);
    let y_lo = if y_lo.is_finite() { y_lo } else { -1.0 };
    if y_hi.is_nan() || y_hi <= y_lo {
        y_hi = y_lo + 1.0;
    }
    let p = Panel {
        left,
        x_lo,
        x_hi,
        y_lo,
        y_hi,
    };
    let (pt, pb) = (p.plot_top(), p.plot_bottom());
    let right = left + PANEL_W;

    // frame, bands
    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{TOP:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{TOP:.1}" width="{PANEL_W:.1}" height="{BAND:.1}" fill="#f3f3f3"/>"##
    );
    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{:.1}" width="{PANEL_W:.1}" height="{BAND:.1}" fill="#f3f3f3"/>"##,
        TOP + PANEL_H - BAND
    );
    for (y, label) in [(TOP + BAND, "NaN / ∞"), (TOP + PANEL_H - BAND, "exactly 0")] {
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#999" stroke-dasharray="2,3"/>"##
        );
        let ly = if y < TOP + PANEL_H / 2.0 {
            y - BAND / 2.0 + 4.0
        } else {
            y + BAND / 2.0 + 4.0
        };
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{ly:.1}" font-size="11" fill="#666" font-style="italic">{label}</text>"##,
            left + 6.0
        );
    }

    // x ticks: every decade
    let mut e = x_lo;
    while e <= x_hi + 1e-9 {
        let x = p.x(10f64.powf(e));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{pt:.1}" x2="{x:.1}" y2="{pb:.1}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##,
            TOP + PANEL_H,
            TOP + PANEL_H + 5.0
        );
        text(out, x, TOP + PANEL_H + 19.0, "middle", 12, &decade(e));
        e += 1.0;
    }
    // y ticks: at most ~10 labels
    let span = (y_hi - y_lo).max(1.0);
    let step = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 50.0]
        .into_iter()
        .find(|s| span / s <= 10.0)
        .unwrap_or(100.0);
    let mut e = (y_lo / step).ceil() * step;
    while e <= y_hi + 1e-9 {
        let y = p.y(Y::Log(e));
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{left:.1}" y2="{y:.1}" stroke="#333"/>"##,
            left - 5.0
        );
        text(out, left - 8.0, y + 4.0, "end", 12, &decade(e));
        e += step;
    }

    // labels
    text(out, left + PANEL_W / 2.0, TOP - 10.0, "middle", 15, title);
    text(
        out,
        left + PANEL_W / 2.0,
        TOP + PANEL_H + 40.0,
        "middle",
        13,
        "offset (mean of the row; std = 1)",
    );
    let (cx, cy) = (left - 58.0, pt + (pb - pt) / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{cx:.1}" y="{cy:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 {cx:.1} {cy:.1})">{y_label}</text>"#
    );

    // floor
    let pts: Vec<(f64, Y)> = report
        .floors
        .iter()
        .map(|f| (p.x(f.offset), classify(floor(f))))
        .collect();
    let _ = writeln!(
        out,
        r##"<path id="floor-{}" d="{}" fill="none" stroke="#888" stroke-width="1.5" stroke-dasharray="6,4"/>"##,
        left as u32,
        path_d(&p, &pts)
    );

    // methods; clamped points that coincide across methods are spread apart
    let band = |v: Y| match v {
        Y::Log(_) => 0u8,
        Y::NonFinite => 1,
        Y::Zero => 2,
    };
    let lines: Vec<(Method, Vec<(f64, Y)>)> = Method::ALL
        .iter()
        .map(|&m| {
            let pts = report
                .rows
                .iter()
                .filter(|r| r.method == m)
                .map(|r| (p.x(r.offset), classify(value(r))))
                .collect();
            (m, pts)
        })
        .collect();
    for (mi, (m, pts)) in lines.iter().enumerate() {
        let pts: Vec<(f64, Y)> = pts
            .iter()
            .enumerate()
            .map(|(i, &(x, v))| {
                if band(v) == 0 {
                    return (x, v);
                }
                let same =
                    |l: &(Method, Vec<(f64, Y)>)| l.1.get(i).is_some_and(|q| band(q.1) == band(v));
                let count = lines.iter().filter(|l| same(l)).count();
                let rank = lines.iter().take(mi).filter(|l| same(l)).count();
                (x + (rank as f64 - (count as f64 - 1.0) / 2.0) * 13.0, v)
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<path class="method" id="line-{}-{}" d="{}" fill="none" stroke="{}" stroke-width="2" stroke-opacity="0.85"/>"#,
            id(*m),
            left as u32,
            path_d(&p, &pts),
            color(*m)
        );
        for &(x, v) in &pts {
            marker(out, x, p.y(v), v, color(*m));
        }
    }
}

fn path_d(p: &Panel, pts: &[(f64, Y)]) -> String {
    let mut d = String::new();
    for (i, &(x, v)) in pts.iter().enumerate() {
        let _ = write!(
            d,
            "{}{:.1},{:.1} ",
            if i == 0 { "M" } else { "L" },
            x,
            p.y(v)
        );
    }
    d.trim_end().to_string()
}

fn decade(e: f64) -> String {
    let e = e.round() as i64;
    match e {
        0 => "1".into(),
        1 => "10".into(),
        _ => format!("1e{e}"),
    }
}

pub(super) fn render(report: &Report) -> String {
    let mut out = String::new();
    let c = &report.config;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    text(
        &mut out,
        W / 2.0,
        24.0,
        "middle",
        16,
        &format!(
            "f32 variance for LayerNorm: x = offset + N(0,1), D = {}, {} rows, {} lane(s), eps = {:e}",
            c.d, c.rows, c.lanes, c.eps
        ),
    );
    panel(
        &mut out,
        report,
        LEFT[0],
        "variance: relative error vs f64",
        "|var - ref| / ref (log scale)",
        |r| r.var_rel_err,
        |f| f.var_rel_err,
    );
    panel(
        &mut out,
        report,
        LEFT[1],
        "LayerNorm xhat: max abs error vs f64",
        "max |xhat - ref| (log scale)",
        |r| r.ln_max_err,
        |f| f.ln_max_err,
    );

    // legend
    let y0 = TOP + PANEL_H + 68.0;
    let mut x = LEFT[0];
    for m in Method::ALL {
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{y0:.1}" x2="{:.1}" y2="{y0:.1}" stroke="{}" stroke-width="2"/>"#,
            x + 26.0,
            color(m)
        );
        marker(&mut out, x + 13.0, y0, Y::Log(0.0), color(m));
        text(&mut out, x + 32.0, y0 + 4.0, "start", 13, m.name());
        x += 40.0 + 8.0 * m.name().len() as f64;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{:.1}" y2="{y0:.1}" stroke="#888" stroke-width="1.5" stroke-dasharray="6,4"/>"##,
        x + 26.0
    );
    text(
        &mut out,
        x + 32.0,
        y0 + 4.0,
        "start",
        13,
        "floor: exact math, mean stored in f32",
    );
    let y1 = y0 + 22.0;
    marker(&mut out, LEFT[0] + 13.0, y1 - 1.0, Y::NonFinite, "#555");
    text(
        &mut out,
        LEFT[0] + 32.0,
        y1 + 4.0,
        "start",
        12,
        "NaN or ∞ (e.g. negative variance, rsqrt NaN), drawn in the top band",
    );
    marker(&mut out, LEFT[1] + 13.0, y1 + 1.0, Y::Zero, "#555");
    text(
        &mut out,
        LEFT[1] + 32.0,
        y1 + 4.0,
        "start",
        12,
        "error exactly 0, drawn in the bottom band",
    );
    out.push_str("</svg>\n");
    out
}
