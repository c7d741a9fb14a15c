//! The character language model the `train transformer` command trains
//! (`fusegrad_cli::char_lm`): it learns, and the composed norms follow.

use fusegrad::nn::{GptConfig, NormImpl};
use fusegrad_cli::char_lm::{train_char_lm, CharData, CharLmConfig};
use std::time::Duration;

/// A small model on a repetitive text: the validation loss falls well
/// under the bigram bar, and the composed twin's curve follows the fused one.
#[test]
fn small_char_lm_learns_and_fused_matches_composed() {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(60);
    let cfg = CharLmConfig {
        model: GptConfig {
            vocab: 0,
            context: 16,
            width: 32,
            heads: 2,
            layers: 2,
        },
        batch: 8,
        steps: 200,
        time_limit: Duration::MAX,
        lr: 3e-3,
        warmup: 5,
        eval_every: 50,
        eval_batches: 2,
        ..CharLmConfig::default()
    };
    let data = CharData::new(&text, 16).unwrap();
    let fused = train_char_lm(&data, &cfg, NormImpl::Fused, |_| {}).unwrap();
    let (first, last) = (
        fused.evals[0].val_bits,
        fused.evals.last().unwrap().val_bits,
    );
    assert!(last < 0.5 * first, "validation {first} -> {last} bits");
    assert!(
        last < data.bigram_bits(),
        "{last} vs bigram {}",
        data.bigram_bits()
    );
    let composed = train_char_lm(&data, &cfg, NormImpl::Composed, |_| {}).unwrap();
    assert_eq!(fused.losses.len(), composed.losses.len());
    for (s, (f, c)) in fused.losses.iter().zip(&composed.losses).enumerate() {
        assert!(
            (f - c).abs() <= 1e-3 * f.abs(),
            "step {s}: fused {f} composed {c}"
        );
    }
}
