//! Typed access to config.json fields, with errors that name the field and the file.

use std::path::Path;

use serde_json::{Map, Value};

use super::ImportError;

/// A config's RoPE scaling (`Fields::rope_scaling`): the field it came from, its object, and
/// the config without it (its `rope_theta` moved to the top level) for the common fields.
pub(super) struct RopeScaling<'a> {
    pub field: &'static str,
    pub obj: &'a Map<String, Value>,
    pub common: Map<String, Value>,
}

/// Typed access to config.json fields with errors that name the field.
pub(super) struct Fields<'a> {
    pub path: &'a Path,
    pub obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub(super) fn err(&self, field: &str, expected: &str, found: Option<&Value>) -> ImportError {
        ImportError::Field {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            expected: expected.to_string(),
            found: found.map_or_else(|| "nothing (missing)".to_string(), |v| v.to_string()),
        }
    }

    /// A field whose value hob does not run: what was found and why.
    pub(super) fn unsupported(&self, field: &str, detail: &str) -> ImportError {
        let found = self
            .get(field)
            .map_or("nothing".to_string(), |v| v.to_string());
        ImportError::Unsupported {
            path: self.path.to_path_buf(),
            what: format!("'{field}'"),
            detail: format!("found {found}; {detail}"),
        }
    }

    /// The RoPE scaling of a family that needs one of `kind` ("longrope", "yarn"), from
    /// transformers 5's `rope_parameters` or the hub's `rope_scaling`. `family` names the model
    /// in the refusal of another kind.
    pub(super) fn rope_scaling(
        &self,
        kind: &str,
        family: &str,
    ) -> Result<RopeScaling<'_>, ImportError> {
        let (field, rope) = match (self.get("rope_parameters"), self.get("rope_scaling")) {
            (Some(v), _) => ("rope_parameters", v),
            (None, Some(v)) => ("rope_scaling", v),
            (None, None) => {
                let expected = format!("{kind} RoPE parameters");
                return Err(self.err("rope_scaling", &expected, None));
            }
        };
        let obj = rope
            .as_object()
            .ok_or_else(|| self.err(field, "an object", Some(rope)))?;
        let found = obj
            .get("rope_type")
            .or(obj.get("type"))
            .and_then(|v| v.as_str());
        if found != Some(kind) {
            return Err(ImportError::Unsupported {
                path: self.path.to_path_buf(),
                what: format!("'{field}'"),
                detail: format!("found {rope}; hob runs {family} with rope_type \"{kind}\""),
            });
        }
        let mut plain = self.obj.clone();
        plain.remove("rope_scaling");
        plain.remove("rope_parameters");
        if let Some(theta) = obj.get("rope_theta") {
            plain.insert("rope_theta".into(), theta.clone());
        }
        Ok(RopeScaling {
            field,
            obj,
            common: plain,
        })
    }

    /// The field, treating null as absent.
    pub(super) fn get(&self, field: &str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    pub(super) fn opt_usize(&self, field: &str) -> Result<Option<usize>, ImportError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.err(field, "a positive integer", Some(v))),
            },
        }
    }

    pub(super) fn usize(&self, field: &str) -> Result<usize, ImportError> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "a positive integer", None))
    }

    pub(super) fn opt_f64(&self, field: &str) -> Result<Option<f64>, ImportError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(self.err(field, "a positive number", Some(v))),
            },
        }
    }

    pub(super) fn f32(&self, field: &str) -> Result<f32, ImportError> {
        Ok(self
            .opt_f64(field)?
            .ok_or_else(|| self.err(field, "a positive number", None))? as f32)
    }

    pub(super) fn bool_or(&self, field: &str, default: bool) -> Result<bool, ImportError> {
        match self.get(field) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(field, "true or false", Some(v))),
        }
    }

    /// A token id, or the first of a list of ids (`eos_token_id` may be a list).
    pub(super) fn opt_token_id(&self, field: &str) -> Result<Option<u32>, ImportError> {
        let v = match self.get(field) {
            None => return Ok(None),
            Some(Value::Array(items)) if !items.is_empty() => &items[0],
            Some(v) => v,
        };
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| self.err(field, "a token id or a list of token ids", Some(v)))
    }
}
