//! Sampler: llama.cpp's flag semantics on logits whose answer is known, seeded reproducibility,
//! and the empirical distribution against softmax.

use hob::generate::{GenerateError, Sampler, SamplerConfig};

/// Every filter off, temperature 1: a plain draw from softmax(logits).
fn plain(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed,
    }
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..plain(0)
    }
}

fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn counts(cfg: SamplerConfig, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut sampler = Sampler::new(cfg).unwrap();
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits, &[]) as usize] += 1;
    }
    counts
}

/// A fixed, varied logit vector (no RNG crate needed for the inputs).
fn wavy_logits(n: usize, phase: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.37 + phase).sin() * 3.0) + (i % 7) as f32 * 0.1)
        .collect()
}

#[test]
fn greedy_picks_the_first_argmax() {
    let mut sampler = Sampler::new(greedy()).unwrap();
    assert_eq!(sampler.sample(&[0.1, 2.5, -3.0, 2.4], &[]), 1);
    assert_eq!(sampler.sample(&[1.0, 3.0, 3.0, -1.0], &[]), 1);
    let mut negative = Sampler::new(SamplerConfig {
        temperature: -1.0,
        ..plain(0)
    })
    .unwrap();
    assert_eq!(negative.sample(&[-5.0, -4.0, -4.5], &[]), 1);
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    let run = |seed| {
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            ..plain(seed)
        })
        .unwrap();
        (0..200)
            .map(|step| sampler.sample(&wavy_logits(1000, step as f32 * 0.1), &[]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn top_k_one_is_greedy() {
    let mut top1 = Sampler::new(SamplerConfig {
        top_k: 1,
        ..plain(7)
    })
    .unwrap();
    let mut argmax = Sampler::new(greedy()).unwrap();
    for step in 0..100 {
        let logits = wavy_logits(500, step as f32);
        assert_eq!(top1.sample(&logits, &[]), argmax.sample(&logits, &[]));
    }
}

const PROBS: [f64; 4] = [0.5, 0.3, 0.15, 0.05];

#[test]
fn top_k_keeps_the_k_most_likely() {
    let got = counts(
        SamplerConfig {
            top_k: 2,
            ..plain(1)
        },
        &logits_of(&PROBS),
        4000,
    );
    assert!(got[0] > 0 && got[1] > 0, "{got:?}");
    assert_eq!(&got[2..], [0, 0]);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // Cumulative 0.5, 0.8, 0.95, 1.0: p = 0.7 needs the first two, p = 0.9 the first three.
    let got = counts(
        SamplerConfig {
            top_p: 0.7,
            ..plain(2)
        },
        &logits_of(&PROBS),
        4000,
    );
    assert!(got[0] > 0 && got[1] > 0, "{got:?}");
    assert_eq!(&got[2..], [0, 0]);
    // Renormalized over what is left: 0.5 / 0.8 = 0.625.
    assert!((got[0] as f64 / 4000.0 - 0.625).abs() < 0.03, "{got:?}");

    let got = counts(
        SamplerConfig {
            top_p: 0.9,
            ..plain(3)
        },
        &logits_of(&PROBS),
        4000,
    );
    assert!(got[2] > 0 && got[3] == 0, "{got:?}");
}

#[test]
fn min_p_drops_tokens_below_a_share_of_the_best() {
    // min_p = 0.2: threshold 0.2 * 0.5 = 0.1 keeps 0.15 and drops 0.05.
    let got = counts(
        SamplerConfig {
            min_p: 0.2,
            ..plain(4)
        },
        &logits_of(&PROBS),
        4000,
    );
    assert!(got[2] > 0, "{got:?}");
    assert_eq!(got[3], 0);
    // min_p = 0.7: only 0.5 itself passes 0.35.
    let got = counts(
        SamplerConfig {
            min_p: 0.7,
            ..plain(5)
        },
        &logits_of(&PROBS),
        500,
    );
    assert_eq!(got, [500, 0, 0, 0]);
}

#[test]
fn repeat_penalty_follows_llama_cpp() {
    let penalized = |logits: &[f32], history: &[u32], last_n: usize| {
        let mut sampler = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            repeat_last_n: last_n,
            ..greedy()
        })
        .unwrap();
        sampler.sample(logits, history)
    };
    // A positive logit is divided: 4.0 -> 2.0 still beats 1.9; once per token however often it
    // repeats (dividing twice would give 1.0 and lose).
    assert_eq!(penalized(&[4.0, 1.9], &[0, 0, 0], 64), 0);
    assert_eq!(penalized(&[4.0, 2.1], &[0], 64), 1);
    // A negative logit is multiplied: -1.0 -> -2.0 loses to -1.5 (dividing would give -0.5).
    assert_eq!(penalized(&[-1.0, -1.5], &[0], 64), 1);
    // Only the last n tokens count: with n = 1 token 0 (earlier) keeps 4.0; with n = 2 it drops
    // to 2.0, below the untouched 2.05.
    assert_eq!(penalized(&[4.0, 2.1, 2.05], &[0, 1], 1), 0);
    assert_eq!(penalized(&[4.0, 2.1, 2.05], &[0, 1], 2), 2);
    // Ids beyond the vocabulary in the history are ignored.
    assert_eq!(penalized(&[4.0, 2.1], &[7], 64), 0);
}

#[test]
fn temperature_one_matches_softmax() {
    let probs = [0.4, 0.25, 0.2, 0.1, 0.05];
    let draws = 20_000;
    let got = counts(plain(2024), &logits_of(&probs), draws);
    let chi2: f64 = got
        .iter()
        .zip(probs)
        .map(|(&n, p)| {
            let expected = p * draws as f64;
            (n as f64 - expected).powi(2) / expected
        })
        .sum();
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001 for a correct sampler.
    assert!(chi2 < 18.47, "chi2 {chi2:.2}, counts {got:?}");
    for (&n, p) in got.iter().zip(probs) {
        assert!((n as f64 / draws as f64 - p).abs() < 0.012, "{got:?}");
    }
}

#[test]
fn temperature_sharpens_and_flattens() {
    // At temperature T the probabilities are p^(1/T) renormalized.
    let probs = [0.6, 0.3, 0.1];
    for temperature in [0.5f32, 2.0] {
        let draws = 20_000;
        let got = counts(
            SamplerConfig {
                temperature,
                ..plain(9)
            },
            &logits_of(&probs),
            draws,
        );
        let scaled: Vec<f64> = probs
            .iter()
            .map(|p: &f64| p.powf(1.0 / f64::from(temperature)))
            .collect();
        let total: f64 = scaled.iter().sum();
        for (&n, s) in got.iter().zip(&scaled) {
            let expected = s / total;
            assert!(
                (n as f64 / draws as f64 - expected).abs() < 0.012,
                "T = {temperature}: {got:?} vs {expected}"
            );
        }
    }
}

#[test]
fn bad_parameters_are_refused_with_their_name() {
    let err = |cfg: SamplerConfig| Sampler::new(cfg).err().unwrap();
    let top_p = err(SamplerConfig {
        top_p: 0.0,
        ..plain(0)
    });
    assert!(matches!(
        top_p,
        GenerateError::InvalidSampler { field: "top_p", .. }
    ));
    assert_eq!(
        top_p.to_string(),
        "sampler: top_p must be in (0, 1], found 0"
    );
    let min_p = err(SamplerConfig {
        min_p: 1.5,
        ..plain(0)
    });
    assert_eq!(
        min_p.to_string(),
        "sampler: min_p must be in [0, 1], found 1.5"
    );
    assert!(Sampler::new(SamplerConfig {
        repeat_penalty: 0.0,
        ..plain(0)
    })
    .is_err());
    assert!(Sampler::new(SamplerConfig {
        temperature: f32::NAN,
        ..plain(0)
    })
    .is_err());
    assert!(Sampler::new(SamplerConfig::default()).is_ok());
}

/// OpenAI's presence and frequency penalties as llama.cpp applies them: logit - count * frequency
/// - presence for each token in the window, after the repeat penalty, counted once per token.
#[test]
fn presence_and_frequency_penalties_follow_llama_cpp() {
    // Token 0 leads by 1.0; it occurred twice in the window, token 1 never.
    let logits = [3.0f32, 2.0, 0.5];
    let history = [0u32, 0, 2];
    let greedy_with = |presence, frequency| {
        let mut s = Sampler::new(SamplerConfig {
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..greedy()
        })
        .unwrap();
        s.sample(&logits, &history)
    };
    assert_eq!(greedy_with(0.0, 0.0), 0);
    // 3.0 - 0.9 = 2.1 > 2.0: token 0 stays; 3.0 - 1.1 = 1.9 < 2.0: token 1 wins.
    assert_eq!(greedy_with(0.9, 0.0), 0);
    assert_eq!(greedy_with(1.1, 0.0), 1);
    // Frequency counts both occurrences: 3.0 - 2 * 0.45 = 2.1, 3.0 - 2 * 0.55 = 1.9.
    assert_eq!(greedy_with(0.0, 0.45), 0);
    assert_eq!(greedy_with(0.0, 0.55), 1);
    let bad = SamplerConfig {
        presence_penalty: f32::NAN,
        ..greedy()
    };
    assert!(matches!(
        Sampler::new(bad),
        Err(GenerateError::InvalidSampler {
            field: "presence_penalty",
            ..
        })
    ));
}
