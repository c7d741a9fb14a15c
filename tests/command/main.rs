//! The `fusegrad` command and its crate (`fusegrad_cli`): the training
//! front ends, demos, analysis, stability study, plots, the GPU kit and a
//! broken driver.

#[path = "../common/mod.rs"]
mod common;

mod analysis;
mod analysis_edges;
mod broken_driver;
mod char_lm;
mod checkpoint;
mod demos;
mod distributed;
mod gpu_kit;
mod plot;
mod props;
mod stability;
mod train;
