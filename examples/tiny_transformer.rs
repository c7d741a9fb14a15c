//! A character-level transformer trained on a text.
//!
//! ```text
//! cargo run --release --example tiny_transformer -- [--text FILE] [--steps N]
//!     [--minutes M] [--composed] [--device cpu|cuda] [--seed S]
//!     [--save FILE] [--load FILE] [--plots DIR] [--dtype f32|bf16]
//!     [--checkpoint DIR [--checkpoint-every N] [--keep K]] [--resume DIR]
//! ```
//!
//! The same run as `fusegrad train transformer` (both call
//! `fusegrad_cli::app::transformer`): without `--text` it reads this crate's
//! own sources and docs; it prints the unigram entropy and a smoothed
//! bigram model's validation loss (the bars to pass), the validation loss
//! under a progress bar as the model trains, a sampled line, and writes
//! the loss plot to `target/plots/transformer_loss.{png,svg}`.

use fusegrad_cli::app::{matches_or_exit, transformer};

fn main() {
    let m = matches_or_exit(transformer::command("tiny_transformer"));
    let result = transformer::Options::from_matches(&m).and_then(|o| transformer::run_any(&o));
    if let Err(e) = result {
        eprintln!("tiny_transformer: {e}");
        std::process::exit(1);
    }
}
