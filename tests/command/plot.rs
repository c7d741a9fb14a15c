//! `fusegrad_cli::plot`: the extension picks the format, awkward data still
//! draws, and bad paths are errors.

use fusegrad::Error;
use fusegrad_cli::plot::{Format, LinePlot, Series, Style};
use std::path::Path;

fn plot(log_y: bool, series: Vec<Series>) -> LinePlot {
    LinePlot {
        title: "loss".into(),
        x_label: "step".into(),
        y_label: "nats".into(),
        log_y,
        series,
    }
}

#[test]
fn the_extension_picks_the_format() {
    assert_eq!(
        Format::from_path(Path::new("a/b.svg")).unwrap(),
        Format::Svg
    );
    assert_eq!(Format::from_path(Path::new("B.PNG")).unwrap(), Format::Png);
    for bad in ["plot", "plot.jpg", "svg", ".png.txt"] {
        assert!(
            matches!(Format::from_path(Path::new(bad)), Err(Error::Plot { .. })),
            "{bad}"
        );
    }
}

#[test]
fn curves_draw_in_both_formats_with_their_names() {
    let curve: Vec<(f64, f64)> = (0..50)
        .map(|i| (i as f64, 2.0 / (1.0 + i as f64)))
        .collect();
    let p = plot(
        true,
        vec![
            Series::new("fused", Style::Line, curve.clone()),
            Series::new("composed", Style::Dashed, curve.clone()),
            Series::new("validation", Style::Dots, curve[..5].to_vec()),
        ],
    );
    let svg = p.to_svg().unwrap();
    for name in ["fused", "composed", "validation", "loss", "step", "nats"] {
        assert!(svg.contains(name), "{name}");
    }
    let png = p.to_png().unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn empty_non_finite_and_non_positive_data_still_draw() {
    let cases = [
        plot(false, vec![]),
        plot(true, vec![Series::new("empty", Style::Line, vec![])]),
        plot(
            false,
            vec![Series::new("one", Style::Dashed, vec![(1.0, 1.0)])],
        ),
        plot(false, vec![Series::new("none", Style::Dashed, vec![])]),
        plot(
            true,
            vec![Series::new(
                "odd",
                Style::Dots,
                vec![
                    (0.0, 0.0),
                    (1.0, -1.0),
                    (2.0, f64::NAN),
                    (f64::INFINITY, 1.0),
                ],
            )],
        ),
        plot(
            false,
            vec![Series::new(
                "flat",
                Style::Line,
                vec![(3.0, 1.0), (3.0, 1.0)],
            )],
        ),
    ];
    for p in &cases {
        assert!(p.to_svg().unwrap().contains("</svg>"));
        assert!(!p.to_png().unwrap().is_empty());
    }
}

#[test]
fn both_files_are_written_and_unwritable_folders_are_errors() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plot-files");
    let _ = std::fs::remove_dir_all(&dir);
    let p = plot(
        false,
        vec![Series::new("a", Style::Line, vec![(0.0, 1.0), (1.0, 0.5)])],
    );
    let [png, svg] = p.write_both(&dir.join("deeper"), "curve").unwrap();
    assert!(std::fs::read(png).unwrap().starts_with(b"\x89PNG"));
    assert!(std::fs::read_to_string(svg).unwrap().starts_with("<svg"));
    let file = dir.join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    assert!(matches!(
        p.write(&file.join("x.svg")),
        Err(Error::Plot { .. })
    ));
}
