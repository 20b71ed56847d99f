//! The GGUF source's typed key reads and the hyper-parameters every family shares (the
//! `{arch}.*` keys and the tensors' dims), for [`super::gguf_checkpoint`] and
//! [`super::gguf_families`].

use std::path::Path;

use super::gguf::GgufFile;
use super::{ImportError, MixtralSpec};
use crate::format::{keys, MetaValue, Metadata};

/// llama.cpp's default when `{arch}.rope.freq_base` is absent.
const DEFAULT_ROPE_FREQ_BASE: f32 = 10_000.0;

/// Typed reads of the file's metadata; errors name the file and the key.
pub(super) struct Keys<'a> {
    pub(super) path: &'a Path,
    pub(super) meta: &'a Metadata,
    pub(super) arch: &'a str,
}

impl Keys<'_> {
    pub(super) fn full(&self, key: &str) -> String {
        keys::arch_key(self.arch, key)
    }

    pub(super) fn err(&self, key: &str, expected: &str) -> ImportError {
        ImportError::Field {
            path: self.path.to_path_buf(),
            field: key.to_string(),
            expected: expected.to_string(),
            found: match self.meta.get(key) {
                Some(v) => format!("{v:?}"),
                None => "nothing (the key is missing)".into(),
            },
        }
    }

    /// An optional unsigned integer at the full key `key`.
    pub(super) fn opt_usize_at(&self, key: &str) -> Result<Option<usize>, ImportError> {
        if self.meta.get(key).is_none() {
            return Ok(None);
        }
        let v = self
            .meta
            .get_u32(key)
            .map_err(|_| self.err(key, "an unsigned integer below 2^32"))?;
        Ok(Some(v as usize))
    }

    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ImportError> {
        self.opt_usize_at(&self.full(key))
    }

    /// A required positive integer `{arch}.key`.
    pub(super) fn usize(&self, key: &str) -> Result<usize, ImportError> {
        let full = self.full(key);
        match self.opt_usize_at(&full)? {
            Some(v) if v > 0 => Ok(v),
            _ => Err(self.err(&full, "a positive integer")),
        }
    }

    pub(super) fn opt_f32(&self, key: &str) -> Result<Option<f32>, ImportError> {
        let full = self.full(key);
        if self.meta.get(&full).is_none() {
            return Ok(None);
        }
        match self.meta.get_f32(&full) {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
            _ => Err(self.err(&full, "a positive float")),
        }
    }

    pub(super) fn f32(&self, key: &str) -> Result<f32, ImportError> {
        self.opt_f32(key)?
            .ok_or_else(|| self.err(&self.full(key), "a positive float"))
    }

    /// Refuse the model unless the optional bool `{arch}.key` is absent or `want`.
    pub(super) fn require_bool(
        &self,
        key: &str,
        want: bool,
        detail: &str,
    ) -> Result<(), ImportError> {
        let full = self.full(key);
        match self.meta.get(&full) {
            None => Ok(()),
            Some(MetaValue::Bool(b)) if *b == want => Ok(()),
            Some(MetaValue::Bool(_)) => Err(unsupported(self.path, &full, detail)),
            Some(_) => Err(self.err(&full, "a bool")),
        }
    }
}

pub(super) fn unsupported(path: &Path, what: &str, detail: &str) -> ImportError {
    ImportError::Unsupported {
        path: path.to_path_buf(),
        what: format!("'{what}'"),
        detail: detail.to_string(),
    }
}

pub(super) fn missing(path: &Path, name: &str) -> ImportError {
    ImportError::MissingTensor {
        name: name.to_string(),
        searched: path.display().to_string(),
    }
}

/// The hyper-parameters from the `{arch}.*` keys and the tensors' dims.
/// With `own_rope`, the family reads its RoPE keys itself (scaling, rotated dimensions).
pub(super) fn parse_spec(
    k: &Keys,
    file: &GgufFile,
    own_rope: bool,
) -> Result<MixtralSpec, ImportError> {
    if let Some(v) = file
        .metadata()
        .get(&k.full("rope.scaling.type"))
        .filter(|_| !own_rope)
    {
        if !matches!(v, MetaValue::String(s) if s == "none") {
            let detail = format!("found {v:?}; hob implements plain RoPE only");
            return Err(unsupported(k.path, &k.full("rope.scaling.type"), &detail));
        }
    }
    let hidden = k.usize(keys::EMBEDDING_LENGTH)?;
    let n_heads = k.usize(keys::HEAD_COUNT)?;
    let n_kv_heads = k.opt_usize(keys::HEAD_COUNT_KV)?.unwrap_or(n_heads);
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        let expected = format!("a divisor of the head count ({n_heads})");
        return Err(k.err(&k.full(keys::HEAD_COUNT_KV), &expected));
    }
    let head_dim = match k.opt_usize(keys::KEY_LENGTH)? {
        Some(d) if d > 0 => d,
        None if hidden % n_heads == 0 => hidden / n_heads,
        _ => {
            let expected = format!("a head size (the width {hidden} is not {n_heads} heads)");
            return Err(k.err(&k.full(keys::KEY_LENGTH), &expected));
        }
    };
    if let Some(d) = k.opt_usize("rope.dimension_count")?.filter(|_| !own_rope) {
        if d != head_dim {
            let detail = format!("{d} of {head_dim}: hob rotates whole heads");
            return Err(unsupported(
                k.path,
                &k.full("rope.dimension_count"),
                &detail,
            ));
        }
    }
    let ffn = match k.opt_usize("expert_feed_forward_length")? {
        Some(f) => f,
        None => k.usize(keys::FEED_FORWARD_LENGTH)?,
    };
    let n_experts = k.usize(keys::EXPERT_COUNT)?;
    let n_experts_used = k.usize(keys::EXPERT_USED_COUNT)?;
    if n_experts_used > n_experts {
        let expected = format!("at most the expert count ({n_experts})");
        return Err(k.err(&k.full(keys::EXPERT_USED_COUNT), &expected));
    }
    let embd = file
        .tensor(keys::TOKEN_EMBD)
        .ok_or_else(|| missing(k.path, keys::TOKEN_EMBD))?;
    let vocab = match embd.dims() {
        [_, v] => usize::try_from(*v).unwrap_or(usize::MAX),
        dims => {
            return Err(ImportError::ShapeMismatch {
                name: keys::TOKEN_EMBD.into(),
                file: embd.path().display().to_string(),
                expected: vec![hidden, 0],
                found: dims.iter().map(|&d| d as usize).collect(),
            })
        }
    };
    // Every layer has tensors of its own: a count past the file's tensors is a damaged header,
    // refused before anything is sized by it.
    let n_layers = k.usize(keys::BLOCK_COUNT)?;
    if n_layers > file.tensors().len() {
        let expected = format!(
            "1 to {} layers (the file's tensor count)",
            file.tensors().len()
        );
        return Err(k.err(&k.full(keys::BLOCK_COUNT), &expected));
    }
    let token_id = |key: &str| -> Result<Option<u32>, ImportError> {
        Ok(k.opt_usize_at(key)?.map(|v| v as u32))
    };
    Ok(MixtralSpec {
        hidden,
        ffn,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        rope_theta: k
            .opt_f32(keys::ROPE_FREQ_BASE)?
            .unwrap_or(DEFAULT_ROPE_FREQ_BASE),
        rms_eps: k.f32(keys::RMS_EPS)?,
        vocab,
        context_length: k.usize(keys::CONTEXT_LENGTH)?,
        n_experts,
        n_experts_used,
        tie_word_embeddings: file.tensor(keys::OUTPUT).is_none(),
        sliding_window: None,
        bos_token_id: token_id(keys::BOS_TOKEN_ID)?,
        eos_token_id: token_id(keys::EOS_TOKEN_ID)?,
    })
}
