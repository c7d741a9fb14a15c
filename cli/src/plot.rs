//! Plots as SVG or PNG through `plotters`: line charts of training runs
//! ([`LinePlot`]) and the backends' plumbing the stability plot shares.
//!
//! Text is drawn by `ab_glyph` from an embedded subset of DejaVu Sans
//! (printable ASCII, Greek letters and a few math signs; 17 KB, Bitstream
//! Vera licence in `assets/fonts/`), so a PNG has its labels on a machine
//! with no fonts and no font library installed. SVG files name the family
//! `sans-serif` and let the viewer pick the face.

use fusegrad::error::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans-subset.ttf");

/// The family every plot asks for; the embedded font is registered under it.
pub(crate) const FAMILY: &str = "sans-serif";

/// Registers the embedded font once; every later call sees the first
/// outcome (plotters keeps fonts in a process-wide table).
fn font_ready() -> std::result::Result<(), String> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded font could not be parsed".into())
    }
}

/// A file type a plot can be written as, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics (`.svg`).
    Svg,
    /// An RGB bitmap (`.png`).
    Png,
}

impl Format {
    /// `.svg` or `.png` (any case); anything else is an error naming the
    /// path, so a typo never writes a file of the wrong kind.
    pub fn from_path(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(Error::Plot {
                path: path.display().to_string(),
                msg: "the file name must end in .svg or .png".into(),
            }),
        }
    }
}

/// Something that draws itself on any plotters backend at a fixed size.
pub(crate) trait Figure {
    /// Width and height in pixels (SVG user units).
    fn size(&self) -> (u32, u32);
    /// Draws onto `root`; errors as text.
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>;
}

/// Any plotters error as the text of an [`Error::Plot`].
pub(crate) fn text_of<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn plot_err(what: &str, msg: String) -> Error {
    Error::Plot {
        path: what.into(),
        msg,
    }
}

/// The figure as a standalone SVG document.
pub(crate) fn svg_of<F: Figure>(fig: &F) -> Result<String> {
    font_ready().map_err(|m| plot_err("<svg>", m))?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, fig.size()).into_drawing_area();
        fig.draw(&root).map_err(|m| plot_err("<svg>", m))?;
        root.present().map_err(|e| plot_err("<svg>", text_of(e)))?;
    }
    Ok(out)
}

/// The figure as PNG bytes (8-bit RGB).
pub(crate) fn png_of<F: Figure>(fig: &F) -> Result<Vec<u8>> {
    font_ready().map_err(|m| plot_err("<png>", m))?;
    let (w, h) = fig.size();
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        fig.draw(&root).map_err(|m| plot_err("<png>", m))?;
        root.present().map_err(|e| plot_err("<png>", text_of(e)))?;
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc
        .write_header()
        .map_err(|e| plot_err("<png>", text_of(e)))?;
    writer
        .write_image_data(&rgb)
        .and_then(|_| writer.finish())
        .map_err(|e| plot_err("<png>", text_of(e)))?;
    Ok(out)
}

/// Writes the figure to `path` as SVG or PNG by its extension, creating
/// missing parent folders.
pub(crate) fn write_figure<F: Figure>(fig: &F, path: &Path) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => svg_of(fig)?.into_bytes(),
        Format::Png => png_of(fig)?,
    };
    let io = |e: std::io::Error| plot_err(&path.display().to_string(), e.to_string());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    fusegrad::write_atomic(path, &bytes).map_err(io)
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A solid line through the points.
    Line,
    /// A dashed line (a second run on top of the first stays visible).
    Dashed,
    /// A line with a dot at each point (sparse curves such as validation).
    Dots,
}

/// One named curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// `(x, y)` points in order; non-finite ones (and, on a log axis,
    /// non-positive ones) are left out.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub style: Style,
}

impl Series {
    /// A series named `name` drawn in `style`.
    pub fn new(name: impl Into<String>, style: Style, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            style,
        }
    }
}

/// A chart of curves over a shared x axis, such as a loss curve.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePlot {
    /// The caption.
    pub title: String,
    /// The x axis' label.
    pub x_label: String,
    /// The y axis' label.
    pub y_label: String,
    /// A logarithmic y axis.
    pub log_y: bool,
    /// The curves, drawn in order with colours from a fixed palette.
    pub series: Vec<Series>,
}

/// Colours of series `0, 1, ...` (then repeating): matplotlib's first six.
pub(crate) const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x7f, 0x7f, 0x7f),
];

impl LinePlot {
    /// The plot as a standalone SVG document.
    pub fn to_svg(&self) -> Result<String> {
        svg_of(self)
    }

    /// The plot as PNG bytes.
    pub fn to_png(&self) -> Result<Vec<u8>> {
        png_of(self)
    }

    /// Writes the plot to `path`; its extension (`.svg`, `.png`) picks the
    /// format.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_figure(self, path)
    }

    /// Writes `dir/stem.png` and `dir/stem.svg` and returns the two paths.
    pub fn write_both(&self, dir: &Path, stem: &str) -> Result<[PathBuf; 2]> {
        let paths = [
            dir.join(format!("{stem}.png")),
            dir.join(format!("{stem}.svg")),
        ];
        for p in &paths {
            self.write(p)?;
        }
        Ok(paths)
    }

    /// The points of series `i` that the axes can show.
    fn shown(&self, i: usize) -> Vec<(f64, f64)> {
        let log = self.log_y;
        self.series[i]
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| x.is_finite() && y.is_finite() && (!log || y > 0.0))
            .collect()
    }

    /// Axis ranges over the shown points, padded; `[0, 1]` (or `[0.1, 1]`
    /// on a log axis) when there are none, so an empty run still draws.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let pts: Vec<(f64, f64)> = (0..self.series.len()).flat_map(|i| self.shown(i)).collect();
        let lo_hi = |v: &mut dyn Iterator<Item = f64>| {
            v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            })
        };
        let (x0, x1) = lo_hi(&mut pts.iter().map(|p| p.0));
        let (y0, y1) = lo_hi(&mut pts.iter().map(|p| p.1));
        if pts.is_empty() {
            return ((0.0, 1.0), (if self.log_y { 0.1 } else { 0.0 }, 1.0));
        }
        let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
        let (y0, y1) = if self.log_y {
            (y0 / 1.25, if y1 > y0 { y1 * 1.25 } else { y0 * 10.0 })
        } else {
            let pad = if y1 > y0 { 0.05 * (y1 - y0) } else { 0.5 };
            (y0 - pad, y1 + pad)
        };
        ((x0, x1), (y0, y1))
    }
}

/// A tick label with at most three significant digits and no trailing
/// zeros (`0.3`, not `0.30000000000000004`; `10`, not `10.0`); powers
/// of ten beyond `1e4` or below `1e-3` in exponent form.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || !a.is_finite() {
        return format!("{v}");
    }
    if !(1e-3..1e4).contains(&a) {
        return format!("{v:.1e}").replace(".0e", "e");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

impl Figure for LinePlot {
    fn size(&self) -> (u32, u32) {
        (900, 560)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        root.fill(&WHITE).map_err(text_of)?;
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut b = ChartBuilder::on(root);
        b.caption(&self.title, (FAMILY, 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70);
        // The two axis kinds are different types, so the body is a macro.
        macro_rules! body {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(self.x_label.as_str())
                    .y_desc(self.y_label.as_str())
                    .label_style((FAMILY, 14))
                    .axis_desc_style((FAMILY, 15))
                    .light_line_style(RGBColor(0xee, 0xee, 0xee))
                    .x_label_formatter(&|v| tick(*v))
                    .y_label_formatter(&|v| tick(*v))
                    .draw()
                    .map_err(text_of)?;
                for (i, s) in self.series.iter().enumerate() {
                    let c = PALETTE[i % PALETTE.len()];
                    let pts = self.shown(i);
                    let anno = match s.style {
                        Style::Line => chart.draw_series(LineSeries::new(pts, c.stroke_width(2))),
                        Style::Dashed => {
                            chart.draw_series(DashedLineSeries::new(pts, 8, 5, c.stroke_width(2)))
                        }
                        Style::Dots => {
                            let dots = pts.iter().map(|&p| Circle::new(p, 3, c.filled()));
                            chart.draw_series(dots).map_err(text_of)?;
                            chart.draw_series(LineSeries::new(pts, c.stroke_width(1)))
                        }
                    }
                    .map_err(text_of)?;
                    anno.label(s.name.as_str()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2))
                    });
                }
                chart
                    .configure_series_labels()
                    .label_font((FAMILY, 14))
                    .background_style(WHITE.mix(0.85))
                    .border_style(RGBColor(0x99, 0x99, 0x99))
                    .position(SeriesLabelPosition::UpperRight)
                    .draw()
                    .map_err(text_of)?;
            }};
        }
        if self.log_y {
            body!(b
                .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
                .map_err(text_of)?);
        } else {
            body!(b.build_cartesian_2d(x0..x1, y0..y1).map_err(text_of)?);
        }
        Ok(())
    }
}
