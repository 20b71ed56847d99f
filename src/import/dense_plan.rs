//! `hob convert --dense`: the storage of each dense matrix, by class (embedding, attention,
//! output head, shared experts). Norms, biases and routers stay f32 whatever is asked.

use super::arch::{DenseTensor, TensorRole};
use crate::format::{DType, DenseSpec, TensorType};

/// A class of dense matrices, from the tensor's GGUF-style name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseClass {
    /// `token_embd.weight` (also the output head when the model ties them).
    Embed,
    /// `blk.N.attn_*`: q, k, v and output projections.
    Attn,
    /// `output.weight`.
    Output,
    /// `blk.N.*_shexp`: a shared expert's matrices.
    Shared,
}

impl DenseClass {
    const ALL: [(DenseClass, &'static str); 4] = [
        (DenseClass::Embed, "embed"),
        (DenseClass::Attn, "attn"),
        (DenseClass::Output, "output"),
        (DenseClass::Shared, "shared"),
    ];

    /// The class of a dense matrix named `name`; None for anything else.
    pub fn of(name: &str) -> Option<DenseClass> {
        match name {
            "token_embd.weight" => Some(DenseClass::Embed),
            "output.weight" => Some(DenseClass::Output),
            _ if name.starts_with("blk.") && name.contains("_shexp") => Some(DenseClass::Shared),
            _ if name.starts_with("blk.") && name.contains(".attn_") => Some(DenseClass::Attn),
            _ => None,
        }
    }
}

/// What `--dense` asks for: a type for every matrix, types per class, or both
/// (`int8`, `attn=int8,output=int4`, `f16,output=int8`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DensePlan {
    /// Matrices of no listed class; None: the checkpoint's own dtype.
    default: Option<TensorType>,
    classes: Vec<(DenseClass, TensorType)>,
    /// Single matrices by hob name, before their class (a GGUF's 4-bit ones by default).
    tensors: Vec<(String, TensorType)>,
}

impl DensePlan {
    /// Every matrix in `ty`.
    pub fn uniform(ty: TensorType) -> DensePlan {
        DensePlan {
            default: Some(ty),
            classes: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// This plan with the matrices named in `names` stored in `ty` whatever their class says.
    pub fn with_tensors(mut self, names: Vec<String>, ty: TensorType) -> DensePlan {
        self.tensors.extend(names.into_iter().map(|n| (n, ty)));
        self
    }

    /// Parse `--dense`; integer types take `group` (from --group-size) unless they name one.
    pub fn parse(s: &str, group: Option<u32>) -> Result<DensePlan, String> {
        let mut plan = DensePlan::default();
        let classes: Vec<&str> = DenseClass::ALL.iter().map(|c| c.1).collect();
        for item in s.split(',').map(str::trim) {
            let (class, ty) = match item.split_once('=') {
                Some((c, t)) => (Some(c.trim()), t.trim()),
                None => (None, item),
            };
            let ty = TensorType::parse(ty, group).map_err(|e| format!("--dense '{item}': {e}"))?;
            match class {
                None if plan.default.is_some() => {
                    return Err(format!(
                        "--dense '{s}': more than one type for every matrix"
                    ));
                }
                None => plan.default = Some(ty),
                Some(c) => {
                    let Some(&(class, _)) = DenseClass::ALL.iter().find(|k| k.1 == c) else {
                        return Err(format!(
                            "--dense '{item}': unknown class '{c}' (known: {})",
                            classes.join(", ")
                        ));
                    };
                    plan.classes.retain(|k| k.0 != class);
                    plan.classes.push((class, ty));
                }
            }
        }
        Ok(plan)
    }

    /// The type of the dense matrix `name`, `source` where the plan says nothing.
    pub fn matrix_type(&self, name: &str, source: DType) -> TensorType {
        let class = DenseClass::of(name);
        let single = self.tensors.iter().find(|k| k.0 == name).map(|k| k.1);
        single
            .or_else(|| {
                self.classes
                    .iter()
                    .find(|k| Some(k.0) == class)
                    .map(|k| k.1)
            })
            .or(self.default)
            .unwrap_or(TensorType::Float(source))
    }

    /// Whether any matrix may be packed (quantized).
    pub fn quantizes(&self) -> bool {
        let packed = |t: &TensorType| matches!(t, TensorType::Packed(_));
        self.default.iter().any(packed)
            || self.classes.iter().any(|k| packed(&k.1))
            || self.tensors.iter().any(|k| packed(&k.1))
    }

    /// The .hob dense table: matrices as planned, norms, biases and routers in f32.
    pub fn specs(&self, dense: &[DenseTensor], source: DType) -> Vec<DenseSpec> {
        dense
            .iter()
            .map(|t| DenseSpec {
                name: t.hob_name.clone(),
                dtype: match t.role {
                    TensorRole::Matrix if t.shape.len() == 2 => {
                        self.matrix_type(&t.hob_name, source)
                    }
                    TensorRole::Matrix => self.matrix_type(&t.hob_name, source).float_or(source),
                    TensorRole::Norm | TensorRole::Router => TensorType::Float(DType::F32),
                },
                shape: t.shape.clone(),
            })
            .collect()
    }
}

impl TensorType {
    /// This type when it is a float one, else `fallback` (1-D tensors cannot be packed).
    fn float_or(self, fallback: DType) -> TensorType {
        match self {
            TensorType::Float(_) => self,
            TensorType::Packed(_) => TensorType::Float(fallback),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(s: &str) -> TensorType {
        TensorType::parse(s, None).unwrap()
    }

    #[test]
    fn classes_and_defaults() {
        let p = DensePlan::parse("f16,output=int8,attn=int4/g32", None).unwrap();
        let src = DType::Bf16;
        assert_eq!(p.matrix_type("output.weight", src), ty("int8"));
        assert_eq!(p.matrix_type("blk.3.attn_q.weight", src), ty("int4/g32"));
        assert_eq!(p.matrix_type("token_embd.weight", src), ty("f16"));
        assert!(p.quantizes());
        let none = DensePlan::default();
        assert_eq!(none.matrix_type("output.weight", src), ty("bf16"));
        assert!(!none.quantizes());
        let shared = DensePlan::parse("shared=int8", Some(32)).unwrap();
        assert_eq!(
            shared.matrix_type("blk.0.ffn_up_shexp.weight", src),
            ty("int8/g32")
        );
        assert_eq!(shared.matrix_type("blk.0.attn_k.weight", src), ty("bf16"));
    }

    #[test]
    fn bad_plans_are_named() {
        let e = DensePlan::parse("int8,f16", None).unwrap_err();
        assert!(e.contains("more than one type"), "{e}");
        let e = DensePlan::parse("mlp=int8", None).unwrap_err();
        assert!(
            e.contains("unknown class 'mlp'") && e.contains("attn"),
            "{e}"
        );
        let e = DensePlan::parse("q8_0", None).unwrap_err();
        assert!(e.contains("--dense 'q8_0'"), "{e}");
    }
}
