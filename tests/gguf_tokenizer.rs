//! The tokenizer and chat template from a GGUF alone (issue 51, item 2): for each fixture, the
//! tokenizer.json rebuilt from its GGUF's `tokenizer.ggml.*` keys (src/import/gguf_tokenizer.rs)
//! encodes a corpus (English, multilingual with CJK and emoji, code with tabs and whitespace runs,
//! special tokens, leading spaces, the empty string) to exactly the ids of the fixture's own
//! tokenizer.json under Hugging Face's `tokenizers` crate (the reference), and decodes them back
//! to the same text; `hob convert --from x.gguf` then writes the tokenizer keys the Hugging Face
//! directory's conversion writes, and `hob run -p` (chat template included) answers as it does.
//!
//! The GGUFs are written by tools/make_gguf_from_fixture.py the way llama.cpp's
//! convert_hf_to_gguf.py writes these vocabularies (`gpt2` for the tiny byte-level fixtures,
//! `llama` for tests/fixtures/mistral, whose piece scores are reconstructed: see the script).
//!
//! And the same corpus gives llama.cpp's own ids: `llama-tokenize` (llama-cpp-python 0.3.36's
//! tree) on these GGUFs, recorded in tests/fixtures/gguf-convert/llama-tokenize-ids.json by
//! tools/llamacpp_tokenize_ids.py. The byte-level GGUFs there are written by llama.cpp's
//! convert_hf_to_gguf.py itself (tools/llamacpp_convert_fixture.py). Still to do: real GGUFs
//! (Qwen3-MoE, OLMoE, Mixtral) through the same comparison.

mod common;

use std::path::PathBuf;

use common::{convert_dir, hob};
use hob::format::{keys, MetaValue, Metadata};
use hob::import::gguf::GgufFile;
use hob::import::gguf_tokenizer::{tokenizer_from_gguf, PRE};
use hob::import::TokenizerFiles;

const CORPUS: &[&str] = &[
    "",
    "Hello world",
    " Hello world",
    "   leading spaces and trailing   ",
    "The quick brown fox jumps over the lazy dog. It's 3.14159, isn't it? I'll see; we'd've.",
    "Grüße aus Köln! Ça va? ¿Qué tal? Ελληνικά, русский текст, עברית, العربية",
    "我想在apple工作1314151天～ 日本語のテキスト、한국어 문장。",
    "emoji 🚀🦙 😶\u{200d}🌫️ ✅ 👍🏽 and e\u{301} (a decomposed é)",
    "fn main() {\n\tlet x = vec![1, 2, 3];\n\t\tif x.len() > 2 { println!(\"{x:?}\"); }\n}\n",
    "def f(a,  b):\n    return a  +   b\n\n\n    \n",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "3 33 333 3333 33333 3.3 3..3 ------======= ''''''```````\"\"\"\"......!!!!!!??????",
];

fn root() -> PathBuf {
    common::paths::repo_root()
}

fn gguf(name: &str) -> PathBuf {
    root().join(format!("tests/fixtures/gguf-convert/{name}.gguf"))
}

fn metadata(name: &str) -> Metadata {
    GgufFile::open(&gguf(name)).unwrap().metadata().clone()
}

fn rebuilt(name: &str, meta: &Metadata) -> TokenizerFiles {
    tokenizer_from_gguf(&gguf(name), meta, None)
        .unwrap()
        .expect("the GGUF has a tokenizer")
}

fn load(json: &str) -> tokenizers::Tokenizer {
    json.parse().unwrap()
}

/// The corpus and the special tokens of `specials` written into text.
fn texts(specials: &[&str]) -> Vec<String> {
    let with_specials = specials
        .iter()
        .map(|s| format!("{s}user\nHi there{s} {s}\n\t{s}x"));
    CORPUS
        .iter()
        .map(|t| t.to_string())
        .chain(with_specials)
        .collect()
}

/// The GGUFs compared with llama-tokenize, and their special tokens.
const LLAMA_CPP: [(&str, &[&str]); 6] = [
    ("tiny-qwen3-moe", &["<|im_start|>", "<|im_end|>", "<think>"]),
    ("tiny-qwen2-moe", &["<|im_start|>", "<|endoftext|>"]),
    ("tiny-olmoe", &["<|im_start|>", "<|im_end|>"]),
    ("tiny-mixtral", &["<s>", "</s>"]),
    ("mistral-tokenizer", &["<s>", "</s>"]),
    // SmolLM2's real tokenizer (the demo model's), `smollm` pre-tokenizer: convert_hf_to_gguf.py
    // --vocab-only on it, unchanged.
    ("smollm2-tokenizer", &["<|im_start|>", "<|im_end|>"]),
];

/// The tokenizer rebuilt from each GGUF gives llama.cpp's ids for every text, special tokens
/// parsed, no BOS. The corpus goes to target/tokenizer-corpus.json first: the input of
/// tools/llamacpp_tokenize_ids.py when the corpus or the list changes and the ids are recorded
/// again.
#[test]
fn gguf_tokenizers_give_llama_cpps_ids() {
    let corpus: serde_json::Map<String, serde_json::Value> = LLAMA_CPP
        .iter()
        .map(|(name, specials)| (format!("{name}.gguf"), serde_json::json!(texts(specials))))
        .collect();
    std::fs::create_dir_all(root().join("target")).unwrap();
    let written = root().join("target/tokenizer-corpus.json");
    std::fs::write(&written, serde_json::to_string_pretty(&corpus).unwrap()).unwrap();
    let path = root().join("tests/fixtures/gguf-convert/llama-tokenize-ids.json");
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (name, specials) in LLAMA_CPP {
        let rows = recorded[format!("{name}.gguf")].as_array().unwrap();
        let want_texts = texts(specials);
        let got_texts: Vec<&str> = rows.iter().map(|r| r["text"].as_str().unwrap()).collect();
        assert_eq!(
            got_texts, want_texts,
            "{name}: the recorded corpus is this test's"
        );
        let tok = load(&rebuilt(name, &metadata(name)).json);
        for row in rows {
            let text = row["text"].as_str().unwrap();
            let want: Vec<u32> = row["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(text, false).unwrap();
            assert_eq!(got.get_ids(), want.as_slice(), "{name}: {text:?}");
        }
    }
}

/// Every corpus text (and the special tokens of `specials` written into text) encodes to the
/// reference's ids, and both decode those ids to the same text.
fn same_ids(ours: &tokenizers::Tokenizer, reference: &tokenizers::Tokenizer, specials: &[&str]) {
    for text in texts(specials).iter().map(String::as_str) {
        let want = reference.encode(text, false).unwrap();
        let got = ours.encode(text, false).unwrap();
        assert_eq!(got.get_ids(), want.get_ids(), "{text:?}");
        let decoded = ours.decode(got.get_ids(), false).unwrap();
        assert_eq!(
            decoded,
            reference.decode(want.get_ids(), false).unwrap(),
            "{text:?}"
        );
        let with_special = (
            ours.encode(text, true).unwrap(),
            reference.encode(text, true).unwrap(),
        );
        if !text.is_empty() && reference.get_post_processor().is_some() {
            assert_eq!(
                with_special.0.get_ids(),
                with_special.1.get_ids(),
                "{text:?}"
            );
        }
    }
}

/// A tiny byte-level fixture: ids as its tokenizer.json gives them, and the tokenizer facts
/// (BOS, EOS, add_bos, stop ids, chat template) as the directory's conversion reads them.
fn byte_level(family: &str, specials: &[&str]) {
    let name = format!("tiny-{family}");
    let dir = root().join("tests/fixtures").join(&name);
    let ours = rebuilt(&name, &metadata(&name));
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tok = load(&ours.json);
    same_ids(&tok, &reference, specials);
    // A plain text round-trips exactly through byte-level BPE.
    for text in CORPUS {
        let ids = tok.encode(*text, false).unwrap();
        assert_eq!(tok.decode(ids.get_ids(), false).unwrap(), *text);
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let id = |k: &str| config.get(k).and_then(|v| v.as_u64()).map(|v| v as u32);
    let hf = TokenizerFiles::open(&dir, (id("bos_token_id"), id("eos_token_id"))).unwrap();
    assert_eq!(ours.bos_id, hf.bos_id, "{name}: BOS");
    assert_eq!(ours.eos_id, hf.eos_id, "{name}: EOS");
    assert_eq!(ours.add_bos, hf.add_bos, "{name}: add_bos");
    assert_eq!(
        ours.chat_template, hf.chat_template,
        "{name}: chat template"
    );
    let (mut a, mut b) = (ours.stop_ids.clone(), hf.stop_ids.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "{name}: stop ids");
}

#[test]
fn qwen3_moe_gguf_tokenizer_matches_hugging_face() {
    byte_level("qwen3-moe", &["<|im_start|>", "<|im_end|>", "<think>"]);
}

#[test]
fn qwen2_moe_gguf_tokenizer_matches_hugging_face() {
    byte_level("qwen2-moe", &["<|im_start|>", "<|endoftext|>"]);
}

#[test]
fn olmoe_gguf_tokenizer_with_pre_olmo_matches_hugging_face() {
    assert_eq!(
        metadata("tiny-olmoe").get(PRE),
        Some(&MetaValue::String("olmo".into()))
    );
    byte_level("olmoe", &["<|im_start|>", "<|im_end|>"]);
}

#[test]
fn mixtral_gguf_byte_level_tokenizer_with_bos_matches_hugging_face() {
    byte_level("mixtral", &["<s>", "</s>"]);
    let ours = rebuilt("tiny-mixtral", &metadata("tiny-mixtral"));
    assert!(ours.add_bos);
    let tok = load(&ours.json);
    let plain = tok.encode("Hello", false).unwrap().get_ids().to_vec();
    let with_bos = tok.encode("Hello", true).unwrap().get_ids().to_vec();
    assert_eq!(with_bos, [&[1], plain.as_slice()].concat());
}

/// `tokenizer.ggml.pre` = "qwen2": the pre-tokenizer and NFC normalizer of Qwen2/Qwen3's
/// tokenizer.json. The reference is the tiny vocabulary under Qwen2's own pre-tokenizer, as
/// Qwen2.5's tokenizer.json writes it (copied here, not built by hob).
#[test]
fn pre_qwen2_matches_qwens_pre_tokenizer() {
    let mut meta = metadata("tiny-qwen3-moe");
    meta.set(PRE, MetaValue::String("qwen2".into()));
    let ours = load(&rebuilt("tiny-qwen3-moe", &meta).json);
    let path = root().join("tests/fixtures/tiny-qwen3-moe/tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json["normalizer"] = serde_json::json!({"type": "NFC"});
    json["pre_tokenizer"] = serde_json::from_str(QWEN2_PRE).unwrap();
    let reference = load(&json.to_string());
    same_ids(&ours, &reference, &["<|im_start|>", "<|im_end|>"]);
    // Qwen2's regex splits digits one by one where GPT-2's keeps runs.
    let gpt2 = load(&rebuilt("tiny-qwen3-moe", &metadata("tiny-qwen3-moe")).json);
    let text = "x 12345 e\u{301}";
    assert_ne!(
        ours.encode(text, false).unwrap().get_ids(),
        gpt2.encode(text, false).unwrap().get_ids()
    );
}

const QWEN2_PRE: &str = r#"{
    "type": "Sequence",
    "pretokenizers": [
      {
        "type": "Split",
        "pattern": {
          "Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        },
        "behavior": "Isolated",
        "invert": false
      },
      {
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false
      }
    ]
  }"#;

/// tests/fixtures/mistral (Mistral's 32,000-token SentencePiece BPE): the same merges in the
/// same order as its tokenizer.json, the same ids, BOS added by the post-processor.
#[test]
fn mistral_sentencepiece_gguf_tokenizer_matches_hugging_face() {
    let ours = rebuilt("mistral-tokenizer", &metadata("mistral-tokenizer"));
    let path = root().join("tests/fixtures/mistral/tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let reference = load(&text);
    let tok = load(&ours.json);
    same_ids(&tok, &reference, &["<s>", "</s>", "[INST]"]);
    let want: serde_json::Value = serde_json::from_str(&text).unwrap();
    let got: serde_json::Value = serde_json::from_str(&ours.json).unwrap();
    let want_merges: Vec<String> = want["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    let got_merges: Vec<String> = got["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect();
    assert_eq!(got_merges.len(), want_merges.len());
    assert!(got_merges == want_merges, "merges differ");
    assert_eq!(tok.encode("Hello", true).unwrap().get_ids(), [1, 22557]);
    assert_eq!(
        (ours.bos_id, ours.eos_id, ours.add_bos),
        (Some(1), Some(2), true)
    );
    assert_eq!(ours.stop_ids, [2]);
    let jinja = root().join("tests/fixtures/mistral/chat_template.jinja");
    assert_eq!(
        ours.chat_template.as_deref(),
        Some(std::fs::read_to_string(jinja).unwrap().as_str())
    );
    // Byte fallback: a character outside the vocabulary becomes its UTF-8 bytes.
    let ids = tok.encode("𝔘", false).unwrap().get_ids().to_vec();
    assert_eq!(ids, reference.encode("𝔘", false).unwrap().get_ids());
    assert_eq!(tok.decode(&ids, false).unwrap(), "𝔘");
}

#[test]
fn unknown_pre_tokenizers_and_models_are_refused_by_name() {
    let name = "tiny-qwen3-moe";
    let file = gguf(name).display().to_string();
    for (key, value, expect) in [
        (PRE, "llama-bpe", "pre-tokenizer 'llama-bpe'"),
        (PRE, "default", "pre-tokenizer 'default'"),
        (
            "tokenizer.ggml.model",
            "bert",
            "'tokenizer.ggml.model' = 'bert'",
        ),
    ] {
        let mut meta = metadata(name);
        meta.set(key, MetaValue::String(value.into()));
        let e = tokenizer_from_gguf(&gguf(name), &meta, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&file) && e.contains(expect), "{e}");
    }
    // More tokens than the model's embedding has rows.
    let e = tokenizer_from_gguf(&gguf(name), &metadata(name), Some(100))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("at most 100"),
        "{e}"
    );
    // A malformed merge names the key.
    let mut meta = metadata(name);
    let merges = MetaValue::Array {
        elem_type: 8,
        items: vec![MetaValue::String("nospace".into())],
    };
    meta.set("tokenizer.ggml.merges", merges);
    let e = tokenizer_from_gguf(&gguf(name), &meta, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("nospace"),
        "{e}"
    );
}

/// `hob convert --from x.gguf` writes the tokenizer keys, and `hob run -p` (chat template and
/// raw prompt) gives what the Hugging Face directory's conversion gives, with no token ids.
#[test]
fn convert_from_gguf_then_run_with_a_prompt() {
    for family in ["qwen3-moe", "mixtral"] {
        let (_a, from_gguf) = convert_dir(&gguf(&format!("tiny-{family}")), "f16", &[]);
        let (_b, from_dir) = convert_dir(&common::family_dir(family), "f16", &[]);
        let file = hob::format::HobFile::open(&from_gguf).unwrap();
        for key in [
            keys::TOKENIZER_HF_JSON,
            keys::CHAT_TEMPLATE,
            keys::STOP_TOKEN_IDS,
        ] {
            assert!(file.metadata().get(key).is_some(), "{family}: no {key}");
        }
        for extra in [&[][..], &["--no-chat"][..]] {
            let run = |m: &std::path::Path| {
                let mut args = vec!["run", "-m", m.to_str().unwrap(), "-p", "Hello there"];
                args.extend(["-n", "6", "--temp", "0", "--device", "cpu"]);
                args.extend(extra);
                let (ok, stdout, stderr) = hob(&args);
                assert!(ok, "{family} {extra:?}: {stderr}");
                stdout
            };
            assert_eq!(run(&from_gguf), run(&from_dir), "{family} {extra:?}");
        }
    }
}
