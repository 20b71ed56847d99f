//! The model's Hugging Face tokenizer.json, with the BOS/EOS facts that come from the model's
//! metadata rather than from the file.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::str::FromStr;
use std::sync::Once;

use super::GenerateError;

/// SentencePiece's word-boundary marker, which the Llama/Mistral tokenizers use for spaces.
const SPIECE_SPACE: &str = "\u{2581}";

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Only for "legacy" SentencePiece files (see [`legacy_without_prepend`]): the same tokenizer
    /// without the dummy-prefix space, used for text that follows a special token or earlier text.
    continuation: Option<tokenizers::Tokenizer>,
    /// Added tokens (content, id), longest first so that the longest one wins where two match.
    added: Vec<(String, u32)>,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    vocab_size: usize,
}

impl Tokenizer {
    /// Load a tokenizer.json. `bos_id` (None: the model has none, as Qwen's), `eos_id` and
    /// `add_bos` (whether a raw prompt starts with BOS) come from the model's metadata.
    pub fn from_json(
        json: &str,
        bos_id: impl Into<Option<u32>>,
        eos_id: u32,
        add_bos: bool,
    ) -> Result<Self, GenerateError> {
        let bos_id = bos_id.into();
        let (inner, continuation) = load(json)?;
        let vocab_size = inner.get_vocab_size(true);
        let ids = [("bos_id", bos_id), ("eos_id", Some(eos_id))];
        for (field, id) in ids.into_iter().filter_map(|(f, id)| Some((f, id?))) {
            if id as usize >= vocab_size {
                return Err(GenerateError::SpecialIdOutOfRange {
                    field,
                    id,
                    vocab_size,
                });
            }
        }
        let mut added: Vec<(String, u32)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (token.content, id))
            .filter(|(content, _)| !content.is_empty())
            .collect();
        added.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Tokenizer {
            inner,
            continuation,
            added,
            bos_id,
            eos_ids: vec![eos_id],
            add_bos: add_bos && bos_id.is_some(),
            vocab_size,
        })
    }

    /// Encode text that starts a sequence: with `add_special` and a model that wants one, BOS is
    /// prepended. Special tokens written in the text (`</s>`, `<|im_end|>`) become their ids, as in
    /// Hugging Face; chat templates rely on it.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, GenerateError> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (add_special && self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        match &self.continuation {
            None => ids.extend(self.encode_plain(&self.inner, text)?),
            Some(continuation) => self.encode_legacy(text, true, continuation, &mut ids)?,
        }
        Ok(ids)
    }

    /// Encode text that continues a sequence already in the KV cache (the new part of a chat
    /// turn): never a BOS and, for SentencePiece, no dummy-prefix space at its start, so that
    /// `encode(a + b) == encode(a) + encode_continuation(b)` where `b` starts at a token boundary.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>, GenerateError> {
        let mut ids = Vec::new();
        match &self.continuation {
            None => ids.extend(self.encode_plain(&self.inner, text)?),
            Some(continuation) => self.encode_legacy(text, false, continuation, &mut ids)?,
        }
        Ok(ids)
    }

    fn encode_plain(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
    ) -> Result<Vec<u32>, GenerateError> {
        let encoding = tokenizer
            .encode(text, false)
            .map_err(|e| GenerateError::Encode {
                reason: e.to_string(),
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The legacy SentencePiece files prepend "▁" to every stretch of text between added tokens,
    /// so `<s> [INST]` would become `<s>`, `▁▁[INST]` (an extra "▁" token, 28705 for Mistral).
    /// SentencePiece itself, mistral-common and Hugging Face's current (non-legacy) Llama/Mistral
    /// tokenizers (Metaspace with prepend_scheme "first") add that space only at the very start of
    /// the text. Splitting at added tokens here and encoding the later stretches without the
    /// prepend gives that behaviour with the file as shipped.
    fn encode_legacy(
        &self,
        text: &str,
        at_start: bool,
        continuation: &tokenizers::Tokenizer,
        ids: &mut Vec<u32>,
    ) -> Result<(), GenerateError> {
        let mut segment_start = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let Some((content, id)) = self
                .added
                .iter()
                .find(|(c, _)| rest.starts_with(c.as_str()))
            else {
                pos += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let opens = at_start && segment_start == 0;
            self.encode_segment(&text[segment_start..pos], opens, continuation, ids)?;
            ids.push(*id);
            pos += content.len();
            segment_start = pos;
        }
        let opens = at_start && segment_start == 0;
        self.encode_segment(&text[segment_start..], opens, continuation, ids)
    }

    /// `opens`: the segment starts the text, so it takes SentencePiece's dummy-prefix space.
    fn encode_segment(
        &self,
        segment: &str,
        opens: bool,
        continuation: &tokenizers::Tokenizer,
        ids: &mut Vec<u32>,
    ) -> Result<(), GenerateError> {
        if segment.is_empty() {
            return Ok(());
        }
        let tokenizer = if opens { &self.inner } else { continuation };
        ids.extend(self.encode_plain(tokenizer, segment)?);
        Ok(())
    }

    /// Decode ids to text; `skip_special` drops BOS/EOS and other special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, GenerateError> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(GenerateError::Decode {
                reason: format!(
                    "id {bad} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| GenerateError::Decode {
                reason: e.to_string(),
            })
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether a raw prompt gets BOS (from the model's metadata).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The id of a token given by its text, e.g. "<|im_end|>" or "</s>".
    pub fn token_to_id(&self, token: &str) -> Result<u32, GenerateError> {
        self.inner
            .token_to_id(token)
            .ok_or_else(|| GenerateError::UnknownToken {
                token: token.to_owned(),
            })
    }

    /// The text of one token as stored in the vocabulary ("▁Paris", "<0xE2>").
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Also stop generation at `token` (chat models often end turns with a token other than EOS).
    pub fn add_stop_token(&mut self, token: &str) -> Result<u32, GenerateError> {
        let id = self.token_to_id(token)?;
        if !self.eos_ids.contains(&id) {
            self.eos_ids.push(id);
        }
        Ok(id)
    }

    /// Also stop generation at token `id` (from the model's list of stop tokens); an id outside
    /// the vocabulary is an error.
    pub fn add_stop_id(&mut self, id: u32) -> Result<(), GenerateError> {
        if id as usize >= self.vocab_size {
            return Err(GenerateError::SpecialIdOutOfRange {
                field: "stop token",
                id,
                vocab_size: self.vocab_size,
            });
        }
        if !self.eos_ids.contains(&id) {
            self.eos_ids.push(id);
        }
        Ok(())
    }

    /// Whether `id` ends generation: EOS or a token added by [`Tokenizer::add_stop_token`].
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }
}

/// Check a tokenizer.json the way [`Tokenizer::from_json`] loads it (both forms of a legacy
/// SentencePiece file), and return the Hugging Face tokenizer: for `hob convert`, which must not
/// embed a file that would not load.
pub fn parse_hf_json(json: &str) -> Result<tokenizers::Tokenizer, GenerateError> {
    Ok(load(json)?.0)
}

/// The tokenizer, and for a legacy SentencePiece file its variant without the dummy prefix.
fn load(
    json: &str,
) -> Result<(tokenizers::Tokenizer, Option<tokenizers::Tokenizer>), GenerateError> {
    // JSON first: the tokenizers crate panics on some syntax errors (inside "decoder", for one),
    // and serde_json names the line and column.
    let root: serde_json::Value =
        serde_json::from_str(json).map_err(|e| GenerateError::TokenizerLoad {
            reason: format!("invalid JSON: {e}"),
        })?;
    if !root.is_object() {
        return Err(GenerateError::TokenizerLoad {
            reason: "the JSON is not an object".into(),
        });
    }
    let inner = from_str_caught(json)?;
    let continuation = match legacy_without_prepend(root) {
        Some(rewritten) => Some(from_str_caught(&rewritten)?),
        None => None,
    };
    Ok((inner, continuation))
}

/// `tokenizers::Tokenizer::from_str`, with a panic inside the crate turned into an error.
fn from_str_caught(json: &str) -> Result<tokenizers::Tokenizer, GenerateError> {
    match catch_panic_quietly(|| tokenizers::Tokenizer::from_str(json)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(GenerateError::TokenizerLoad {
            reason: e.to_string(),
        }),
        Err(panic) => Err(GenerateError::TokenizerLoad {
            reason: format!("the tokenizers library failed on it ({panic})"),
        }),
    }
}

thread_local! {
    /// Set while this thread runs [`catch_panic_quietly`]: the panic hook stays silent.
    static QUIET_PANICS: Cell<bool> = const { Cell::new(false) };
}

/// Run `f`; a panic in it becomes `Err(its message)` and prints nothing. Panics elsewhere (other
/// threads, or this one outside `f`) are reported by the hook that was installed before.
fn catch_panic_quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET_PANICS.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was_quiet = QUIET_PANICS.with(|q| q.replace(true));
    // Nothing of `f`'s is used after a panic: its result is dropped unseen.
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET_PANICS.with(|q| q.set(was_quiet));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// For a legacy Llama/Mistral tokenizer.json (normalizer `Sequence[Prepend("▁"), Replace(" ",
/// "▁")]`), the same file with the Prepend removed; `None` for any other tokenizer.
fn legacy_without_prepend(mut root: serde_json::Value) -> Option<String> {
    let normalizer = root.get_mut("normalizer")?;
    if normalizer.get("type").and_then(|t| t.as_str()) != Some("Sequence") {
        return None;
    }
    let steps = normalizer
        .get_mut("normalizers")
        .and_then(|n| n.as_array_mut())?;
    let is_prepend_space = |step: &serde_json::Value| {
        step.get("type").and_then(|t| t.as_str()) == Some("Prepend")
            && step.get("prepend").and_then(|p| p.as_str()) == Some(SPIECE_SPACE)
    };
    let before = steps.len();
    steps.retain(|step| !is_prepend_space(step));
    if steps.len() == before {
        return None;
    }
    Some(root.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_and_the_hook_is_kept_for_others() {
        let caught = catch_panic_quietly(|| -> u32 { panic!("boom {}", 7) });
        assert_eq!(caught, Err("boom 7".to_string()));
        assert_eq!(catch_panic_quietly(|| 5), Ok(5));
        assert!(!QUIET_PANICS.with(Cell::get));
    }
}
