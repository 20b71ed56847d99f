//! Constrained decoding: a JSON schema (or any JSON object) compiled by llguidance into a
//! token-level grammar; before each sample the tokens that cannot continue a valid answer are
//! masked out, and the end of sequence is allowed only once the answer is complete.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use super::GenerateError;

/// A model's vocabulary as byte strings, ready to compile grammars against (built once).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// From the tokenizer.json text, for logits of `vocab` entries (ids the tokenizer lacks never
    /// match) ending with `eos`.
    pub fn new(tokenizer_json: &str, vocab: usize, eos: u32) -> Result<Self, GenerateError> {
        let err = |e: String| GenerateError::Grammar { reason: e };
        let json: serde_json::Value =
            serde_json::from_str(tokenizer_json).map_err(|e| err(e.to_string()))?;
        let mut words =
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| err(e.to_string()))?;
        if words.len() > vocab {
            return Err(err(format!(
                "the tokenizer has {} tokens, the model's output {vocab}",
                words.len()
            )));
        }
        words.resize(vocab, Vec::new());
        let info = TokRxInfo::new(vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| err(e.to_string()))?;
        // Warnings and errors come back through the matcher, not on stderr.
        factory.set_stderr_log_level(0);
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// A constraint to answers valid under `schema` (a JSON schema object), whitespace bounded
    /// ([`bound_whitespace`]).
    pub fn json_schema(&self, mut schema: serde_json::Value) -> Result<Constraint, GenerateError> {
        if let Some(o) = schema.as_object_mut() {
            o.entry("x-guidance").or_insert(
                serde_json::json!({"whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,20}"}),
            );
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GenerateError::Grammar {
                reason: e.to_string(),
            })?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
        })
    }
}

impl Grammars {
    /// A constraint to the language of a Lark grammar (llguidance's dialect: `%json {schema}`
    /// embeds a JSON schema).
    pub fn lark(&self, grammar: &str) -> Result<Constraint, GenerateError> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(grammar.to_owned()))
            .map_err(|e| GenerateError::Grammar {
                reason: e.to_string(),
            })?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
        })
    }
}

/// At most 20 whitespace characters between JSON tokens (as llama.cpp's JSON grammar), unless
/// the schema sets llguidance's options itself (`x-guidance`).
pub fn bound_whitespace(schema: &mut serde_json::Value) {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert(serde_json::json!({
            "whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,20}"
        }));
    }
}

/// One answer's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Set the logits of the tokens that cannot come next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GenerateError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GenerateError::Grammar {
                reason: e.to_string(),
            })?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// The sampled token joins the answer.
    pub fn accept(&mut self, id: u32) -> Result<(), GenerateError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GenerateError::Grammar {
                reason: e.to_string(),
            })
    }
}
