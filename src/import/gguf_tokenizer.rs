//! The tokenizer of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`) rebuilt as the
//! Hugging Face tokenizer.json it came from, so that `hob convert --from model.gguf` writes the
//! same tokenizer keys as a conversion of the Hugging Face checkpoint ([`TokenizerFiles`]).
//!
//! Two vocabulary kinds (`tokenizer.ggml.model`):
//! - `gpt2`: byte-level BPE. `tokenizer.ggml.tokens` (byte-level strings, ids in order) and
//!   `tokenizer.ggml.merges` ("left right") are the model; `tokenizer.ggml.pre` names the
//!   pre-tokenizer's regex, rebuilt as the model's tokenizer.json has it: `gpt-2` and `olmo`
//!   (GPT-2's regex: the ByteLevel pre-tokenizer with its own regex), `smollm` (single digits,
//!   then GPT-2's) and `qwen2` (Qwen2's Split regex, ByteLevel without regex, NFC). Any other name is refused by name, an absent one too
//!   (llama.cpp falls back to its `default` regex, which is no Hugging Face tokenizer's).
//! - `llama`: SentencePiece BPE (Llama, Mistral, Mixtral). Tokens, `tokenizer.ggml.scores` and
//!   token types (byte tokens `<0xXX>`) become what Hugging Face's Llama conversion makes of the
//!   SentencePiece model: a BPE with byte fallback whose merges are every split of a token into
//!   two tokens, ordered by the merged token's score (transformers' SentencePieceExtractor), a
//!   normalizer that prepends "▁" (unless `tokenizer.ggml.add_space_prefix` is false) and turns
//!   spaces into "▁", and the matching decoder.
//!
//! Control and unknown tokens (`tokenizer.ggml.token_type` 3 and 2) become special added tokens,
//! user-defined ones (4) plain added tokens. BOS/EOS (`tokenizer.ggml.{add_bos,add_eos}_token`,
//! defaulting as llama.cpp does: BOS for `llama`, none for `gpt2`) become a TemplateProcessing
//! post-processor. The stop ids are EOS, EOT and EOM and the control tokens llama.cpp treats as
//! end of generation by their text (`<|im_end|>`, `<|endoftext|>`, ...).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::{json, Map, Value};

use super::{ImportError, TokenizerFiles};
use crate::format::{keys, MetaValue, Metadata};

pub const MODEL: &str = "tokenizer.ggml.model";
pub const PRE: &str = "tokenizer.ggml.pre";
pub const TOKENS: &str = "tokenizer.ggml.tokens";
pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const SCORES: &str = "tokenizer.ggml.scores";
pub const MERGES: &str = "tokenizer.ggml.merges";
const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// The `tokenizer.ggml.model` values read.
pub const SUPPORTED_MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece BPE)";
/// The `tokenizer.ggml.pre` values read for `gpt2`.
pub const SUPPORTED_PRE: &str = "gpt-2, olmo, qwen2, smollm";

/// llama.cpp's token types (`llama_token_type`).
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;

/// Control tokens llama.cpp ends generation at by their text (a subset of llama-vocab.cpp's).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// GPT-2's ByteLevel pre-tokenizer with its regex (`gpt-2`, `olmo`).
fn gpt2_pre() -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
}

/// SmolLM's pre-tokenizer (`smollm`): single digits split off, then GPT-2's, as SmolLM2's
/// tokenizer.json has it.
fn smollm_pre() -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        gpt2_pre()
    ]})
}

/// Qwen2's pre-tokenizer, as Qwen2/Qwen3's tokenizer.json has it.
fn qwen2_pre() -> Value {
    let regex = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
    ]})
}

/// Typed reads of the tokenizer keys; errors name the file and the key.
struct Reader<'a> {
    path: &'a Path,
    meta: &'a Metadata,
}

impl Reader<'_> {
    fn err(&self, key: &str, expected: &str, found: &str) -> ImportError {
        ImportError::Field {
            path: self.path.to_path_buf(),
            field: key.to_string(),
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&[MetaValue]>, ImportError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Array { items, .. }) => Ok(Some(items)),
            Some(v) => Err(self.err(key, "an array", v.type_name())),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>, ImportError> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        let strings = items.iter().enumerate().map(|(i, v)| match v {
            MetaValue::String(s) => Ok(s.as_str()),
            v => Err(self.err(
                key,
                "an array of strings",
                &format!("{} at {i}", v.type_name()),
            )),
        });
        strings.collect::<Result<_, _>>().map(Some)
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>, ImportError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, "a string", v.type_name())),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ImportError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, "a bool", v.type_name())),
        }
    }

    /// An optional token id, which must be below `n_tokens`.
    fn opt_id(&self, key: &str, n_tokens: usize) -> Result<Option<u32>, ImportError> {
        let Some(v) = self.meta.get(key) else {
            return Ok(None);
        };
        integer(v)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| (n as usize) < n_tokens)
            .map(Some)
            .ok_or_else(|| {
                let expected = format!("a token id below {n_tokens}");
                self.err(key, &expected, &format!("{v:?}"))
            })
    }

    /// `tokenizer.ggml.token_type`, one per token (all normal where the key is absent).
    fn token_types(&self, n_tokens: usize) -> Result<Vec<i64>, ImportError> {
        let Some(items) = self.array(TOKEN_TYPE)? else {
            return Ok(vec![1; n_tokens]);
        };
        if items.len() != n_tokens {
            let expected = format!("{n_tokens} entries (one per token)");
            return Err(self.err(TOKEN_TYPE, &expected, &items.len().to_string()));
        }
        let types = items.iter().enumerate().map(|(i, v)| {
            integer(v).ok_or_else(|| {
                let found = format!("{} at {i}", v.type_name());
                self.err(TOKEN_TYPE, "an array of integers", &found)
            })
        });
        types.collect()
    }

    /// `tokenizer.ggml.scores`, one finite score per token.
    fn scores(&self, n_tokens: usize) -> Result<Vec<f64>, ImportError> {
        let items = self
            .array(SCORES)?
            .ok_or_else(|| self.err(SCORES, "an array of scores (llama vocabularies)", "none"))?;
        if items.len() != n_tokens {
            let expected = format!("{n_tokens} entries (one per token)");
            return Err(self.err(SCORES, &expected, &items.len().to_string()));
        }
        let scores = items.iter().enumerate().map(|(i, v)| match v {
            MetaValue::F32(x) if x.is_finite() => Ok(f64::from(*x)),
            MetaValue::F64(x) if x.is_finite() => Ok(*x),
            v => Err(self.err(SCORES, "finite floats", &format!("{v:?} at {i}"))),
        });
        scores.collect()
    }
}

fn integer(v: &MetaValue) -> Option<i64> {
    match *v {
        MetaValue::U8(n) => Some(n.into()),
        MetaValue::I8(n) => Some(n.into()),
        MetaValue::U16(n) => Some(n.into()),
        MetaValue::I16(n) => Some(n.into()),
        MetaValue::U32(n) => Some(n.into()),
        MetaValue::I32(n) => Some(n.into()),
        MetaValue::U64(n) => i64::try_from(n).ok(),
        MetaValue::I64(n) => Some(n),
        _ => None,
    }
}

/// The tokenizer of the GGUF file at `path` whose metadata is `meta`; None where the file has
/// none (`tokenizer.ggml.model` absent or "none"). `max_tokens`: the model's vocabulary size
/// (its token embedding's rows), which the tokenizer must not exceed.
pub fn tokenizer_from_gguf(
    path: &Path,
    meta: &Metadata,
    max_tokens: Option<usize>,
) -> Result<Option<TokenizerFiles>, ImportError> {
    let r = Reader { path, meta };
    let model = match r.opt_str(MODEL)? {
        None | Some("none") => return Ok(None),
        Some(m @ ("gpt2" | "llama")) => m,
        Some(other) => {
            return Err(ImportError::Unsupported {
                path: path.to_path_buf(),
                what: format!("'{MODEL}' = '{other}'"),
                detail: format!("hob reads {SUPPORTED_MODELS}"),
            })
        }
    };
    let tokens = r
        .strings(TOKENS)?
        .ok_or_else(|| r.err(TOKENS, "the vocabulary (an array of strings)", "none"))?;
    let n = tokens.len();
    if let Some(max) = max_tokens.filter(|&max| n > max) {
        let expected = format!("at most {max} tokens (token_embd.weight's rows)");
        return Err(r.err(TOKENS, &expected, &n.to_string()));
    }
    let types = r.token_types(n)?;
    let bos_id = r.opt_id(keys::BOS_TOKEN_ID, n)?;
    let eos_id = r.opt_id(keys::EOS_TOKEN_ID, n)?;
    let add_bos = r.opt_bool(keys::ADD_BOS_TOKEN)?.unwrap_or(model == "llama");
    let add_eos = r.opt_bool(ADD_EOS)?.unwrap_or(false);

    let mut root = Map::new();
    root.insert("version".into(), json!("1.0"));
    root.insert("truncation".into(), Value::Null);
    root.insert("padding".into(), Value::Null);
    root.insert("added_tokens".into(), added_tokens(&tokens, &types));
    let (normalizer, pre_tokenizer, decoder, bpe) = match model {
        "gpt2" => gpt2_parts(&r, &tokens, &types)?,
        _ => llama_parts(&r, &tokens, &types)?,
    };
    root.insert("normalizer".into(), normalizer);
    root.insert("pre_tokenizer".into(), pre_tokenizer);
    let bos = if add_bos { bos_id } else { None };
    let eos = if add_eos { eos_id } else { None };
    root.insert("post_processor".into(), post_processor(&tokens, bos, eos));
    root.insert("decoder".into(), decoder);
    root.insert("model".into(), bpe);
    let json = Value::Object(root).to_string();
    // Loaded as `hob run` will load it, so that a tokenizer that would fail there is refused here.
    crate::generate::parse_hf_json(&json).map_err(|e| ImportError::Tokenizer {
        path: path.to_path_buf(),
        detail: format!("the tokenizer rebuilt from '{TOKENS}' does not load: {e}"),
    })?;

    let mut stop_ids: Vec<u32> = Vec::new();
    let eot = r.opt_id(EOT_ID, n)?;
    let eom = r.opt_id(EOM_ID, n)?;
    let by_text = (0..n)
        .filter(|&i| types[i] == CONTROL && EOG_TEXTS.contains(&tokens[i]))
        .filter_map(|i| u32::try_from(i).ok());
    for id in [eos_id, eot, eom].into_iter().flatten().chain(by_text) {
        if !stop_ids.contains(&id) {
            stop_ids.push(id);
        }
    }
    Ok(Some(TokenizerFiles {
        json,
        chat_template: r.opt_str(keys::CHAT_TEMPLATE)?.map(str::to_string),
        bos_id,
        eos_id,
        add_bos,
        stop_ids,
    }))
}

/// Control and unknown tokens as special added tokens, user-defined ones as plain ones.
fn added_tokens(tokens: &[&str], types: &[i64]) -> Value {
    let added = (0..tokens.len()).filter_map(|i| {
        let special = match types[i] {
            CONTROL | UNKNOWN => true,
            USER_DEFINED => false,
            _ => return None,
        };
        Some(json!({
            "id": i, "content": tokens[i], "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special
        }))
    });
    Value::Array(added.collect())
}

/// token -> id for the model's vocabulary. A token written twice is refused unless the later
/// one is an unused (padding) entry, which is left out.
fn vocab_map(
    r: &Reader,
    tokens: &[&str],
    types: &[i64],
) -> Result<Map<String, Value>, ImportError> {
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        if vocab.contains_key(*t) {
            if types[i] == UNUSED {
                continue;
            }
            let found = format!("'{t}' again at {i}");
            return Err(r.err(TOKENS, "distinct tokens", &found));
        }
        vocab.insert(t.to_string(), json!(i));
    }
    Ok(vocab)
}

fn bpe_model(
    vocab: Map<String, Value>,
    merges: Vec<Value>,
    unk: Option<&str>,
    byte_fallback: bool,
) -> Value {
    json!({
        "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": byte_fallback, "byte_fallback": byte_fallback,
        "ignore_merges": false, "vocab": vocab, "merges": merges
    })
}

type Parts = (Value, Value, Value, Value);

/// normalizer, pre-tokenizer, decoder and model of a `gpt2` vocabulary.
fn gpt2_parts(r: &Reader, tokens: &[&str], types: &[i64]) -> Result<Parts, ImportError> {
    let (normalizer, pre) = match r.opt_str(PRE)? {
        Some("gpt-2" | "olmo") => (Value::Null, gpt2_pre()),
        Some("qwen2") => (json!({"type": "NFC"}), qwen2_pre()),
        Some("smollm") => (Value::Null, smollm_pre()),
        found => {
            let detail = match found {
                Some(name) => format!("pre-tokenizer '{name}' (hob reads {SUPPORTED_PRE})"),
                None => format!(
                    "no '{PRE}': llama.cpp would fall back to its 'default' regex, which is no \
                     Hugging Face tokenizer's (hob reads {SUPPORTED_PRE})"
                ),
            };
            return Err(ImportError::Unsupported {
                path: r.path.to_path_buf(),
                what: format!("'{PRE}'"),
                detail: format!("{detail}; convert the Hugging Face checkpoint instead"),
            });
        }
    };
    let merges = r
        .strings(MERGES)?
        .ok_or_else(|| r.err(MERGES, "the BPE merges (an array of strings)", "none"))?;
    let merges = merges.iter().enumerate().map(|(i, m)| {
        let parts: Vec<&str> = m.split(' ').collect();
        match parts.as_slice() {
            [a, b] if !a.is_empty() && !b.is_empty() => Ok(json!([a, b])),
            _ => Err(r.err(MERGES, "\"left right\" pairs", &format!("'{m}' at {i}"))),
        }
    });
    let merges = merges.collect::<Result<Vec<_>, _>>()?;
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    let vocab = vocab_map(r, tokens, types)?;
    Ok((
        normalizer,
        pre,
        decoder,
        bpe_model(vocab, merges, None, false),
    ))
}

/// normalizer, pre-tokenizer, decoder and model of a `llama` (SentencePiece) vocabulary.
fn llama_parts(r: &Reader, tokens: &[&str], types: &[i64]) -> Result<Parts, ImportError> {
    let scores = r.scores(tokens.len())?;
    let space_prefix = r.opt_bool(ADD_SPACE_PREFIX)?.unwrap_or(true);
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let decoder = json!({"type": "Sequence", "decoders": decoders});
    let unk = match r.opt_id(UNK_ID, tokens.len())? {
        Some(id) => Some(tokens[id as usize]),
        None => (0..tokens.len())
            .find(|&i| types[i] == UNKNOWN)
            .map(|i| tokens[i]),
    };
    let vocab = vocab_map(r, tokens, types)?;
    let merges = sentencepiece_merges(tokens, &scores)
        .into_iter()
        .map(|(a, b)| json!([a, b]))
        .collect();
    let model = bpe_model(vocab, merges, unk, true);
    Ok((normalizer, Value::Null, decoder, model))
}

/// transformers' SentencePieceExtractor: for each token in id order, every split into two
/// tokens of the vocabulary (ordered by the ids of the left, then the right part), all sorted,
/// stably, by the merged token's score, highest first. Scores are compared exactly as stored.
pub fn sentencepiece_merges<'a>(tokens: &[&'a str], scores: &[f64]) -> Vec<(&'a str, &'a str)> {
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.entry(*t).or_insert(i);
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, piece) in tokens.iter().enumerate() {
        // A piece written twice splits once, as in the Python dict it is keyed by.
        if !seen.insert(piece) {
            continue;
        }
        let mut local: Vec<(&str, &str, f64)> = piece
            .char_indices()
            .skip(1)
            .map(|(at, _)| piece.split_at(at))
            .filter(|(l, r)| ids.contains_key(l) && ids.contains_key(r))
            .map(|(l, r)| (l, r, scores[i]))
            .collect();
        local.sort_by_key(|(l, r, _)| (ids[l], ids[r]));
        merges.extend(local);
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges.into_iter().map(|(l, r, _)| (l, r)).collect()
}

/// BOS before (and EOS after) each sequence, where the file asks for them.
fn post_processor(tokens: &[&str], bos: Option<u32>, eos: Option<u32>) -> Value {
    if bos.is_none() && eos.is_none() {
        return Value::Null;
    }
    let special = |id: u32, type_id: u32| json!({"SpecialToken": {"id": tokens[id as usize], "type_id": type_id}});
    let seq = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    for (name, type_id) in [("A", 0), ("B", 1)] {
        let target = if name == "A" { &mut single } else { &mut pair };
        if let Some(id) = bos {
            target.push(special(id, type_id));
        }
        target.push(seq(name, type_id));
        if let Some(id) = eos {
            target.push(special(id, type_id));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for id in [bos, eos].into_iter().flatten() {
        let t = tokens[id as usize];
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}
