//! YaRN (gpt-oss's RoPE scaling): each frequency blended between the plain one and one `factor`
//! times lower, by a linear ramp over a correction range of dimensions, and cos/sin scaled by
//! an attention factor. The frequencies do not depend on the context length (unlike LongRoPE).

use super::ModelError;
use crate::format::keys::{self, arch_key};
use crate::format::{MetaValue, Metadata};

#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Whether the correction range is rounded out to whole dimensions.
    pub truncate: bool,
    /// The scale of cos and sin.
    pub attention_factor: f32,
}

impl Yarn {
    pub fn from_metadata(md: &Metadata, a: &str) -> Result<Yarn, ModelError> {
        let f = |k: &str| md.get_f32(&arch_key(a, k));
        Ok(Yarn {
            factor: f(keys::ROPE_SCALING_FACTOR)?,
            original_context: md.get_u32(&arch_key(a, keys::ROPE_SCALING_ORIG_CTX))? as usize,
            beta_fast: f(keys::ROPE_YARN_BETA_FAST)?,
            beta_slow: f(keys::ROPE_YARN_BETA_SLOW)?,
            truncate: md.get_bool(&arch_key(a, keys::ROPE_YARN_TRUNCATE))?,
            attention_factor: f(keys::ROPE_ATTN_FACTOR)?,
        })
    }

    /// The keys `from_metadata` reads.
    pub fn write_metadata(&self, a: &str, m: &mut Metadata) {
        let k = |key: &str| arch_key(a, key);
        m.set(&k(keys::ROPE_SCALING_FACTOR), MetaValue::F32(self.factor));
        let ctx = u32::try_from(self.original_context).unwrap_or(u32::MAX);
        m.set(&k(keys::ROPE_SCALING_ORIG_CTX), MetaValue::U32(ctx));
        m.set(
            &k(keys::ROPE_YARN_BETA_FAST),
            MetaValue::F32(self.beta_fast),
        );
        m.set(
            &k(keys::ROPE_YARN_BETA_SLOW),
            MetaValue::F32(self.beta_slow),
        );
        m.set(&k(keys::ROPE_YARN_TRUNCATE), MetaValue::Bool(self.truncate));
        let af = MetaValue::F32(self.attention_factor);
        m.set(&k(keys::ROPE_ATTN_FACTOR), af);
    }

    /// gpt-oss's (its config.json): a factor of 32 over 4096 positions, betas 32 and 1, the
    /// range not truncated, the default attention factor.
    pub fn gpt_oss() -> Yarn {
        Yarn {
            factor: 32.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: false,
            attention_factor: Yarn::default_attention_factor(32.0),
        }
    }

    /// transformers' default attention factor for `factor`: 0.1 ln(factor) + 1 above 1.
    pub fn default_attention_factor(factor: f32) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            (0.1 * (factor as f64).ln() + 1.0) as f32
        }
    }

    /// Every value in a range that keeps the frequencies finite and positive.
    pub fn check(&self, a: &str) -> Result<(), ModelError> {
        let bad = |key: &str, value: String, problem: &str| {
            Err(ModelError::BadHyperParameter {
                key: arch_key(a, key),
                value,
                problem: problem.into(),
            })
        };
        for (key, v) in [
            (keys::ROPE_SCALING_FACTOR, self.factor),
            (keys::ROPE_YARN_BETA_FAST, self.beta_fast),
            (keys::ROPE_YARN_BETA_SLOW, self.beta_slow),
            (keys::ROPE_ATTN_FACTOR, self.attention_factor),
        ] {
            if !(v.is_finite() && (1e-3..=1e6).contains(&v)) {
                return bad(key, v.to_string(), "out of range (accepted: 0.001 to 1e6)");
            }
        }
        if self.original_context < 1 {
            return bad(
                keys::ROPE_SCALING_ORIG_CTX,
                "0".into(),
                "must be at least 1",
            );
        }
        Ok(())
    }

    /// The inverse frequencies of a head of `dim` values with RoPE base `base`, as transformers'
    /// `_compute_yarn_parameters` computes them (the powers and the ramp in f32, the correction
    /// range in f64).
    pub fn inv_freq(&self, base: f32, dim: usize) -> Vec<f32> {
        let correction = |rotations: f64| {
            let ctx = self.original_context as f64;
            (dim as f64 * (ctx / (rotations * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * (base as f64).ln())
        };
        let (mut low, mut high) = (
            correction(self.beta_fast as f64),
            correction(self.beta_slow as f64),
        );
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let span = (high - low) as f32;
        (0..dim / 2)
            .map(|i| {
                let pos = base.powf((2 * i) as f32 / dim as f32);
                let (extra, inter) = (1.0 / pos, 1.0 / (self.factor * pos));
                let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                inter * (1.0 - keep) + extra * keep
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_keeps_high_frequencies_and_divides_low_ones_by_the_factor() {
        let y = Yarn::gpt_oss();
        let (base, dim) = (150000.0f32, 64);
        let f = y.inv_freq(base, dim);
        let plain = |i: usize| 1.0 / base.powf((2 * i) as f32 / dim as f32);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], plain(0));
        assert!((f[31] - plain(31) / 32.0).abs() <= 1e-6 * plain(31));
        assert!(f.windows(2).all(|w| w[1] < w[0]));
        assert!((y.attention_factor - 1.346_573_6).abs() < 1e-6);
    }
}
