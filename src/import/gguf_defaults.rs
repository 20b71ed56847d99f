//! What `hob convert --from x.gguf` stores when `--experts` / `--dense` name nothing: hob's
//! narrowest widths that hold the file's own blocks on their grids (a Q4_K sub-block in int4/g32,
//! a Q8_0 or Q5_0 block in int8/g32), so the .hob stays near the GGUF's size and its values
//! (benches/results/2026-12-02-cpu-issue51-gguf-quality.md).

use super::ggml::GgmlType;
use super::gguf::GgufTensorInfo;

/// Whether a GGUF tensor holds experts: merged (`blk.N.ffn_gate_exps.weight`) or llama's older
/// per-expert form (`blk.N.ffn_gate.E.weight`).
pub fn is_expert_tensor(name: &str) -> bool {
    name.contains("_exps.")
        || ["ffn_gate.", "ffn_up.", "ffn_down."].iter().any(|p| {
            name.split_once(p)
                .is_some_and(|(_, rest)| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
}

fn is_float(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64
    )
}

/// Codes of at most 4 bits (Q4_0, Q4_1, Q4_K and the 2-3-bit types: at most 5 bits a weight with
/// their scales): int4 holds them; wider codes need int8.
fn fits_int4(t: GgmlType) -> bool {
    (t.type_size() * 8) as f64 / t.block_size() as f64 <= 5.0
}

/// The expert variants (high, then low) for the width that holds most of the file's expert
/// values: f16 + int4 for float experts, int8 + int4 for 5-8-bit blocks, int4 + int2 for 4-bit
/// and narrower ones (Q4_K_M: its Q4_K gate and up outweigh the Q6_K downs), and MXFP4 kept as
/// it is with int2 below it (int4/g64's 4.5 bits would be wider than MXFP4's 4.25).
pub fn default_experts(tensors: &[GgufTensorInfo]) -> &'static str {
    let (mut float, mut narrow, mut wide, mut mx) = (0u64, 0u64, 0u64, 0u64);
    for t in tensors.iter().filter(|t| is_expert_tensor(&t.name)) {
        let n = t.n_elements();
        match t.ggml_type {
            ty if is_float(ty) => float += n,
            GgmlType::MXFP4 => mx += n,
            ty if fits_int4(ty) => narrow += n,
            _ => wide += n,
        }
    }
    if mx > float.max(narrow).max(wide) {
        "mxfp4,int2"
    } else if float >= narrow.max(wide) {
        "f16,int4"
    } else if narrow >= wide {
        "int4,int2"
    } else {
        "int8,int4"
    }
}

/// Whether a dense tensor named `name` in the file is in 4-bit blocks of 32-value (sub-)blocks,
/// Q4_0, Q4_1 or Q4_K, which int4/g32 holds on their own grid: the default stores it so, beside
/// `default_dense`'s int8, as llama.cpp reads it (Q4_K_M's attention in 4 bits, its Q6_K output
/// head in 8); int8 doubled those bytes. (Q2_K's and Q3_K's 16-value sub-blocks stay int8.)
pub fn narrow_dense(tensors: &[GgufTensorInfo], name: &str) -> bool {
    tensors.iter().find(|t| t.name == name).is_some_and(|t| {
        matches!(
            t.ggml_type,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K
        ) && t.dims[0] % 32 == 0
    })
}

/// `--dense` for a file whose dense matrices are quantized: int8 (holds Q8_0 and Q5_0 blocks
/// exactly, the K-quants within 0.5% RMS); None (the source dtype) when they are floats, or when
/// a float matrix beside them has rows that 32-value groups do not divide.
pub fn default_dense(tensors: &[GgufTensorInfo]) -> Option<&'static str> {
    let matrices = || {
        tensors
            .iter()
            .filter(|t| !is_expert_tensor(&t.name) && t.dims.len() >= 2)
    };
    let quantized = matrices().any(|t| !is_float(t.ggml_type));
    let groups_fit = matrices().all(|t| t.dims[0] % 32 == 0);
    (quantized && groups_fit).then_some("int8")
}
