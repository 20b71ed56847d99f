//! `hob convert --from x.gguf` (issue 51, item 1) against `hob convert --from <fixture dir>`: the
//! same logits for the same token ids on the CPU, and errors that name the file and the key or
//! tensor.
//!
//! The Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral, GLM-4.5 and gpt-oss GGUFs in
//! tests/fixtures/gguf-convert are written by llama.cpp's own convert_hf_to_gguf.py
//! (llama-cpp-python 0.3.36's tree, F16, gpt-oss's MXFP4 experts kept as GGUF MXFP4; through
//! tools/llamacpp_convert_fixture.py, which only names the fixtures' GPT-2-style pre-tokenizer)
//! and tiny-mixtral-q8_0.gguf by its llama-quantize; the per-expert Mixtral layout and
//! Phi-3.5-MoE, which that converter does not write, by tools/make_gguf_from_fixture.py.

mod common;

use std::path::{Path, PathBuf};

use common::{convert_dir, family_dir, hob, nmse, reference_ids, reference_in};
use hob::backend::cpu::CpuBackend;
use hob::experts::DirectExperts;
use hob::format::{keys, HobFile, MetaValue};
use hob::model::{Logits, Model};

fn gguf(name: &str) -> PathBuf {
    common::paths::repo_root()
        .join("tests/fixtures/gguf-convert")
        .join(format!("{name}.gguf"))
}

/// Prefill logits at every position, f16 experts.
fn logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    logits_ctx(path, ids, 128)
}

/// Prefill logits at every position in a context of `ctx` tokens, f16 experts.
fn logits_ctx(path: &Path, ids: &[u32], ctx: usize) -> Vec<f32> {
    let file = HobFile::open(path).unwrap();
    let model = Model::load(&file).unwrap();
    let backend = CpuBackend::new(2).unwrap();
    let mut experts = DirectExperts::new(&file, 0).unwrap();
    let mut st = model.new_state(&backend, ctx).unwrap();
    model
        .forward(&mut st, ids, &backend, &mut experts, Logits::All)
        .unwrap()
        .to_vec()
}

/// Convert the fixture `family` from its directory and from `gguf_name`; the NMSE between the
/// two files' logits, and the GGUF-converted file.
fn compare(family: &str, gguf_name: &str) -> (f64, tempfile::TempDir, PathBuf) {
    let dir = family_dir(family);
    let ids = reference_in(&dir).input_ids;
    let (_hf_tmp, hf) = convert_dir(&dir, "f16", &[]);
    let (tmp, from_gguf) = convert_dir(&gguf(gguf_name), "f16", &[]);
    let (a, b) = (logits(&from_gguf, &ids), logits(&hf, &ids));
    let e = nmse(&a, &b);
    println!("{gguf_name}: NMSE {e:.3e} against the Hugging Face directory");
    (e, tmp, from_gguf)
}

fn meta_str(file: &HobFile, key: &str) -> Option<String> {
    match file.metadata().get(key) {
        Some(MetaValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

#[test]
fn qwen3_moe_gguf_matches_the_directory() {
    let (e, _tmp, path) = compare("qwen3-moe", "tiny-qwen3-moe");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&path).unwrap();
    assert_eq!(
        meta_str(&file, keys::ARCHITECTURE).as_deref(),
        Some("qwen3moe")
    );
    assert_eq!(
        meta_str(&file, keys::NAME).as_deref(),
        Some("Tiny Qwen3 Moe")
    );
    assert_eq!(meta_str(&file, keys::SOURCE_DTYPE).as_deref(), Some("f16"));
    // The tokenizer itself: tests/gguf_tokenizer.rs.
    assert!(file.metadata().get(keys::TOKENIZER_HF_JSON).is_some());
    assert_eq!(
        file.metadata().get(keys::EOS_TOKEN_ID),
        Some(&MetaValue::U32(2))
    );
}

#[test]
fn qwen2_moe_gguf_with_biases_and_shared_expert_matches() {
    let (e, _tmp, path) = compare("qwen2-moe", "tiny-qwen2-moe");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&path).unwrap();
    let key = keys::arch_key("qwen2moe", keys::EXPERT_SHARED_FEED_FORWARD_LENGTH);
    assert_eq!(file.metadata().get(&key), Some(&MetaValue::U32(48)));
}

#[test]
fn olmoe_gguf_matches_the_directory() {
    let (e, _tmp, _path) = compare("olmoe", "tiny-olmoe");
    assert!(e <= 1e-10, "NMSE {e}");
}

#[test]
fn mixtral_gguf_as_llama_is_unpermuted_and_matches() {
    let (e, _tmp, path) = compare("mixtral", "tiny-mixtral");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&path).unwrap();
    assert_eq!(
        meta_str(&file, keys::ARCHITECTURE).as_deref(),
        Some("mixtral")
    );
}

#[test]
fn mixtral_gguf_with_per_expert_tensors_matches() {
    let (e, _tmp, _path) = compare("mixtral", "tiny-mixtral-per-expert");
    assert!(e <= 1e-10, "NMSE {e}");
}

#[test]
fn mixtral_gguf_in_q8_0_is_close() {
    let (e, _tmp, path) = compare("mixtral", "tiny-mixtral-q8_0");
    // llama-quantize's Q8_0 (every matrix, embedding and output too) on a tiny random model:
    // 6.9e-4 seen.
    assert!(e <= 2e-3, "NMSE {e}");
    assert!(e > 0.0, "Q8_0 should not be exact");
    // Provenance for `hob inspect`: the file and its tensor types, experts and dense apart.
    let file = HobFile::open(&path).unwrap();
    let source = meta_str(&file, keys::SOURCE).unwrap();
    assert!(
        source.starts_with("GGUF tiny-mixtral-q8_0.gguf: experts Q8_0 x6; dense "),
        "{source}"
    );
    let (ok, stdout, _) = hob(&["inspect", path.to_str().unwrap()]);
    assert!(
        ok && stdout.contains(&format!("made from {source}")),
        "{stdout}"
    );
}

/// int8 from a Q8_0 GGUF takes the file's 32-value blocks as its groups (no --group-size): each
/// block's scale and codes, stored exactly (convert's error column reads 0).
#[test]
fn q8_0_experts_become_int8_g32_exactly() {
    let src = gguf("tiny-mixtral-q8_0");
    let (_tmp, _out, stdout) = common::convert_dir_stdout(&src, "int8", &["--dense", "int8"]);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("int8/g32"))
        .unwrap_or_else(|| panic!("no int8/g32 row:\n{stdout}"));
    assert_eq!(row.split_whitespace().last(), Some("0.000000"), "{row}");
}

/// `hob convert --from NAME.gguf` with no --experts / --dense: (its folder, the .hob, stdout).
fn convert_with_defaults(name: &str) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.hob");
    let src = gguf(name);
    let args = [
        "convert",
        "--from",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    let (ok, stdout, stderr) = hob(&args);
    assert!(ok, "{name}: {stdout}\n{stderr}");
    (dir, out, stdout)
}

/// Without --experts / --dense, a GGUF's own block types choose: Q8_0 experts as int8 (the high
/// precision) with int4 below, its quantized dense matrices as int8; an F16 file as from a
/// directory.
#[test]
fn a_gguf_picks_the_variants_that_hold_its_blocks() {
    for (name, want) in [
        ("tiny-mixtral-q8_0", "--experts int8,int4 --dense int8"),
        ("tiny-mixtral", "--experts f16,int4 --dense f16"),
        // MXFP4 kept as it is, int2 below it.
        ("tiny-gpt-oss-mxfp4", "--experts mxfp4,int2 --dense f16"),
    ] {
        let (_dir, out, stdout) = convert_with_defaults(name);
        assert!(
            stdout.contains(&format!("from the GGUF's block types: {want}")),
            "{name}: {stdout}"
        );
        let file = HobFile::open(&out).unwrap();
        let kinds: Vec<String> = file.variants().iter().map(|v| v.to_string()).collect();
        let expected: Vec<&str> = want.split_whitespace().nth(1).unwrap().split(',').collect();
        assert_eq!(kinds.len(), 2, "{name}: {kinds:?}");
        for (k, e) in kinds.iter().zip(expected) {
            assert!(k.starts_with(e), "{name}: {kinds:?}");
        }
    }
}

/// A GGUF's dense matrices in 4-bit blocks stay 4-bit by default (int4/g32 holds a Q4_0 block
/// on its own grid), the wider ones int8: tiny-mixtral-q4_0.gguf is llama-quantize's `Q4_0` of
/// tiny-mixtral.gguf with `--output-tensor-type q8_0 --token-embedding-type q8_0` (0.3.36 tree).
#[test]
fn a_gguf_keeps_its_4_bit_dense_matrices_in_4_bits() {
    let (_dir, out, stdout) = convert_with_defaults("tiny-mixtral-q4_0");
    assert!(
        stdout.contains(
            "--experts int4,int2 --dense int8 (int4/g32 for the 8 matrices in 4-bit blocks)"
        ),
        "{stdout}"
    );
    let file = HobFile::open(&out).unwrap();
    let mut seen = 0;
    for t in file.tensors() {
        let want = if t.name.contains(".attn_") && t.shape.len() == 2 {
            "int4/g32"
        } else if t.name == "token_embd.weight" || t.name == "output.weight" {
            "int8/g32"
        } else {
            continue; // norms and routers: f32
        };
        assert_eq!(t.dtype.to_string(), want, "{}", t.name);
        seen += 1;
    }
    assert_eq!(seen, 10);
}

/// Phi-3.5-MoE as `phimoe`: LongRoPE's factors come from llama.cpp's `rope_factors_*` tensors,
/// the original context from its key; the mscale is llama.cpp's `attn_factor` (its converter's
/// sqrt(1 + ln(256 / 128) / ln(128)) for this fixture, not config.json's short/long_mscale), so
/// the reference is the directory with config.json's mscales set to it. Within the original
/// context and past it (160 tokens in a context of 256: the long factors).
#[test]
fn phimoe_gguf_matches_the_directory_with_llama_cpp_attn_factor() {
    let dir = family_dir("phimoe");
    let (_gguf_tmp, from_gguf) = convert_dir(&gguf("tiny-phimoe"), "f16", &[]);
    let (_hf_tmp, hf_orig) = convert_dir(&dir, "f16", &[]);
    let (g, h) = (
        HobFile::open(&from_gguf).unwrap(),
        HobFile::open(&hf_orig).unwrap(),
    );
    let k = |key: &str| keys::arch_key("phimoe", key);
    assert_eq!(meta_str(&g, keys::ARCHITECTURE).as_deref(), Some("phimoe"));
    for key in [
        keys::ROPE_SCALING_ORIG_CTX,
        keys::ROPE_SHORT_FACTOR,
        keys::ROPE_LONG_FACTOR,
        keys::EXPERT_ROUTER_JITTER,
        keys::CONTEXT_LENGTH,
    ] {
        let key = k(key);
        assert!(g.metadata().get(&key).is_some(), "{key}");
        assert_eq!(g.metadata().get(&key), h.metadata().get(&key), "{key}");
    }
    let attn_factor = (1.0 + 2f64.ln() / 128f64.ln()).sqrt() as f32;
    for key in [keys::ROPE_SHORT_MSCALE, keys::ROPE_LONG_MSCALE] {
        assert_eq!(
            g.metadata().get(&k(key)),
            Some(&MetaValue::F32(attn_factor)),
            "{key}"
        );
    }
    // The directory with config.json's mscales replaced by llama.cpp's attn_factor.
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    let cfg_path = tmp.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    for key in ["short_mscale", "long_mscale"] {
        cfg["rope_parameters"][key] = serde_json::json!(attn_factor as f64);
    }
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let (_hf_tmp2, hf) = convert_dir(tmp.path(), "f16", &[]);
    let short_ids = reference_in(&dir).input_ids;
    let long_ids = reference_ids(&dir, "long_ids").unwrap();
    assert!(long_ids.len() > 128);
    for (ids, ctx) in [(&short_ids, 128), (&long_ids, 256)] {
        let e = nmse(
            &logits_ctx(&from_gguf, ids, ctx),
            &logits_ctx(&hf, ids, ctx),
        );
        println!(
            "tiny-phimoe: {} tokens, ctx {ctx}: NMSE {e:.3e} against the directory",
            ids.len()
        );
        assert!(e <= 1e-10, "NMSE {e} at ctx {ctx}");
    }
    // And the mscale matters: against the unmodified directory, the logits differ.
    let e = nmse(
        &logits_ctx(&from_gguf, &short_ids, 128),
        &logits_ctx(&hf_orig, &short_ids, 128),
    );
    assert!(
        e > 1e-8,
        "config.json's mscale and attn_factor gave the same logits: {e}"
    );
}

#[test]
fn convert_says_there_is_no_tokenizer() {
    // The file with its `tokenizer.ggml.model` key renamed: a GGUF without a tokenizer.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.hob");
    let mut bytes = std::fs::read(gguf("tiny-qwen3-moe")).unwrap();
    let (from, to) = (b"tokenizer.ggml.model", b"tokenizer.ggml.mode_");
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
    bytes[at..at + to.len()].copy_from_slice(to);
    let src = tmp.path().join("no-tokenizer.gguf");
    std::fs::write(&src, &bytes).unwrap();
    let (ok, stdout, stderr) = hob(&[
        "convert",
        "--from",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--experts",
        "f16",
        "--no-progress",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("no tokenizer"), "{stdout}");
}

/// `src` with the unique byte string `from` replaced by `to` (the same length), written to a
/// temporary file; convert it and return stderr (asserting failure) and the file's path.
fn convert_patched(src: &str, from: &[u8], to: &[u8]) -> (String, String) {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(gguf(src)).unwrap();
    let at: Vec<usize> = bytes
        .windows(from.len())
        .enumerate()
        .filter(|(_, w)| *w == from)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{}", String::from_utf8_lossy(from));
    bytes[at[0]..at[0] + to.len()].copy_from_slice(to);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(format!("{src}-patched.gguf"));
    std::fs::write(&path, &bytes).unwrap();
    let (ok, stderr, out) = convert_into(&tmp, &path);
    assert!(!ok, "converted a damaged file");
    assert!(!out.exists());
    (stderr, path.display().to_string())
}

/// `hob convert --from src` with f16 experts into `tmp`: (success, stderr, the output's path).
fn convert_into(tmp: &tempfile::TempDir, src: &Path) -> (bool, String, PathBuf) {
    let out = tmp.path().join("x.hob");
    let (ok, _, stderr) = hob(&[
        "convert",
        "--from",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--experts",
        "f16",
        "--no-progress",
    ]);
    (ok, stderr, out)
}

/// A string metadata value as GGUF stores it: key, type 8, length, bytes.
fn string_kv(key: &str, value: &str) -> Vec<u8> {
    let mut v = key.as_bytes().to_vec();
    v.extend(8u32.to_le_bytes());
    v.extend((value.len() as u64).to_le_bytes());
    v.extend(value.as_bytes());
    v
}

/// Non-finite values in an expert tensor (two f16 NaNs at values 5 and 9 of ffn_down_exps):
/// named with their count and the first, and nothing is written.
#[test]
fn non_finite_expert_values_are_counted_and_nothing_is_written() {
    let name = "blk.0.ffn_down_exps.weight";
    let src = gguf("tiny-mixtral");
    let file = hob::import::gguf::GgufFile::open(&src).unwrap();
    let info = file.tensors().iter().find(|t| t.name == name).unwrap();
    let at = info.file_range().start as usize;
    let mut bytes = std::fs::read(&src).unwrap();
    for i in [5, 9] {
        bytes[at + 2 * i..at + 2 * i + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("nan.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, stderr, out) = convert_into(&tmp, &path);
    assert!(!ok && !out.exists(), "{stderr}");
    assert!(
        stderr.contains(name) && stderr.contains("2 non-finite"),
        "{stderr}"
    );
    assert!(stderr.contains("first at element 5"), "{stderr}");
}

#[test]
fn an_unsupported_architecture_is_named_with_the_supported_ones() {
    let from = string_kv(keys::ARCHITECTURE, "qwen3moe");
    let to = string_kv(keys::ARCHITECTURE, "qwen3xyz");
    let (e, path) = convert_patched("tiny-qwen3-moe", &from, &to);
    assert!(e.contains(&path), "{e}");
    assert!(e.contains("'qwen3xyz' is not supported"), "{e}");
    assert!(e.contains("qwen3moe, qwen2moe, olmoe, llama"), "{e}");
    assert!(e.contains("phimoe, gpt-oss, glm4moe"), "{e}");
}

#[test]
fn llama_without_experts_is_refused() {
    let (e, path) = convert_patched("tiny-mixtral", b"llama.expert_count", b"llama.expert_coun_");
    assert!(e.contains(&path), "{e}");
    assert!(e.contains("llama without experts"), "{e}");
}

#[test]
fn a_missing_key_is_named() {
    // The `llama` file read as `olmoe`: none of its keys are there.
    let from = string_kv(keys::ARCHITECTURE, "llama");
    let to = string_kv(keys::ARCHITECTURE, "olmoe");
    let (e, path) = convert_patched("tiny-mixtral", &from, &to);
    assert!(e.contains(&path), "{e}");
    assert!(e.contains("olmoe.embedding_length"), "{e}");
    assert!(e.contains("missing"), "{e}");
}

#[test]
fn an_ill_typed_key_is_named() {
    // llama.expert_used_count: u32 (type 4) -> f32 (type 6), the same four bytes.
    let key = b"llama.expert_used_count";
    let (from, to) = (
        [key.as_slice(), &4u32.to_le_bytes()].concat(),
        [key.as_slice(), &6u32.to_le_bytes()].concat(),
    );
    let (e, path) = convert_patched("tiny-mixtral", &from, &to);
    assert!(e.contains(&path), "{e}");
    assert!(
        e.contains("field 'llama.expert_used_count': expected an unsigned integer"),
        "{e}"
    );
}

#[test]
fn a_missing_tensor_is_named() {
    let (e, path) = convert_patched(
        "tiny-qwen3-moe",
        b"blk.1.attn_k_norm.weight",
        b"blk.1.attn_k_nor_.weight",
    );
    assert!(e.contains(&path), "{e}");
    assert!(
        e.contains("tensor 'blk.1.attn_k_norm.weight' not found"),
        "{e}"
    );
}

#[test]
fn a_wrong_dim_is_named() {
    // output_norm.weight: name, n_dims 1, ne[0] 64 -> 32.
    let name = b"output_norm.weight";
    let info = |d: u64| [name.as_slice(), &1u32.to_le_bytes(), &d.to_le_bytes()].concat();
    let (e, path) = convert_patched("tiny-mixtral", &info(64), &info(32));
    assert!(e.contains(&path), "{e}");
    assert!(
        e.contains("tensor 'output_norm.weight'") && e.contains("expected shape [64], found [32]"),
        "{e}"
    );
}

#[test]
fn a_wrong_expert_dim_is_named() {
    // blk.0.ffn_down_exps.weight: ne [128, 64, 4] -> [128, 64, 2] (the expert count).
    let name = b"blk.0.ffn_down_exps.weight";
    let info = |n: u64| {
        let dims = [128u64, 64, n].map(u64::to_le_bytes).concat();
        [name.as_slice(), &3u32.to_le_bytes(), &dims].concat()
    };
    let (e, path) = convert_patched("tiny-mixtral", &info(4), &info(2));
    assert!(e.contains(&path), "{e}");
    assert!(
        e.contains("tensor 'blk.0.ffn_down_exps.weight'")
            && e.contains("expected shape [4, 64, 128], found [2, 64, 128]"),
        "{e}"
    );
}

/// GLM-4.5 from llama.cpp's converter: the next-token-prediction layer counted in block_count,
/// post_attention_norm, the dense first layer, shared experts, exp_probs_b, partial rotary in
/// NEOX order (reordered here as from the directory), QK-norm found by its tensors.
#[test]
fn glm4_moe_gguf_matches_the_directory() {
    let (e, _tmp, path) = compare("glm4-moe", "tiny-glm4-moe");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    assert_eq!((model.cfg.n_layers, model.cfg.dense_layers), (3, 1));
    assert_eq!((model.cfg.rope_dim, file.n_layers()), (16, 2));
}

/// DeepSeek-V2 from llama.cpp's converter: MLA as one 40-wide KV head, k_b / v_b split per head
/// (3-D there), the checkpoint's interleaved RoPE rows, YaRN with its log multiplier, a dense
/// first layer, two shared experts scaled by 1.5.
#[test]
fn deepseek_v2_gguf_matches_the_directory() {
    let (e, _tmp, path) = compare("deepseek-v2", "tiny-deepseek-v2");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let mla = model.cfg.mla.unwrap();
    assert_eq!((mla.kv_lora, mla.nope, mla.rope, mla.v), (32, 16, 8, 16));
    assert_eq!((model.cfg.dense_layers, file.n_layers()), (1, 2));
    // `hob inspect`: the latent rows once (3 layers x (32 + 8) f16), against full keys and
    // values (4 heads x (16 + 8 + 16)).
    let (ok, stdout, stderr) = hob(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let kv = &j["kv_cache"];
    assert_eq!(
        (kv["bytes_per_token"].as_u64(), kv["layers"].as_u64()),
        (Some(240), Some(3))
    );
    assert_eq!(kv["full_kv_bytes_per_token"].as_u64(), Some(960));
}

/// gpt-oss with MXFP4 experts from llama.cpp's converter (which keeps the hub's blocks as GGUF
/// MXFP4): against the MXFP4 directory with llama.cpp's SwiGLU limit (7, which the GGUF does
/// not carry and llama.cpp hard-codes; the fixture's is 1.5).
#[test]
fn gpt_oss_mxfp4_gguf_matches_the_directory_with_llama_cpp_swiglu_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dir = family_dir("gpt-oss-mxfp4");
    common::copy_checkpoint(&dir, &src);
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["swiglu_limit"] = serde_json::json!(7.0);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let ids = reference_in(&dir).input_ids;
    let (_hf_tmp, hf) = convert_dir(&src, "f16", &[]);
    let (_gguf_tmp, from_gguf) = convert_dir(&gguf("tiny-gpt-oss-mxfp4"), "f16", &[]);
    let e = nmse(&logits(&from_gguf, &ids), &logits(&hf, &ids));
    println!("tiny-gpt-oss-mxfp4: NMSE {e:.3e} against the directory");
    assert!(e <= 1e-10, "NMSE {e}");
    let file = HobFile::open(&from_gguf).unwrap();
    let source = meta_str(&file, keys::SOURCE).unwrap();
    assert!(source.contains("experts MXFP4 x6"), "{source}");

    // Kept as MXFP4: ggml's blocks repacked are byte for byte the directory's blocks.
    let (_a, hf_mx) = convert_dir(&src, "mxfp4", &[]);
    let (_b, gguf_mx) = convert_dir(&gguf("tiny-gpt-oss-mxfp4"), "mxfp4", &[]);
    let e = nmse(&logits(&gguf_mx, &ids), &logits(&hf_mx, &ids));
    assert!(e <= 1e-10, "mxfp4 experts: NMSE {e}");
    let (a, b) = (
        HobFile::open(&hf_mx).unwrap(),
        HobFile::open(&gguf_mx).unwrap(),
    );
    for layer in 0..a.n_layers() {
        for expert in 0..a.n_experts() {
            let (sa, sb) = (
                a.expert_span(layer, expert, 0),
                b.expert_span(layer, expert, 0),
            );
            let bytes =
                |f: &HobFile, (o, n): (u64, u64)| f.bytes()[o as usize..(o + n) as usize].to_vec();
            assert!(
                bytes(&a, sa) == bytes(&b, sb),
                "layer {layer} expert {expert}"
            );
        }
    }
}

/// Found by the gguf_reader fuzz target (an out-of-memory input): a header claiming 64000 layers
/// had convert list every expected tensor name (tens of millions, over 4 GB) before finding the
/// first one missing. The layer count is now refused against the file's tensor count, and expected
/// tensors are checked as they are named, so a large expert count fails at its first missing one.
#[test]
fn fuzz_oom_a_block_count_past_the_tensors_is_refused_before_anything_is_sized() {
    let kv = |key: &[u8], v: u32| [key, &4u32.to_le_bytes(), &v.to_le_bytes()].concat();
    let key = b"llama.block_count";
    let (e, path) = convert_patched("tiny-mixtral-per-expert", &kv(key, 2), &kv(key, 64000));
    assert!(e.contains(&path), "{e}");
    assert!(
        e.contains("field 'llama.block_count': expected 1 to ") && e.contains("64000"),
        "{e}"
    );
    let key = b"llama.expert_count";
    let (e, _) = convert_patched("tiny-mixtral-per-expert", &kv(key, 4), &kv(key, 1 << 30));
    assert!(
        e.contains("blk.0.ffn_gate_inp.weight") && e.contains("expected shape [1073741824, 64]"),
        "{e}"
    );
}

/// A GGUF file under another name (fuzz artifacts, `model.bin`) is known by its magic, not taken
/// for a checkpoint directory.
#[test]
fn a_gguf_without_the_extension_is_read_as_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.bin");
    std::fs::copy(gguf("tiny-mixtral"), &src).unwrap();
    let (ok, stderr, out) = convert_into(&tmp, &src);
    assert!(ok && out.exists(), "{stderr}");
}

/// A file that is neither a directory nor GGUF is named as such, with what `--from` takes.
#[test]
fn a_file_that_is_not_gguf_says_what_from_takes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.bin");
    std::fs::write(&src, b"not a model").unwrap();
    let (ok, stderr, out) = convert_into(&tmp, &src);
    assert!(!ok && !out.exists());
    assert!(
        stderr.contains("model.bin") && stderr.contains("not GGUF (no GGUF magic)"),
        "{stderr}"
    );
}
