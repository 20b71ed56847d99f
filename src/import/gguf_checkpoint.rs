//! A GGUF file (llama.cpp's format; one file or a split set) as a convert source:
//! `hob convert --from model.gguf`.
//!
//! `general.architecture` picks the family: `qwen3moe`, `qwen2moe`, `olmoe`, `llama` with
//! experts (llama.cpp writes Mixtral as `llama`), `phimoe` (Phi-3.5-MoE; its LongRoPE
//! factors are tensors there), `gpt-oss`, `glm4moe` and `deepseek2`. The hyper-parameters come from the
//! `{arch}.*` keys (gpt-oss's and GLM-4.5's in [`super::gguf_families`]), the vocabulary size from `token_embd.weight`, tied embeddings from the
//! absence of `output.weight`. Dense tensors are found by their GGUF names, which are hob's
//! names; experts in the merged `blk.N.ffn_{gate,up,down}_exps.weight` (one expert's rows sliced
//! out and dequantized alone) or in older Mixtral files' `blk.N.ffn_{gate,up,down}.E.weight`. Every
//! tensor is checked at open (present, its dims, a type hob dequantizes), and a tensor hob would
//! not use is refused rather than dropped.
//!
//! llama.cpp's converter permutes the rows of Q and K of `llama` models (its RoPE rotates
//! adjacent pairs, Hugging Face's rotate-half pairs i and i + head_dim / 2); they are put back
//! in Hugging Face's order here. The NEOX-RoPE families are stored unpermuted.
//!
//! The tokenizer (`tokenizer.ggml.*`, `tokenizer.chat_template`) is rebuilt as a Hugging Face
//! tokenizer.json by [`super::gguf_tokenizer`]; a file without one converts to a .hob without
//! one, whose `hob run` then needs token ids.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::arch::ExpertNames;
use super::ggml::{self, GgmlType};
use super::gguf::{GgufError, GgufFile, GgufTensor};
use super::gguf_defaults;
use super::gguf_families;
use super::gguf_spec::{missing, parse_spec, unsupported, Keys};
use super::gguf_tokenizer::tokenizer_from_gguf;
use super::mxfp4::{Mxfp4Expert, Mxfp4Matrix};
use super::{
    Architecture, ConvertSource, DenseTensor, ExpertSource, ExpertWeights, ImportError,
    MixtralSpec, TokenizerFiles,
};
use crate::format::{keys, DType, ExpertShape, MetaValue, Metadata};

/// The `general.architecture` values hob converts.
pub const SUPPORTED: &str =
    "qwen3moe, qwen2moe, olmoe, llama (with llama.expert_count > 0: Mixtral), phimoe, gpt-oss, glm4moe, deepseek2";

/// How the file stores the experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufExperts {
    /// `blk.N.ffn_{gate,up,down}_exps.weight`, all experts of a layer in one tensor.
    Merged,
    /// `blk.N.ffn_{gate,up,down}.E.weight` (older Mixtral files).
    PerExpert,
}

/// A GGUF file opened and checked; nothing is dequantized until asked.
pub struct GgufCheckpoint {
    pub path: PathBuf,
    pub arch: Architecture,
    /// The dense dtype convert defaults to: the token embedding's type where it is F32 or BF16,
    /// else F16.
    pub source_dtype: DType,
    pub experts: GgufExperts,
    file: GgufFile,
    dense: Vec<DenseTensor>,
    /// Undo llama.cpp's Q/K row permutation (`llama` only).
    unpermute_qk: bool,
    /// The file's tokenizer, where it has one.
    pub tokenizer: Option<TokenizerFiles>,
}

impl GgufCheckpoint {
    pub fn open(path: &Path) -> Result<GgufCheckpoint, ImportError> {
        let file = GgufFile::open(path)?;
        let meta = file.metadata();
        let arch_name = meta.get_str(keys::ARCHITECTURE).map_err(|_| {
            Keys {
                path,
                meta,
                arch: "",
            }
            .err(keys::ARCHITECTURE, "a string")
        })?;
        let k = Keys {
            path,
            meta,
            arch: arch_name,
        };
        let arch = match arch_name {
            "qwen3moe" => {
                let renorm = "hob renormalizes Qwen3-MoE's top-k weights";
                k.require_bool("expert_weights_norm", true, renorm)?;
                Architecture::Qwen3Moe(parse_spec(&k, &file, false)?)
            }
            "qwen2moe" => {
                let kept = "hob runs Qwen2-MoE's top-k weights as they are";
                k.require_bool("expert_weights_norm", false, kept)?;
                let spec = parse_spec(&k, &file, false)?;
                Architecture::Qwen2Moe(spec, k.usize(keys::EXPERT_SHARED_FEED_FORWARD_LENGTH)?)
            }
            "olmoe" => {
                let kept = "hob runs OLMoE's top-k weights as they are";
                k.require_bool("expert_weights_norm", false, kept)?;
                if meta.get(&k.full("attention.clamp_kqv")).is_some() {
                    let detail = "hob does not clip q, k and v";
                    return Err(unsupported(path, &k.full("attention.clamp_kqv"), detail));
                }
                Architecture::Olmoe(parse_spec(&k, &file, false)?)
            }
            "llama" if k.opt_usize(keys::EXPERT_COUNT)?.unwrap_or(0) > 0 => {
                let spec = parse_spec(&k, &file, false)?;
                if spec.head_dim % 2 != 0 {
                    return Err(k.err(&k.full(keys::KEY_LENGTH), "an even head size"));
                }
                Architecture::Mixtral(spec)
            }
            "gpt-oss" => {
                let (spec, extras) = gguf_families::gptoss(&k, &file)?;
                Architecture::GptOss(spec, extras)
            }
            "glm4moe" => {
                let (spec, extras) = gguf_families::glm4moe(&k, &file)?;
                Architecture::Glm4Moe(spec, extras)
            }
            "deepseek2" => {
                let (spec, extras) = gguf_families::deepseek2(&k, &file)?;
                Architecture::DeepseekV2(spec, extras)
            }
            "phimoe" => {
                let (spec, extras) = gguf_families::phimoe(&k, &file)?;
                eprintln!(
                    "{}: phimoe: sparsemixer's jitter eps is not in GGUF files (llama.cpp routes \
                     Phi-3.5-MoE by softmax top-2); using Phi-3.5-MoE's router_jitter_noise {}; \
                     LongRoPE's short and long mscale are {}.rope.scaling.attn_factor ({})",
                    path.display(),
                    extras.jitter_eps,
                    arch_name,
                    extras.short_mscale
                );
                Architecture::Phimoe(spec, extras)
            }
            other => {
                let found = match other {
                    "llama" => "llama without experts (llama.expert_count absent or 0)",
                    o => o,
                };
                return Err(ImportError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    found: found.to_string(),
                    supported: SUPPORTED.to_string(),
                });
            }
        };
        let unpermute_qk = matches!(arch, Architecture::Mixtral(_));
        // Tensors read here into the metadata (Phi's LongRoPE factors), not converted.
        let read_here: &[&str] = match arch {
            Architecture::Phimoe(..) => &[
                gguf_families::ROPE_FACTORS_LONG,
                gguf_families::ROPE_FACTORS_SHORT,
            ],
            _ => &[],
        };
        Self::checked(path, file, arch, unpermute_qk, read_here)
    }

    /// Find the experts' layout and check every tensor: the ones `arch` needs are present with
    /// the right dims and a type hob dequantizes, and there are no others.
    fn checked(
        path: &Path,
        file: GgufFile,
        arch: Architecture,
        unpermute_qk: bool,
        read_here: &[&str],
    ) -> Result<GgufCheckpoint, ImportError> {
        let s = arch.expert_shape();
        let dense = arch.dense_tensors(&ExpertSource::PerExpert {
            hidden: s.hidden,
            ffn: s.ffn,
            names: ExpertNames::Mixtral,
        });
        let first = arch.first_moe_layer();
        let experts = if file.tensor(&merged_name(first, "gate")).is_some() {
            GgufExperts::Merged
        } else if file.tensor(&per_expert_name(first, "gate", 0)).is_some() {
            GgufExperts::PerExpert
        } else {
            return Err(missing(path, &merged_name(first, "gate")));
        };
        // Each expected tensor is checked as it is named, so a hostile layer or expert count fails
        // at its first missing tensor instead of listing millions of names first.
        let mut known: HashSet<String> = read_here.iter().map(|n| n.to_string()).collect();
        let mut expect = |name: String, shape: &[usize]| -> Result<(), ImportError> {
            let t = file.tensor(&name).ok_or_else(|| missing(path, &name))?;
            check_tensor(&t, shape)?;
            known.insert(name);
            Ok(())
        };
        for t in &dense {
            let name = gguf_families::gguf_name(&arch, &t.hob_name);
            expect(name, &gguf_families::gguf_shape(t))?;
        }
        for l in first..first + s.n_layers {
            for (which, rows, cols) in [
                ("gate", s.ffn, s.hidden),
                ("up", s.ffn, s.hidden),
                ("down", s.hidden, s.ffn),
            ] {
                match experts {
                    GgufExperts::Merged => {
                        expect(merged_name(l, which), &[s.n_experts, rows, cols])?
                    }
                    GgufExperts::PerExpert => {
                        for e in 0..s.n_experts {
                            expect(per_expert_name(l, which, e), &[rows, cols])?;
                        }
                    }
                }
            }
        }
        let skipped = gguf_families::skipped_layers(&arch, &file);
        if let Some(extra) = file
            .tensors()
            .iter()
            .find(|t| !known.contains(t.name.as_str()) && !skipped.contains(&t.name))
        {
            let detail = format!(
                "hob's {} does not use it (and would not drop a tensor silently)",
                arch.hob_name()
            );
            return Err(unsupported(
                path,
                &format!("tensor {}", extra.name),
                &detail,
            ));
        }
        let source_dtype = match file.tensor(keys::TOKEN_EMBD).map(|t| t.ggml_type()) {
            Some(GgmlType::F32) => DType::F32,
            Some(GgmlType::BF16) => DType::Bf16,
            _ => DType::F16,
        };
        let n_rows = dense
            .iter()
            .find(|t| t.hob_name == keys::TOKEN_EMBD)
            .and_then(|t| t.shape.first().copied());
        let tokenizer = tokenizer_from_gguf(path, file.metadata(), n_rows)?;
        Ok(GgufCheckpoint {
            path: path.to_path_buf(),
            arch,
            source_dtype,
            experts,
            file,
            dense,
            unpermute_qk,
            tokenizer,
        })
    }

    /// One tensor by name, dequantized (checked finite).
    fn load(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| missing(&self.path, name))?;
        let values = t.dequantize_f32()?;
        check_finite(&t, &values)?;
        Ok(values)
    }

    /// One expert's [rows, cols] matrix out of a merged [n_expert, rows, cols] tensor: only its
    /// rows are dequantized.
    fn load_merged(
        &self,
        name: &str,
        expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, ImportError> {
        let (t, bytes, row_bytes) = self.merged_bytes(name, expert, rows, cols)?;
        let mut out = vec![0f32; rows * cols];
        for (src, dst) in bytes
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(cols))
        {
            ggml::dequantize_row(t.ggml_type(), src, dst).map_err(|e| dequantize(&t, name, e))?;
        }
        check_finite(&t, &out)?;
        Ok(out)
    }

    /// The same matrix's blocks as they are, where the tensor is MXFP4 (else None).
    fn load_merged_mxfp4(
        &self,
        name: &str,
        expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Mxfp4Matrix>, ImportError> {
        let (t, bytes, _) = self.merged_bytes(name, expert, rows, cols)?;
        if t.ggml_type() != GgmlType::MXFP4 {
            return Ok(None);
        }
        let m = Mxfp4Matrix::from_ggml(bytes);
        m.check_finite(t.path(), name, expert).map(|()| Some(m))
    }

    /// Expert `expert`'s bytes of a merged tensor and its bytes a row.
    fn merged_bytes(
        &self,
        name: &str,
        expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(GgufTensor<'_>, &[u8], usize), ImportError> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| missing(&self.path, name))?;
        let row_bytes = t
            .ggml_type()
            .row_bytes(cols)
            .map_err(|e| dequantize(&t, name, e))?;
        let size = rows * row_bytes;
        let bytes = t
            .bytes()
            .get(expert * size..(expert + 1) * size)
            .ok_or_else(|| {
                ImportError::from(GgufError::Tensor {
                    path: t.path().to_path_buf(),
                    name: name.to_string(),
                    detail: format!("expert {expert}'s rows run past the tensor's data"),
                })
            })?;
        Ok((t, bytes, row_bytes))
    }

    fn spec(&self) -> &MixtralSpec {
        self.arch.spec()
    }

    /// `general.name` of the file, else its name without `.gguf`.
    pub fn name(&self) -> String {
        match self.file.metadata().get(keys::NAME) {
            Some(MetaValue::String(s)) if !s.is_empty() => s.clone(),
            _ => self
                .path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".to_string()),
        }
    }
}

impl ConvertSource for GgufCheckpoint {
    fn dense_tensors(&self) -> &[DenseTensor] {
        &self.dense
    }

    fn expert_shape(&self) -> ExpertShape {
        self.arch.expert_shape()
    }

    fn source_dtype(&self) -> DType {
        self.source_dtype
    }

    fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    fn default_experts(&self) -> &'static str {
        gguf_defaults::default_experts(self.file.tensors())
    }

    fn default_dense(&self) -> Option<&'static str> {
        gguf_defaults::default_dense(self.file.tensors())
    }

    fn default_dense_int4(&self) -> Vec<String> {
        if self.default_dense().is_none() {
            return Vec::new();
        }
        self.dense
            .iter()
            .filter(|t| t.role == super::arch::TensorRole::Matrix && t.shape.len() == 2)
            .filter(|t| {
                let name = gguf_families::gguf_name(&self.arch, &t.hob_name);
                gguf_defaults::narrow_dense(self.file.tensors(), &name)
            })
            .map(|t| t.hob_name.clone())
            .collect()
    }

    fn load_dense(&self, t: &DenseTensor) -> Result<Vec<f32>, ImportError> {
        let values = self.load(&gguf_families::gguf_name(&self.arch, &t.hob_name))?;
        // Partial rotary's q/k order and DeepSeek's de-interleaved RoPE rows are made here as
        // from Hugging Face (the GGUF keeps the checkpoint's order); gpt-oss's gate/up biases are
        // separate tensors here, and DeepSeek's k_b / v_b already split.
        let values = match t.lanes {
            super::arch::Lanes::RopeOrder { .. } | super::arch::Lanes::Interleaved { .. } => {
                t.take_lanes(values)
            }
            _ => values,
        };
        let s = self.spec();
        let heads = if !self.unpermute_qk {
            None
        } else if t.hob_name.ends_with(keys::ATTN_Q) {
            Some(s.n_heads)
        } else if t.hob_name.ends_with(keys::ATTN_K) {
            Some(s.n_kv_heads)
        } else {
            None
        };
        Ok(match heads {
            Some(n) => unpermute_rows(&values, n, s.hidden),
            None => values,
        })
    }

    fn load_expert(&self, layer: usize, expert: usize) -> Result<ExpertWeights, ImportError> {
        let (h, f) = (self.spec().hidden, self.spec().ffn);
        let layer = layer + self.arch.first_moe_layer();
        match self.experts {
            GgufExperts::Merged => {
                let mats = [("gate", f, h), ("up", f, h), ("down", h, f)];
                let mut raw = Vec::new();
                for (w, rows, cols) in mats {
                    let name = merged_name(layer, w);
                    raw.extend(self.load_merged_mxfp4(&name, expert, rows, cols)?);
                }
                Ok(ExpertWeights {
                    gate: self.load_merged(&merged_name(layer, "gate"), expert, f, h)?,
                    up: self.load_merged(&merged_name(layer, "up"), expert, f, h)?,
                    down: self.load_merged(&merged_name(layer, "down"), expert, h, f)?,
                    mxfp4: <Box<Mxfp4Expert>>::try_from(raw).ok(),
                })
            }
            GgufExperts::PerExpert => Ok(ExpertWeights {
                gate: self.load(&per_expert_name(layer, "gate", expert))?,
                up: self.load(&per_expert_name(layer, "up", expert))?,
                down: self.load(&per_expert_name(layer, "down", expert))?,
                mxfp4: None,
            }),
        }
    }

    /// The architecture's keys, the name, BOS/EOS ids where the file has them, the tied flag and
    /// the source dtype; the tokenizer keys where the file has a tokenizer.
    fn metadata(&self) -> Metadata {
        let mut m = super::model_metadata(&self.arch, self.name());
        let (bos, eos) = self.arch.special_token_ids();
        for (key, id) in [(keys::BOS_TOKEN_ID, bos), (keys::EOS_TOKEN_ID, eos)] {
            if let Some(id) = id {
                m.set(key, MetaValue::U32(id));
            }
        }
        super::set_tie_and_source(&mut m, &self.arch, self.source_dtype);
        m.set(keys::SOURCE, MetaValue::String(self.provenance()));
        if let Some(t) = &self.tokenizer {
            t.write_metadata(&mut m);
        }
        m
    }
}

impl GgufCheckpoint {
    /// "GGUF NAME: experts Q4_K x60, Q6_K x30; dense F32 x121, ...": the file and how many of its
    /// expert and dense tensors are of each type (each is dequantized, then stored as asked).
    fn provenance(&self) -> String {
        let mut experts: Vec<(&str, usize)> = Vec::new();
        let mut dense: Vec<(&str, usize)> = Vec::new();
        for t in self.file.tensors() {
            let side = if gguf_defaults::is_expert_tensor(&t.name) {
                &mut experts
            } else {
                &mut dense
            };
            let name = t.ggml_type.name();
            match side.iter_mut().find(|(k, _)| *k == name) {
                Some((_, c)) => *c += 1,
                None => side.push((name, 1)),
            }
        }
        let list = |v: &[(&str, usize)]| {
            v.iter()
                .map(|(k, c)| format!("{k} x{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let file = self
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!(
            "GGUF {file}: experts {}; dense {}",
            list(&experts),
            list(&dense)
        )
    }
}

fn merged_name(layer: usize, which: &str) -> String {
    format!("blk.{layer}.ffn_{which}_exps.weight")
}

fn per_expert_name(layer: usize, which: &str, expert: usize) -> String {
    format!("blk.{layer}.ffn_{which}.{expert}.weight")
}

/// `t`'s dims against the row-major `shape` (GGUF lists them reversed; trailing 1s, which
/// llama.cpp ignores, are ignored), and its type one hob dequantizes.
pub(super) fn check_tensor(t: &GgufTensor, shape: &[usize]) -> Result<(), ImportError> {
    let trim = |d: &mut Vec<usize>| {
        while d.len() > 1 && d.last() == Some(&1) {
            d.pop();
        }
    };
    let mut want: Vec<usize> = shape.iter().rev().copied().collect();
    let mut found: Vec<usize> = t.dims().iter().map(|&d| d as usize).collect();
    trim(&mut want);
    trim(&mut found);
    if want != found {
        return Err(ImportError::ShapeMismatch {
            name: t.name().to_string(),
            file: t.path().display().to_string(),
            expected: shape.to_vec(),
            found: t.dims().iter().rev().map(|&d| d as usize).collect(),
        });
    }
    if !t.ggml_type().is_supported() {
        return Err(dequantize(
            t,
            t.name(),
            ggml::GgmlError::Unsupported { ty: t.ggml_type() },
        ));
    }
    Ok(())
}

/// A block type's failure on tensor `name`.
fn dequantize(t: &GgufTensor<'_>, name: &str, source: ggml::GgmlError) -> ImportError {
    ImportError::from(GgufError::Dequantize {
        path: t.path().to_path_buf(),
        name: name.to_string(),
        source,
    })
}

pub(super) fn check_finite(t: &GgufTensor, values: &[f32]) -> Result<(), ImportError> {
    // One pass without an early exit a value (it vectorizes); counted only when something is off.
    let finite = values
        .chunks(4096)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()));
    if finite {
        return Ok(());
    }
    Err(ImportError::NonFinite {
        name: t.name().to_string(),
        file: t.path().display().to_string(),
        count: values.iter().filter(|v| !v.is_finite()).count(),
        first: values.iter().position(|v| !v.is_finite()).unwrap_or(0),
    })
}

/// Undo llama.cpp's `LlamaModel.permute` on the rows of a [n_head * head_dim, cols] matrix:
/// row `2 j + t` of a head goes back to row `t * head_dim / 2 + j`.
fn unpermute_rows(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols.max(1);
    let head_dim = rows / n_head.max(1);
    let half = head_dim / 2;
    let mut out = w.to_vec();
    for h in 0..n_head {
        for j in 0..half {
            for t in 0..2 {
                let (src, dst) = (h * head_dim + 2 * j + t, h * head_dim + t * half + j);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's permute: reshape(n_head, 2, head_dim / 2, cols).swapaxes(1, 2).
    fn permute(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
        let head_dim = w.len() / cols / n_head;
        let half = head_dim / 2;
        let mut out = vec![0.0; w.len()];
        for h in 0..n_head {
            for t in 0..2 {
                for j in 0..half {
                    // Source index (h, t, j) lands at (h, j, t).
                    let src = h * head_dim + t * half + j;
                    let dst = h * head_dim + j * 2 + t;
                    out[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_undoes_llama_cpp_permute() {
        let (n_head, head_dim, cols) = (3, 8, 5);
        let w: Vec<f32> = (0..n_head * head_dim * cols).map(|i| i as f32).collect();
        let p = permute(&w, n_head, cols);
        assert_ne!(p, w);
        // Row 1 of head 0 in llama.cpp's order is HF's row head_dim / 2 (its rotation partner).
        assert_eq!(p[cols], w[(head_dim / 2) * cols]);
        assert_eq!(unpermute_rows(&p, n_head, cols), w);
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = GgufCheckpoint::open(Path::new("/nonexistent/x.gguf"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/x.gguf"), "{e}");
    }
}
