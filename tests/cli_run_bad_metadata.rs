//! `hob run` on .hob files whose tokenizer or chat template is bad (issue 49, items 3 and 4): a
//! clear error naming the file and the metadata key, never a panic or a render that never ends.
//! Such files are written here directly, as `hob convert` refuses a bad tokenizer.json.

mod common;

use std::path::{Path, PathBuf};

use common::{convert_fixture, hob};
use hob::format::{keys, DenseSpec, ExpertShape, HobFile, HobWriter, MetaValue};

/// A copy of the .hob file `src` with metadata `key` set to the string `value`.
fn with_metadata(src: &Path, key: &str, value: &str) -> PathBuf {
    let file = HobFile::open(src).unwrap();
    let mut metadata = file.metadata().clone();
    metadata.set(key, MetaValue::String(value.to_string()));
    let dense: Vec<DenseSpec> = file
        .tensors()
        .iter()
        .map(|t| DenseSpec {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let (hidden, ffn) = file.expert_dims();
    let shape = ExpertShape {
        n_layers: file.n_layers(),
        n_experts: file.n_experts(),
        hidden,
        ffn,
    };
    let out = src.with_file_name(format!("bad-{}.hob", key.replace('.', "-")));
    let mut w = HobWriter::create(&out, &metadata, &dense, shape, file.variants()).unwrap();
    for i in 0..dense.len() {
        w.write_dense(i, file.parsed().tensor_data(file.bytes(), i))
            .unwrap();
    }
    for layer in 0..shape.n_layers {
        for expert in 0..shape.n_experts {
            for v in 0..file.variants().len() {
                w.write_expert(layer, expert, v, file.expert(layer, expert, v).data)
                    .unwrap();
            }
        }
    }
    w.finish().unwrap();
    out
}

/// `hob run` that must fail: its one-line error.
fn run_error(model: &Path) -> String {
    let (ok, stdout, stderr) = hob(&["run", "-m", model.to_str().unwrap(), "-p", "Hi", "-n", "1"]);
    assert!(!ok, "run succeeded: {stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in: {stderr}"))
        .to_string()
}

/// Issue 49, item 3: a syntax error inside the embedded tokenizer's "decoder" panicked in the
/// tokenizers crate, and errors said "tokenizer.json" rather than the .hob file and its key.
#[test]
fn bad_embedded_tokenizer_names_the_hob_file_and_key_instead_of_panicking() {
    let (_dir, good) = convert_fixture("f16");
    let json = HobFile::open(&good)
        .unwrap()
        .metadata()
        .get_str(keys::TOKENIZER_HF_JSON)
        .unwrap()
        .to_string();
    let decoder = "\"decoder\": {\n    \"type\": \"ByteLevel\",";
    assert!(json.contains(decoder));
    let broken = json.replacen(decoder, "\"decoder\": {\n    \"type\": \"ByteLevel\"", 1);
    let bad = with_metadata(&good, keys::TOKENIZER_HF_JSON, &broken);
    assert_eq!(
        run_error(&bad),
        format!(
            "error: {}: metadata key 'tokenizer.huggingface.json': not a Hugging Face tokenizer: \
             invalid JSON: expected `,` or `}}` at line 44 column 5",
            bad.display()
        )
    );
    let unknown = json.replacen(
        decoder,
        "\"decoder\": {\n    \"type\": \"NoSuchDecoder\",",
        1,
    );
    let bad = with_metadata(&good, keys::TOKENIZER_HF_JSON, &unknown);
    let err = run_error(&bad);
    assert!(
        err.starts_with(&format!(
            "error: {}: metadata key 'tokenizer.huggingface.json': not a Hugging Face tokenizer: ",
            bad.display()
        )),
        "{err}"
    );
}

/// Issue 49, item 4: a chat template with nested range(100000) loops made `hob run` hang.
#[test]
fn looping_chat_template_fails_with_a_budget_error() {
    let (_dir, good) = convert_fixture("f16");
    let template =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}";
    let bad = with_metadata(&good, keys::CHAT_TEMPLATE, template);
    assert_eq!(
        run_error(&bad),
        format!(
            "error: {}: metadata key 'tokenizer.chat_template': chat template: too much work \
             (more than {} steps): stopped at line 1 of the template",
            bad.display(),
            hob::generate::TEMPLATE_FUEL
        )
    );
}
