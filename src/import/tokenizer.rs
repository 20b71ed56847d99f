//! The tokenizer files of a checkpoint. tokenizer.json is required (its text goes into the .hob
//! file); tokenizer_config.json and chat_template.jinja are optional.

use std::path::Path;

use serde_json::Value;

use super::{read_json, read_text, ImportError};
use crate::format::{keys, MetaValue, Metadata};

#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerFiles {
    /// tokenizer.json, verbatim.
    pub json: String,
    pub chat_template: Option<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub add_bos: bool,
    /// generation_config.json's `eos_token_id` list: every token that ends an answer (Qwen's
    /// <|im_end|> and <|endoftext|>), EOS included.
    pub stop_ids: Vec<u32>,
}

impl TokenizerFiles {
    /// `config_ids` are config.json's (bos_token_id, eos_token_id), used when
    /// tokenizer_config.json names no such token.
    pub fn open(
        dir: &Path,
        config_ids: (Option<u32>, Option<u32>),
    ) -> Result<TokenizerFiles, ImportError> {
        let json_path = dir.join("tokenizer.json");
        let json = read_text(&json_path)?;
        // Loaded as `hob run` will load it from the .hob file, so a file that would fail there
        // never gets into one.
        let tokenizer =
            crate::generate::parse_hf_json(&json).map_err(|e| ImportError::Tokenizer {
                path: json_path.clone(),
                detail: e.to_string(),
            })?;

        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() {
            read_json(&config_path)?
        } else {
            Value::Object(Default::default())
        };
        let jinja_path = dir.join("chat_template.jinja");
        // transformers 5 saves the template beside the config and prefers that file when loading.
        let chat_template = if jinja_path.exists() {
            Some(read_text(&jinja_path)?)
        } else {
            chat_template(&config_path, config.get("chat_template"))?
        };

        let token_id = |field: &str, fallback: Option<u32>| -> Result<Option<u32>, ImportError> {
            let content = match config.get(field) {
                None | Some(Value::Null) => return Ok(fallback),
                Some(Value::String(s)) => s.as_str(),
                Some(v @ Value::Object(o)) => {
                    o.get("content").and_then(Value::as_str).ok_or_else(|| {
                        field_err(
                            &config_path,
                            field,
                            "a token string or {\"content\": ...}",
                            v,
                        )
                    })?
                }
                Some(v) => {
                    return Err(field_err(
                        &config_path,
                        field,
                        "a token string or {\"content\": ...}",
                        v,
                    ))
                }
            };
            tokenizer
                .token_to_id(content)
                .map(Some)
                .ok_or_else(|| ImportError::Tokenizer {
                    path: config_path.clone(),
                    detail: format!(
                    "field '{field}': token '{content}' is not in {}'s vocabulary or added tokens",
                    json_path.display()
                ),
                })
        };
        let bos_id = token_id("bos_token", config_ids.0)?;
        let eos_id = token_id("eos_token", config_ids.1)?;
        // Mixtral's Llama tokenizer prepends BOS unless the config says otherwise.
        let add_bos = match config.get("add_bos_token") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(field_err(&config_path, "add_bos_token", "true or false", v)),
        };
        let stop_ids = stop_ids(dir, tokenizer.get_vocab_size(true))?;
        Ok(TokenizerFiles {
            json,
            chat_template,
            bos_id,
            eos_id,
            add_bos,
            stop_ids,
        })
    }

    pub fn write_metadata(&self, m: &mut Metadata) {
        m.set(
            keys::TOKENIZER_HF_JSON,
            MetaValue::String(self.json.clone()),
        );
        if let Some(t) = &self.chat_template {
            m.set(keys::CHAT_TEMPLATE, MetaValue::String(t.clone()));
        }
        if let Some(id) = self.bos_id {
            m.set(keys::BOS_TOKEN_ID, MetaValue::U32(id));
        }
        if let Some(id) = self.eos_id {
            m.set(keys::EOS_TOKEN_ID, MetaValue::U32(id));
        }
        m.set(keys::ADD_BOS_TOKEN, MetaValue::Bool(self.add_bos));
        if !self.stop_ids.is_empty() {
            let items = self.stop_ids.iter().map(|&id| MetaValue::U32(id)).collect();
            // GGUF's uint32 element type.
            let list = MetaValue::Array {
                elem_type: 4,
                items,
            };
            m.set(keys::STOP_TOKEN_IDS, list);
        }
    }
}

/// generation_config.json's `eos_token_id` (an id or a list of ids), if the file is there; each
/// id must be in the vocabulary of `vocab` tokens.
fn stop_ids(dir: &Path, vocab: usize) -> Result<Vec<u32>, ImportError> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let config = read_json(&path)?;
    let field = "eos_token_id";
    let values = match config.get(field) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items.clone(),
        Some(v) => vec![v.clone()],
    };
    let expected = format!("a token id below {vocab} or a list of them");
    values
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| (n as usize) < vocab)
                .ok_or_else(|| field_err(&path, field, &expected, &config[field]))
        })
        .collect()
}

fn field_err(path: &Path, field: &str, expected: &str, found: &Value) -> ImportError {
    ImportError::Field {
        path: path.to_path_buf(),
        field: field.to_string(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

/// `chat_template`: a string, or a list of {name, template} from which "default" is taken.
fn chat_template(path: &Path, v: Option<&Value>) -> Result<Option<String>, ImportError> {
    const EXPECTED: &str =
        "a template string or a list of {\"name\", \"template\"} with a \"default\"";
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template").and_then(Value::as_str))
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| {
                field_err(
                    path,
                    "chat_template",
                    EXPECTED,
                    &Value::Array(items.clone()),
                )
            }),
        Some(other) => Err(field_err(path, "chat_template", EXPECTED, other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_template_forms() {
        let p = Path::new("tokenizer_config.json");
        assert_eq!(chat_template(p, None).unwrap(), None);
        assert_eq!(
            chat_template(p, Some(&json!("{{x}}"))).unwrap().as_deref(),
            Some("{{x}}")
        );
        let list =
            json!([{"name": "tool_use", "template": "a"}, {"name": "default", "template": "b"}]);
        assert_eq!(chat_template(p, Some(&list)).unwrap().as_deref(), Some("b"));
        let no_default = json!([{"name": "tool_use", "template": "a"}]);
        let e = chat_template(p, Some(&no_default)).unwrap_err().to_string();
        assert!(e.contains("chat_template") && e.contains("default"), "{e}");
        assert!(chat_template(p, Some(&json!(3))).is_err());
    }
}
