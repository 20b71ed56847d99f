//! Synthetic models: random weights in a real model's exact shapes, written straight to .hob for
//! speed benchmarks at real scale (speed only: the weights mean nothing).
//!
//! Each preset is written as its own architecture, with its routing and norms: qwen3-30b-a3b as
//! `qwen3moe` (QK-norm), qwen1.5-moe-a2.7b as `qwen2moe` (q/k/v biases, a shared expert),
//! olmoe-1b-7b as `olmoe`, phi-3.5-moe as `phimoe` (LayerNorm, biases, sparsemixer; LongRoPE with
//! factors of 1, which changes no shape or cost), gpt-oss-20b and gpt-oss-120b as `gpt-oss`
//! (sinks of ones, YaRN, alternating sliding layers), glm-4.5-air as `glm4moe` (a dense
//! first layer, a shared expert, grouped sigmoid routing, partial rotary), mixtral-8x7b as
//! `mixtral`.
//!
//! Nothing is quantized: each variant's bytes are generated directly, so a file of tens of GB
//! takes as long as the disk needs to take it.
//! - f16/bf16/f32 values come from a 65 536-entry table of N(0, 0.02) samples, indexed by 16
//!   random bits (four values per 64-bit random number);
//! - int8/int4/int2: random codes (int8 never -128), per-group f16 scales jittered by +-25% around
//!   a base chosen so the dequantized weights have a standard deviation near 0.02 (magnitudes
//!   below 0.045), and (int4, int2) mins centering each group on zero;
//! - norms are f32 ones, biases zeros, routers f32 N(0, 0.02), embedding and output both
//!   present (untied).
//!
//! Deterministic: every 1 MiB chunk of every tensor or matrix has its own random stream, keyed
//! by the seed and what the chunk is (tensor name; layer, expert, variant, matrix; chunk index),
//! so the bytes depend on neither thread count nor the other variants or layers requested.
//!
//! Memory stays bounded: one thread generates a cell (one expert in all its variants, using every
//! core through rayon) while the caller's thread writes the previous one; at most three cells
//! are alive at once.

use std::path::Path;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::arch::{Architecture, ExpertSource, MixtralSpec, TensorRole};
use super::{DensePlan, DenseTensor};
use crate::error::Error;
use crate::format::{
    keys, DType, DenseSpec, ExpertLayout, ExpertShape, HobWriter, MatrixLayout, MetaValue,
    Metadata, TensorType, Variant, VariantKind,
};

pub use super::presets::PRESETS;

/// Standard deviation of the generated weights.
pub const WEIGHT_SD: f32 = 0.02;

/// Bytes of output per random stream (and per rayon task).
const CHUNK: usize = 1 << 20;

/// A synthetic model: a preset's shapes, possibly cut to its first layers.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticModel {
    /// The preset's name, or any label for hand-built shapes (tests).
    pub name: String,
    /// Layers of the full model (`spec.n_layers` may be fewer, see `with_layers`).
    pub total_layers: usize,
    /// The shapes, written as a Mixtral.
    pub spec: MixtralSpec,
    /// A real tokenizer (and chat template) to embed, so the file runs on text: for serving
    /// and end-to-end benchmarks of a model's shape.
    pub tokenizer: Option<super::tokenizer::TokenizerFiles>,
}

impl SyntheticModel {
    /// One of `PRESETS`, all layers. Shapes from the public config.json files.
    pub fn preset(name: &str) -> Result<SyntheticModel, String> {
        let spec = super::presets::spec_of(name)?;
        Ok(SyntheticModel {
            name: name.to_string(),
            total_layers: spec.n_layers,
            spec,
            tokenizer: None,
        })
    }

    /// Keep the first `n` layers; `n` must be in 1..=total_layers.
    pub fn with_layers(mut self, n: usize) -> Result<SyntheticModel, String> {
        if n == 0 || n > self.total_layers {
            return Err(format!(
                "--layers {n}: {} has {} layers (give 1..={})",
                self.name, self.total_layers, self.total_layers
            ));
        }
        self.spec.n_layers = n;
        Ok(self)
    }

    /// `general.name`: "synthetic phi-3.5-moe (8 of 32 layers)".
    pub fn display_name(&self) -> String {
        if self.spec.n_layers != self.total_layers {
            let (n, total) = (self.spec.n_layers, self.total_layers);
            format!("synthetic {} ({n} of {total} layers)", self.name)
        } else {
            format!("synthetic {}", self.name)
        }
    }

    /// The architecture the file is written as (`general.architecture`).
    pub fn arch_name(&self) -> &'static str {
        self.arch().hob_name()
    }

    fn arch(&self) -> Architecture {
        super::presets::arch_of(&self.name, self.spec.clone())
    }

    /// Dense tensors in the order they are written: the same names, shapes and roles as a
    /// converted Mixtral checkpoint.
    pub fn dense_tensors(&self) -> Vec<DenseTensor> {
        self.arch().dense_tensors(&ExpertSource::PerExpert {
            names: super::arch::ExpertNames::Mixtral,
            hidden: self.spec.hidden,
            ffn: self.spec.ffn,
        })
    }

    /// The dense table: matrices as `plan` says (else f16), norms and routers in f32.
    pub fn dense_specs(&self, plan: &DensePlan) -> Vec<DenseSpec> {
        plan.specs(&self.dense_tensors(), DType::F16)
    }

    pub fn expert_shape(&self) -> ExpertShape {
        self.arch().expert_shape()
    }

    /// The architecture, the hyper-parameters, `hob.synthetic_*` and the tokenizer if given.
    pub fn metadata(&self, seed: u64) -> Metadata {
        let mut m = super::model_metadata(&self.arch(), self.display_name());
        m.set(keys::TIE_WORD_EMBEDDINGS, MetaValue::Bool(false));
        m.set(keys::SYNTHETIC_MODEL, MetaValue::String(self.name.clone()));
        m.set(keys::SYNTHETIC_SEED, MetaValue::U64(seed));
        if let Some(t) = &self.tokenizer {
            t.write_metadata(&mut m);
        }
        m
    }

    /// Embed the tokenizer in `dir` (tokenizer.json, optionally tokenizer_config.json and
    /// generation_config.json); its vocabulary must fit the model's.
    pub fn with_tokenizer(mut self, dir: &std::path::Path) -> crate::Result<SyntheticModel> {
        let files = super::tokenizer::TokenizerFiles::open(dir, (None, None))?;
        let n = crate::generate::parse_hf_json(&files.json)?.get_vocab_size(true);
        if n > self.spec.vocab {
            return Err(crate::Error::Invalid(format!(
                "--tokenizer {}: {n} tokens, more than {}'s vocabulary of {}",
                dir.display(),
                self.name,
                self.spec.vocab
            )));
        }
        self.tokenizer = Some(files);
        Ok(self)
    }
}

/// What `write` produced.
#[derive(Clone, Debug)]
pub struct SyntheticSummary {
    pub dense_count: usize,
    pub dense_bytes: u64,
    /// Per variant: (variant, blob bytes over all experts, padding excluded).
    pub expert_bytes: Vec<(Variant, u64)>,
    pub experts_per_variant: usize,
}

/// Total payload bytes (`dense_bytes` plus every blob), the progress bar's length.
pub fn payload_bytes(model: &SyntheticModel, variants: &[Variant], dense: &DensePlan) -> u64 {
    let dense_bytes: u64 = model
        .dense_specs(dense)
        .iter()
        .filter_map(|d| d.dtype.size(&d.shape).ok())
        .map(|n| n as u64)
        .sum();
    let s = model.expert_shape();
    let cells = (s.n_layers * s.n_experts) as u64;
    let experts: u64 = variants
        .iter()
        .filter_map(|v| v.expert_layout(s.hidden, s.ffn).ok())
        .map(|l| l.size as u64 * cells)
        .sum();
    dense_bytes + experts
}

enum Item {
    Dense(usize, Vec<u8>),
    Cell(usize, usize, Vec<Vec<u8>>),
}

/// Generate `model` and write it to `out` (atomically, through `HobWriter`). `progress` is called
/// on the calling thread after each tensor or expert is written, with a label and the bytes just
/// written.
pub fn write(
    model: &SyntheticModel,
    variants: &[Variant],
    dense: &DensePlan,
    seed: u64,
    out: &Path,
    progress: &mut dyn FnMut(&str, u64),
) -> crate::Result<SyntheticSummary> {
    let shape = model.expert_shape();
    let layouts = variants
        .iter()
        .map(|v| v.expert_layout(shape.hidden, shape.ffn))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Invalid(format!("--experts: {e}")))?;
    let tensors = model.dense_tensors();
    let specs = model.dense_specs(dense);
    let mut writer = HobWriter::create(out, &model.metadata(seed), &specs, shape, variants)?;

    let (tx, rx) = crossbeam_channel::bounded::<Item>(1);
    let produce = || {
        // Owned by the producer: dropping it when done ends the writer's loop.
        let tx = tx;
        for (i, (t, d)) in tensors.iter().zip(&specs).enumerate() {
            let bytes = dense_tensor(t.role, d, seed);
            if tx.send(Item::Dense(i, bytes)).is_err() {
                return; // the writer stopped on an error
            }
        }
        for layer in 0..shape.n_layers {
            for expert in 0..shape.n_experts {
                let blobs = variants
                    .iter()
                    .zip(&layouts)
                    .map(|(v, l)| expert_blob(*v, l, seed, layer, expert))
                    .collect();
                if tx.send(Item::Cell(layer, expert, blobs)).is_err() {
                    return;
                }
            }
        }
    };
    let mut dense_bytes = 0u64;
    std::thread::scope(|s| -> crate::Result<()> {
        s.spawn(produce);
        // Owned here: an early return drops it, which stops the producer.
        let rx = rx;
        for item in rx.iter() {
            match item {
                Item::Dense(i, bytes) => {
                    writer.write_dense(i, &bytes)?;
                    dense_bytes += bytes.len() as u64;
                    progress(&specs[i].name, bytes.len() as u64);
                }
                Item::Cell(layer, expert, blobs) => {
                    let n: usize = blobs.iter().map(Vec::len).sum();
                    for (vi, blob) in blobs.iter().enumerate() {
                        writer.write_expert(layer, expert, vi, blob)?;
                    }
                    progress(&format!("layer {layer} expert {expert}"), n as u64);
                }
            }
        }
        Ok(())
    })?;
    writer.finish()?;
    let cells = shape.n_layers * shape.n_experts;
    Ok(SyntheticSummary {
        dense_count: specs.len(),
        dense_bytes,
        expert_bytes: variants
            .iter()
            .zip(&layouts)
            .map(|(v, l)| (*v, (l.size * cells) as u64))
            .collect(),
        experts_per_variant: cells,
    })
}

/// The bytes of one dense tensor.
pub fn dense_tensor(role: TensorRole, d: &DenseSpec, seed: u64) -> Vec<u8> {
    let dtype = match d.dtype {
        TensorType::Float(dtype) => dtype,
        TensorType::Packed(v) => return packed_tensor(role, d, v, seed),
    };
    let n: usize = d.shape.iter().product();
    let mut bytes = vec![0u8; n * dtype.size()];
    let key = stream(seed, &[TAG_DENSE, fnv1a(d.name.as_bytes())]);
    match (role, dtype) {
        // Biases are zeros, as in tools/make_synthetic_gguf.py: a bias of ones on v (or o) adds
        // one vector to every token, which then routes alike and makes any cache look perfect.
        (TensorRole::Norm, _) if d.name.ends_with(".bias") => {}
        (TensorRole::Norm, _) => {
            let one = match dtype {
                DType::F32 => 1.0f32.to_bits().to_le_bytes().to_vec(),
                DType::F16 => half::f16::ONE.to_le_bytes().to_vec(),
                DType::Bf16 => half::bf16::ONE.to_le_bytes().to_vec(),
            };
            for c in bytes.chunks_exact_mut(one.len()) {
                c.copy_from_slice(&one);
            }
        }
        (_, DType::F32) => fill_par(&mut bytes, key, |r, c| fill_f32(r, c, &tables().f32)),
        (_, DType::F16) => fill_par(&mut bytes, key, |r, c| fill_u16(r, c, &tables().f16)),
        (_, DType::Bf16) => fill_par(&mut bytes, key, |r, c| fill_u16(r, c, &tables().bf16)),
    }
    bytes
}

/// A packed matrix: its f16 values as `dense_tensor` makes them, quantized.
fn packed_tensor(role: TensorRole, d: &DenseSpec, v: Variant, seed: u64) -> Vec<u8> {
    let f16 = DenseSpec {
        dtype: TensorType::Float(DType::F16),
        ..d.clone()
    };
    let mut values = Vec::new();
    super::dtype::decode_into(DType::F16, &dense_tensor(role, &f16, seed), &mut values);
    match v.matrix_layout(d.shape[0], d.shape[d.shape.len() - 1]) {
        Ok(layout) => crate::quant::quantize_matrix(v, &layout, &values),
        // The writer checked every packed shape when it planned the file.
        Err(_) => Vec::new(),
    }
}

/// The blob of one expert in `variant` (`layout.size` bytes; padding between sub-arrays zero).
pub fn expert_blob(
    variant: Variant,
    layout: &ExpertLayout,
    seed: u64,
    layer: usize,
    expert: usize,
) -> Vec<u8> {
    if variant.kind == VariantKind::Ap8 {
        let key = stream(
            seed,
            &[
                TAG_EXPERT,
                layer as u64,
                expert as u64,
                variant.kind.code() as u64,
            ],
        );
        return ap8_blob(layout, key);
    }
    let mut blob = vec![0u8; layout.size];
    for (mi, (offset, m)) in [
        (layout.gate_offset, &layout.gate),
        (layout.up_offset, &layout.up),
        (layout.down_offset, &layout.down),
    ]
    .into_iter()
    .enumerate()
    {
        let key = stream(
            seed,
            &[
                TAG_EXPERT,
                layer as u64,
                expert as u64,
                variant.kind.code() as u64,
                variant.group_size as u64,
                mi as u64,
            ],
        );
        fill_matrix(variant, m, &mut blob[offset..offset + m.size], key);
    }
    blob
}

/// An ap8 blob: random codes and correction bytes, every 16 under one parent pair (a = b = 15
/// under its row's pair) whose 256 levels have sd WEIGHT_SD, and the header's prefix checksums.
fn ap8_blob(layout: &ExpertLayout, key: u64) -> Vec<u8> {
    use crate::format::ap8;
    let (hidden, ffn) = (layout.gate.cols, layout.gate.rows);
    let ap = ap8::ApLayout::new(hidden, ffn).expect("the writer checked the shape");
    let mut blob = vec![0u8; layout.size];
    fill_par(&mut blob[ap8::HEADER..], key, fill_bytes);
    let s8 = WEIGHT_SD * (12.0f32 / (256.0 * 256.0 - 1.0)).sqrt();
    let d = half::f16::from_f32(s8 / 15.0);
    let dm = half::f16::from_f32(127.5 * s8 / 15.0);
    for p in &ap.parts {
        for r in 0..p.rows {
            blob[p.pairs + 4 * r..p.pairs + 4 * r + 2].copy_from_slice(&d.to_le_bytes());
            blob[p.pairs + 4 * r + 2..p.pairs + 4 * r + 4].copy_from_slice(&dm.to_le_bytes());
        }
        let subs = p.rows * p.cols / ap8::SUB;
        blob[p.subs..p.subs + subs].fill(0xff);
    }
    for k in ap8::MIN_WIDTH..ap8::MAX_WIDTH {
        let crc = crc32c::crc32c(&blob[ap8::HEADER..ap.prefix(k)]);
        let at = 4 * usize::from(k - ap8::MIN_WIDTH);
        blob[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    blob
}

/// Fill one stored matrix (`buf` is `m.size` bytes, relative to the matrix start).
fn fill_matrix(variant: Variant, m: &MatrixLayout, buf: &mut [u8], key: u64) {
    let t = tables();
    let codes_key = stream(key, &[0]);
    let side_key = stream(key, &[1]);
    let codes = &mut buf[m.codes.clone()];
    match variant.kind {
        VariantKind::F16 => fill_par(codes, codes_key, |r, c| fill_u16(r, c, &t.f16)),
        VariantKind::Bf16 => fill_par(codes, codes_key, |r, c| fill_u16(r, c, &t.bf16)),
        VariantKind::Int8 => fill_par(codes, codes_key, |r, c| {
            fill_bytes(r, c);
            // -128 is not a valid int8 code.
            for b in c.iter_mut() {
                *b ^= (*b == 0x80) as u8;
            }
        }),
        VariantKind::Int4
        | VariantKind::Int4k
        | VariantKind::Int2k
        | VariantKind::Int3
        | VariantKind::Int2
        | VariantKind::Mxfp4 => fill_par(codes, codes_key, fill_bytes),
        VariantKind::Ap8 => unreachable!("ap8 blobs: ap8_blob"),
    }
    if variant.kind.is_float() {
        return;
    }
    if variant.kind.is_sub_scaled() {
        return fill_subscaled(variant.kind, m, buf, side_key);
    }
    if variant.kind == VariantKind::Mxfp4 {
        // Uniform e2m1 codes have sd 2.93 * 2^(e - 127): the exponent nearest WEIGHT_SD, each
        // block one above or below it at random.
        let e0 = (127.0 + (WEIGHT_SD / 2.926).log2().round()) as i32;
        fill_par(&mut buf[m.scales.clone()], side_key, |r, c| {
            for b in c.iter_mut() {
                *b = (e0 + (r.next() % 3) as i32 - 1).clamp(0, 254) as u8;
            }
        });
        return;
    }
    // Dequantized values take L equally likely levels spaced `scale` apart, centered on zero:
    // sd = scale * sqrt((L^2 - 1) / 12), so the base scale gives sd WEIGHT_SD. Symmetric int8
    // has L = 255 (-127..=127); asymmetric int-k has L = 2^k, min = -(L - 1) / 2 * scale.
    let half_steps = match variant.kind {
        VariantKind::Int8 => 127.0,
        _ => ((1u32 << variant.kind.bits()) - 1) as f32 / 2.0,
    };
    let levels = 2.0 * half_steps + 1.0;
    let base = WEIGHT_SD * (12.0 / (levels * levels - 1.0)).sqrt();
    let has_mins = variant.kind.has_mins();
    // Scales come before mins; both are f16 [rows, cols / group].
    let (head, tail) = buf.split_at_mut(m.mins.start.max(m.scales.end));
    let scales = &mut head[m.scales.clone()];
    let mins = if has_mins {
        &mut tail[..m.mins.len()]
    } else {
        &mut tail[..0]
    };
    let scale_chunks = scales.par_chunks_mut(CHUNK);
    let fill_group = |i: usize, s: &mut [u8], mn: &mut [u8]| {
        let mut r = Rng::new(stream(side_key, &[i as u64]));
        for (j, sc) in s.chunks_exact_mut(2).enumerate() {
            // +-25% jitter, 16 bits of it.
            let jitter = 0.75 + 0.5 * (r.next() & 0xffff) as f32 / 65535.0;
            let scale = half::f16::from_f32(base * jitter);
            sc.copy_from_slice(&scale.to_le_bytes());
            if has_mins {
                let min = half::f16::from_f32(-half_steps * scale.to_f32());
                mn[2 * j..2 * j + 2].copy_from_slice(&min.to_le_bytes());
            }
        }
    };
    if has_mins {
        scale_chunks
            .zip(mins.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (s, mn))| fill_group(i, s, mn));
    } else {
        scale_chunks
            .enumerate()
            .for_each(|(i, s)| fill_group(i, s, &mut []));
    }
}

/// int4k's (int2k's) groups as int4's (int2's) in `fill_matrix` (sd WEIGHT_SD, +-25% jitter):
/// each row's pair (d, dm) = (base / 200, -half_steps base / 100), a group's a in 150..=250 and
/// b = 100 (int2k: (base / 10, -half_steps base / 5), a in 8..=12, b = 5).
fn fill_subscaled(kind: VariantKind, m: &MatrixLayout, buf: &mut [u8], key: u64) {
    let int2 = kind == VariantKind::Int2k;
    let half_steps = if int2 { 1.5f32 } else { 7.5 };
    let levels = 2.0 * half_steps + 1.0;
    let base = WEIGHT_SD * (12.0 / (levels * levels - 1.0)).sqrt();
    let (da, db) = if int2 { (10.0, 5.0) } else { (200.0, 100.0) };
    let (head, tail) = buf.split_at_mut(m.mins.start);
    let pair = [
        half::f16::from_f32(base / da),
        half::f16::from_f32(-half_steps * base / db),
    ];
    for p in tail[..m.mins.len()].chunks_exact_mut(4) {
        p[..2].copy_from_slice(&pair[0].to_le_bytes());
        p[2..].copy_from_slice(&pair[1].to_le_bytes());
    }
    fill_par(&mut head[m.scales.clone()], key, |r, c| match int2 {
        true => c
            .iter_mut()
            .for_each(|v| *v = (8 + (r.next() % 5) as u8) | (5 << 4)),
        false => {
            for ab in c.chunks_exact_mut(2) {
                ab[0] = 150 + (r.next() % 101) as u8;
                ab[1] = 100;
            }
        }
    });
}

const TAG_DENSE: u64 = 0x6465_6e73_6500_0000;
const TAG_EXPERT: u64 = 0x6578_7065_7274_0000;

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of a random stream: `seed` hashed with each of `parts` in turn.
fn stream(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |k, &p| mix(k ^ mix(p)))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// wyrand: one multiply per 64 random bits; plenty for random weights.
struct Rng(u64);

impl Rng {
    fn new(key: u64) -> Rng {
        Rng(key)
    }

    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        (t >> 64) as u64 ^ t as u64
    }
}

/// Fill `buf` in CHUNK-sized pieces in parallel, each from its own stream (`key`, chunk index).
fn fill_par(buf: &mut [u8], key: u64, f: impl Fn(&mut Rng, &mut [u8]) + Sync) {
    buf.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
        let mut r = Rng::new(stream(key, &[i as u64]));
        f(&mut r, c)
    });
}

fn fill_bytes(r: &mut Rng, c: &mut [u8]) {
    let mut it = c.chunks_exact_mut(8);
    for w in &mut it {
        w.copy_from_slice(&r.next().to_le_bytes());
    }
    let rest = it.into_remainder();
    let last = r.next().to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// 2-byte values from `table`, four per random number.
fn fill_u16(r: &mut Rng, c: &mut [u8], table: &[u16]) {
    let mut it = c.chunks_exact_mut(8);
    for w in &mut it {
        let x = r.next();
        for k in 0..4 {
            let v = table[(x >> (16 * k)) as usize & 0xffff];
            w[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    for w in it.into_remainder().chunks_exact_mut(2) {
        w.copy_from_slice(&table[r.next() as usize & 0xffff].to_le_bytes());
    }
}

/// 4-byte values from `table`, two per random number.
fn fill_f32(r: &mut Rng, c: &mut [u8], table: &[u32]) {
    let mut it = c.chunks_exact_mut(8);
    for w in &mut it {
        let x = r.next();
        w[..4].copy_from_slice(&table[x as usize & 0xffff].to_le_bytes());
        w[4..].copy_from_slice(&table[(x >> 16) as usize & 0xffff].to_le_bytes());
    }
    for w in it.into_remainder().chunks_exact_mut(4) {
        w.copy_from_slice(&table[r.next() as usize & 0xffff].to_le_bytes());
    }
}

/// 65 536 samples of N(0, WEIGHT_SD) as f16, bf16 and f32 bit patterns.
struct Tables {
    f16: Vec<u16>,
    bf16: Vec<u16>,
    f32: Vec<u32>,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        // Box-Muller from a fixed stream: the table is the same in every process.
        let mut r = Rng::new(stream(0x7461_626c_6500, &[]));
        let unit = |x: u64| ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let mut values = Vec::with_capacity(1 << 16);
        while values.len() < 1 << 16 {
            let (u1, u2) = (unit(r.next()), unit(r.next()));
            let rad = (-2.0 * u1.ln()).sqrt();
            let th = 2.0 * std::f64::consts::PI * u2;
            values.push((rad * th.cos()) as f32 * WEIGHT_SD);
            values.push((rad * th.sin()) as f32 * WEIGHT_SD);
        }
        Tables {
            f16: values
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect(),
            bf16: values
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect(),
            f32: values.iter().map(|v| v.to_bits()).collect(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_reference_shapes() {
        let m = SyntheticModel::preset("mixtral-8x7b").unwrap();
        let s = &m.spec;
        assert_eq!(
            (
                s.hidden,
                s.ffn,
                s.n_layers,
                s.n_heads,
                s.n_kv_heads,
                s.head_dim
            ),
            (4096, 14336, 32, 32, 8, 128)
        );
        assert_eq!((s.vocab, s.n_experts, s.n_experts_used), (32000, 8, 2));
        assert_eq!(
            (s.rope_theta, s.rms_eps, s.context_length),
            (1e6, 1e-5, 32768)
        );
        let p = SyntheticModel::preset("phi-3.5-moe").unwrap().spec;
        assert_eq!(
            (p.hidden, p.ffn, p.vocab, p.n_experts),
            (4096, 6400, 32064, 16)
        );
        let q = SyntheticModel::preset("qwen3-30b-a3b").unwrap().spec;
        assert_eq!(
            (
                q.hidden,
                q.ffn,
                q.n_layers,
                q.n_heads,
                q.n_kv_heads,
                q.head_dim
            ),
            (2048, 768, 48, 32, 4, 128)
        );
        assert_eq!((q.vocab, q.n_experts, q.n_experts_used), (151936, 128, 8));
        let q15 = SyntheticModel::preset("qwen1.5-moe-a2.7b").unwrap();
        assert_eq!(
            (
                q15.spec.hidden,
                q15.spec.ffn,
                q15.spec.n_experts,
                q15.spec.n_experts_used
            ),
            (2048, 1408, 60, 4)
        );
        // Each in its own architecture, with its family's tensors.
        let names = |m: &SyntheticModel| -> Vec<String> {
            m.dense_tensors().into_iter().map(|t| t.hob_name).collect()
        };
        assert_eq!(q15.arch_name(), "qwen2moe");
        assert!(names(&q15).iter().any(|n| n.contains("shexp")));
        let phi = SyntheticModel::preset("phi-3.5-moe").unwrap();
        assert_eq!(phi.arch_name(), "phimoe");
        assert!(names(&phi).iter().any(|n| n == keys::OUTPUT_BIAS));
        let oss = SyntheticModel::preset("gpt-oss-120b").unwrap();
        assert_eq!(oss.arch_name(), "gpt-oss");
        assert_eq!((oss.spec.n_layers, oss.spec.n_experts), (36, 128));
        assert!(names(&oss).iter().any(|n| n.ends_with(keys::ATTN_SINKS)));
        let ds = SyntheticModel::preset("deepseek-v2-lite").unwrap();
        assert_eq!(ds.arch_name(), "deepseek2");
        assert_eq!((ds.spec.n_experts, ds.spec.n_experts_used), (64, 6));
        assert!(names(&ds).iter().any(|n| n.ends_with(keys::ATTN_K_B)));
        let flash = SyntheticModel::preset("glm-4.7-flash").unwrap();
        assert_eq!((flash.arch_name(), flash.spec.n_layers), ("deepseek2", 47));
        assert!(names(&flash)
            .iter()
            .any(|n| n.ends_with(keys::FFN_EXP_PROBS_B)));
        let glm = SyntheticModel::preset("glm-4.5-air").unwrap();
        assert_eq!(glm.arch_name(), "glm4moe");
        // The dense first layer has an MLP and no router; the expert table skips it.
        assert!(names(&glm).iter().any(|n| n == "blk.0.ffn_gate.weight"));
        assert!(!names(&glm).iter().any(|n| n == "blk.0.ffn_gate_inp.weight"));
        assert!(names(&glm).iter().any(|n| n == "blk.1.exp_probs_b.bias"));
        assert_eq!(glm.expert_shape().n_layers, 45);
        let e = SyntheticModel::preset("llama").unwrap_err();
        assert!(
            e.contains(
                "mixtral-8x7b, phi-3.5-moe, qwen3-30b-a3b, qwen1.5-moe-a2.7b, olmoe-1b-7b, \
                 gpt-oss-20b, gpt-oss-120b, glm-4.5-air"
            ),
            "{e}"
        );
    }

    #[test]
    fn layers_are_validated_and_named() {
        let m = SyntheticModel::preset("phi-3.5-moe").unwrap();
        assert!(m.clone().with_layers(0).unwrap_err().contains("1..=32"));
        assert!(m.clone().with_layers(33).unwrap_err().contains("32 layers"));
        let cut = m.clone().with_layers(8).unwrap();
        assert_eq!(cut.spec.n_layers, 8);
        assert_eq!(cut.display_name(), "synthetic phi-3.5-moe (8 of 32 layers)");
        assert_eq!(m.display_name(), "synthetic phi-3.5-moe");
        assert_eq!(m.arch_name(), "phimoe");
        let mx = SyntheticModel::preset("mixtral-8x7b").unwrap();
        assert_eq!(mx.display_name(), "synthetic mixtral-8x7b");
        // Written as its own architecture: no "mixtral routing" note.
        let q = SyntheticModel::preset("qwen3-30b-a3b").unwrap();
        assert_eq!(q.display_name(), "synthetic qwen3-30b-a3b");
        assert_eq!(q.arch().hob_name(), "qwen3moe");
    }

    #[test]
    fn streams_differ_and_repeat() {
        assert_eq!(stream(1, &[2, 3]), stream(1, &[2, 3]));
        assert_ne!(stream(1, &[2, 3]), stream(1, &[3, 2]));
        assert_ne!(stream(1, &[2]), stream(2, &[2]));
        let t = tables();
        let mean = t.f32.iter().map(|&b| f32::from_bits(b) as f64).sum::<f64>() / 65536.0;
        let sd = (t
            .f32
            .iter()
            .map(|&b| (f32::from_bits(b) as f64 - mean).powi(2))
            .sum::<f64>()
            / 65535.0)
            .sqrt();
        assert!(mean.abs() < 1e-3 && (sd - 0.02).abs() < 1e-3, "{mean} {sd}");
    }
}
