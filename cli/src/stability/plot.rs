//! The stability plot through `plotters`: two log-log panels (variance
//! error, LayerNorm error) with a band on top for NaN/infinite errors and one
//! at the bottom for errors of exactly 0, which a log axis cannot show.

use super::{Floor, Method, Report, Row};
use crate::plot::{text_of, Figure, FAMILY};
use plotters::coord::Shift;
use plotters::prelude::*;

type Res = std::result::Result<(), String>;

fn color(m: Method) -> RGBColor {
    match m {
        Method::Naive => RGBColor(0xd6, 0x27, 0x28),
        Method::TwoPass => RGBColor(0x1f, 0x77, 0xb4),
        Method::TwoPassShifted => RGBColor(0x2c, 0xa0, 0x2c),
        Method::Welford => RGBColor(0xff, 0x7f, 0x0e),
    }
}

const GREY: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// Decades shown in a panel, `lo..=hi`, and where the two bands sit: the
/// NaN band one decade above `hi`, the zero band one below `lo`.
#[derive(Clone, Copy)]
struct Axis {
    lo: f64,
    hi: f64,
}

impl Axis {
    /// Floor/ceil of the finite logs, clamped to +-300 decades; one decade
    /// when there are none, so every report draws.
    fn over(logs: impl Iterator<Item = f64>) -> Axis {
        let (lo, hi) = logs
            .filter(|l| l.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), l| {
                (a.min(l), b.max(l))
            });
        let lo = if lo.is_finite() {
            lo.floor().max(-300.0)
        } else {
            -1.0
        };
        let hi = if hi.is_finite() {
            hi.ceil().min(300.0)
        } else {
            lo + 1.0
        };
        Axis {
            lo,
            hi: hi.max(lo + 1.0),
        }
    }

    /// Where a value is drawn: its log, or a band.
    fn place(self, v: f64) -> (f64, bool) {
        if !v.is_finite() {
            (self.hi + 1.0, true)
        } else if v <= 0.0 {
            (self.lo - 1.0, true)
        } else {
            (v.log10().clamp(self.lo, self.hi), false)
        }
    }
}

fn decade(e: f64) -> String {
    match e.round() as i64 {
        0 => "1".into(),
        1 => "10".into(),
        e => format!("1e{e}"),
    }
}

/// Labels only whole decades inside `lo..=hi`, so band rows and fractional
/// ticks stay unlabelled.
fn label(v: f64, lo: f64, hi: f64) -> String {
    if (v - v.round()).abs() < 1e-6 && v >= lo - 1e-6 && v <= hi + 1e-6 {
        decade(v)
    } else {
        String::new()
    }
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    title: &str,
    y_desc: &str,
    value: fn(&Row) -> f64,
    floor: fn(&Floor) -> f64,
) -> Res {
    let logs = report.config.offsets.iter().map(|o| o.log10());
    let x = Axis::over(logs);
    let y = Axis::over(
        report
            .rows
            .iter()
            .map(value)
            .chain(report.floors.iter().map(floor))
            .map(f64::log10),
    );
    let (x0, x1) = (x.lo - 0.4, x.hi + 0.4);
    let (y0, y1) = (y.lo - 1.6, y.hi + 1.6);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 17))
        .margin(12)
        .x_label_area_size(46)
        .y_label_area_size(62)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(text_of)?;
    let (xl, xh, yl, yh) = (x.lo, x.hi, y.lo, y.hi);
    chart
        .configure_mesh()
        .x_desc("offset (mean of the row; std = 1)")
        .y_desc(y_desc)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .x_labels(((xh - xl) as usize + 2).min(40))
        .y_labels(((yh - yl) as usize + 4).min(24))
        .x_label_formatter(&|v| label(*v, xl, xh))
        .y_label_formatter(&|v| label(*v, yl, yh))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(text_of)?;
    // The bands: shaded, a dashed edge, a name.
    let shade = RGBColor(0xf3, 0xf3, 0xf3).filled();
    for (a, b, edge, name) in [
        (y.hi + 0.5, y1, y.hi + 0.5, "NaN / ∞"),
        (y0, y.lo - 0.5, y.lo - 0.5, "exactly 0"),
    ] {
        chart
            .draw_series([Rectangle::new([(x0, a), (x1, b)], shade)])
            .map_err(text_of)?;
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, edge), (x1, edge)],
                3,
                3,
                GREY.stroke_width(1),
            ))
            .map_err(text_of)?;
        let at = (x0 + 0.05, (a + b) / 2.0 + 0.25);
        chart
            .draw_series([Text::new(name, at, (FAMILY, 12).into_font().color(&GREY))])
            .map_err(text_of)?;
    }
    let floor_pts: Vec<(f64, f64)> = report
        .floors
        .iter()
        .filter(|f| f.offset.log10().is_finite())
        .map(|f| (f.offset.log10(), y.place(floor(f)).0))
        .collect();
    chart
        .draw_series(DashedLineSeries::new(floor_pts, 7, 4, GREY.stroke_width(2)))
        .map_err(text_of)?;
    // Methods; band points that coincide across methods are spread apart.
    let lines: Vec<Vec<(f64, f64, bool)>> = Method::ALL
        .iter()
        .map(|&m| {
            let rows = report.rows.iter().filter(|r| r.method == m);
            rows.filter(|r| r.offset.log10().is_finite())
                .map(|r| {
                    let (py, band) = y.place(value(r));
                    (r.offset.log10(), py, band)
                })
                .collect()
        })
        .collect();
    for (mi, (&m, pts)) in Method::ALL.iter().zip(&lines).enumerate() {
        let c = color(m);
        let spread: Vec<(f64, f64, bool)> = pts
            .iter()
            .enumerate()
            .map(|(i, &(px, py, band))| {
                if !band {
                    return (px, py, band);
                }
                let same = |l: &Vec<(f64, f64, bool)>| l.get(i).is_some_and(|q| q.2 && q.1 == py);
                let count = lines.iter().filter(|l| same(l)).count() as f64;
                let rank = lines.iter().take(mi).filter(|l| same(l)).count() as f64;
                (px + (rank - (count - 1.0) / 2.0) * 0.12, py, band)
            })
            .collect();
        let path = spread.iter().map(|&(a, b, _)| (a, b));
        chart
            .draw_series(LineSeries::new(path, c.mix(0.85).stroke_width(2)))
            .map_err(text_of)?;
        for &(px, py, band) in &spread {
            if band {
                chart
                    .draw_series([TriangleMarker::new((px, py), 6, c.stroke_width(2))])
                    .map_err(text_of)?;
            } else {
                chart
                    .draw_series([Circle::new((px, py), 3, c.filled())])
                    .map_err(text_of)?;
            }
        }
    }
    Ok(())
}

/// The legend strip: a line and dot per method, the floor, the two bands.
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>) -> Res {
    let font = (FAMILY, 14).into_font();
    let small = (FAMILY, 13).into_font();
    let mut x = 90;
    let y = 18;
    for m in Method::ALL {
        let c = color(m);
        area.draw(&PathElement::new(
            vec![(x, y), (x + 26, y)],
            c.stroke_width(2),
        ))
        .map_err(text_of)?;
        area.draw(&Circle::new((x + 13, y), 3, c.filled()))
            .map_err(text_of)?;
        area.draw(&Text::new(m.name(), (x + 32, y - 8), font.clone()))
            .map_err(text_of)?;
        x += 48 + 8 * m.name().len() as i32;
    }
    for k in 0..3 {
        let a = x + 10 * k;
        area.draw(&PathElement::new(
            vec![(a, y), (a + 6, y)],
            GREY.stroke_width(2),
        ))
        .map_err(text_of)?;
    }
    area.draw(&Text::new(
        "floor: exact math, mean stored in f32",
        (x + 32, y - 8),
        font,
    ))
    .map_err(text_of)?;
    let y = y + 26;
    area.draw(&TriangleMarker::new((103, y), 6, GREY.stroke_width(2)))
        .map_err(text_of)?;
    area.draw(&Text::new(
        "NaN or ∞ (a negative variance makes rsqrt NaN): top band;  error exactly 0: bottom band",
        (122, y - 7),
        small,
    ))
    .map_err(text_of)?;
    Ok(())
}

impl Figure for Report {
    fn size(&self) -> (u32, u32) {
        (1110, 600)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Res {
        root.fill(&WHITE).map_err(text_of)?;
        let c = &self.config;
        let title = format!(
            "f32 variance for LayerNorm: x = offset + N(0,1), D = {}, {} rows, {} lane(s), eps = {:e}",
            c.d, c.rows, c.lanes, c.eps
        );
        let body = root.titled(&title, (FAMILY, 18)).map_err(text_of)?;
        let h = body.dim_in_pixel().1;
        let (panels, strip) = body.split_vertically(h.saturating_sub(62));
        let halves = panels.split_evenly((1, 2));
        let [left, right] = halves.as_slice() else {
            return Err("the plot area did not split in two".into());
        };
        panel(
            left,
            self,
            "variance: relative error vs f64",
            "|var - ref| / ref (log scale)",
            |r| r.var_rel_err,
            |f| f.var_rel_err,
        )?;
        panel(
            right,
            self,
            "LayerNorm xhat: max abs error vs f64",
            "max |xhat - ref| (log scale)",
            |r| r.ln_max_err,
            |f| f.ln_max_err,
        )?;
        legend(&strip)
    }
}
