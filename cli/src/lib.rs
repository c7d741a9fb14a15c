//! The `fusegrad` command's parts, apart from the library: the report, the
//! benchmarks, the LayerNorm analysis, the variance-stability study, the
//! plots, the demos and the training front ends with their progress bar.
//! [`command`] parses the command line and calls these; `src/main.rs`
//! only calls it.
//!
//! A demo trained with the terminal bar (an [`fusegrad::nn::Observer`]),
//! and its loss curve written as PNG and SVG:
//!
//! ```
//! use fusegrad_cli::demo::{train_spirals_observed, SpiralConfig};
//! use fusegrad_cli::plot::{LinePlot, Series, Style};
//! use fusegrad_cli::progress::Bar;
//!
//! let config = SpiralConfig { steps: 30, ..SpiralConfig::default() };
//! let mut bar = Bar::new(config.steps, "samples");
//! let run = train_spirals_observed::<f32>(&config, &mut bar)?;
//! bar.finish();
//! assert!(run.final_loss < run.losses[0]);
//!
//! let curve = run.losses.iter().enumerate().map(|(i, &l)| (i as f64, l)).collect();
//! let plot = LinePlot {
//!     title: "spirals".into(),
//!     x_label: "step".into(),
//!     y_label: "cross-entropy".into(),
//!     log_y: true,
//!     series: vec![Series::new("fused LayerNorm", Style::Line, curve)],
//! };
//! let [png, svg] = plot.write_both(&std::env::temp_dir().join("fusegrad-doc"), "loss")?;
//! assert!(png.exists() && svg.exists());
//! # Ok::<(), fusegrad::Error>(())
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod analysis;
pub mod app;
pub mod bench;
pub mod char_lm;
pub mod checkpoint;
pub mod command;
pub mod demo;
pub mod plot;
pub mod progress;
pub mod report;
pub mod stability;
