//! The library's tests: one binary, one module per layer (`core`, `ops`,
//! `norms`, `nn`, `cuda`), so the library's generic code is instantiated
//! once for all of them (an optimized build shares no generic instance
//! between binaries). One group: `cargo test --release --test library --
//! norms::`.

mod common;
mod cuda_emu;

mod core;
mod cuda;
mod nn;
mod norms;
mod ops;
