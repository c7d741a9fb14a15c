//! Core: the tape, errors and bad input, NaN and infinities, threads, no
//! silent graph cut, and what happens where no GPU can be used.

mod concurrency;
mod finite;
mod no_gpu;
mod no_graph_cuts;
mod robustness;
mod tape;
