//! The library's tests: one binary, one module per layer (`core`, `ops`,
//! `norms`, `nn`), so the library's generic code is instantiated once for
//! all of them (an optimized build shares no generic instance between
//! binaries). One group: `cargo test --release --test library -- norms::`.
//! The CUDA tests are `tests/cuda/`, a binary of their own.

mod common;

mod core;
mod nn;
mod norms;
mod ops;
