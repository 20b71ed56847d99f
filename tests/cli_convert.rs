//! `hob convert` and `hob inspect`, run as the binary: the transformers fixture and rewrites of
//! it in other dtypes and shardings convert, read back exactly (dense, f16 experts) or within
//! error bounds (int experts), deterministically; errors exit non-zero naming the problem and
//! leave no output or temporary file behind.

mod common;
mod import_fixture;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use hob::format::{DType, HobFile, MatrixView, VariantKind};
use hob::import::dtype;
use hob::quant::Matrix;
use import_fixture as fx;
use safetensors::Dtype;

fn hob(args: &[&str]) -> Output {
    common::hob_command().args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "failed: {}\n{}", stderr(o), stdout(o));
}

/// Run a convert that must fail: non-zero exit, no panic, a message containing each of `want`,
/// and nothing left in the (otherwise empty) output directory.
fn convert_fails(from: &Path, out_dir: &Path, extra: &[&str], want: &[&str]) {
    let out = out_dir.join("out.hob");
    let o = hob(&convert_args(from, &out, extra));
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "convert succeeded but should fail ({want:?})"
    );
    assert!(!err.contains("panicked"), "panicked: {err}");
    for w in want {
        assert!(err.contains(w), "expected '{w}' in: {err}");
    }
    if out_dir.exists() {
        let left: Vec<_> = std::fs::read_dir(out_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "left behind after a failed convert: {left:?}"
        );
    }
}

fn convert_args<'a>(from: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "convert",
        "--from",
        from.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    args
}

fn convert(from: &Path, out: &Path, extra: &[&str]) -> String {
    let o = hob(&convert_args(from, out, extra));
    assert_ok(&o);
    stdout(&o)
}

fn decode(dt: DType, bytes: &[u8]) -> Vec<f32> {
    let mut v = Vec::new();
    dtype::decode_into(dt, bytes, &mut v);
    v
}

fn matrix_f32(view: MatrixView<'_>) -> Vec<f32> {
    Matrix::from_view(view).to_f32()
}

/// Every dense tensor of `hob_path` equals the source tensor (as f32) rounded to its stored dtype.
fn check_dense(hob_path: &Path, src: &BTreeMap<String, fx::Tensor>, expect_dtype: DType) {
    let file = HobFile::open(hob_path).unwrap();
    let ck = hob::import::Checkpoint::open(&fx::fixture_dir()).unwrap();
    assert_eq!(file.tensors().len(), ck.dense_tensors().len());
    for t in ck.dense_tensors() {
        let view = file
            .tensor(&t.hob_name)
            .unwrap_or_else(|| panic!("{} missing", t.hob_name));
        assert_eq!(view.info.shape, t.shape, "{}", t.hob_name);
        let is_matrix = t.role == hob::import::TensorRole::Matrix;
        assert_eq!(
            view.info.dtype,
            if is_matrix { expect_dtype } else { DType::F32 },
            "{}",
            t.hob_name
        );
        let hob::format::TensorType::Float(dt) = view.info.dtype else {
            panic!("{}: packed", t.hob_name)
        };
        let want: Vec<f32> = src[&t.hf_name]
            .values
            .iter()
            .map(|&v| decode(dt, &dtype::encode(dt, &[v]))[0])
            .collect();
        assert_eq!(decode(dt, view.data), want, "{}", t.hob_name);
    }
}

#[test]
fn fixture_converts_reads_back_and_inspects() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiny.hob");
    let summary = convert(
        &fx::fixture_dir(),
        &out,
        &["--experts", "f16,int8,int4,int3,int2"],
    );
    for v in [
        "f16", "int8/g64", "int4/g64", "int3/g64", "int2/g64", "dense:", "tiny.hob",
    ] {
        assert!(summary.contains(v), "summary lacks '{v}': {summary}");
    }
    let src = fx::read_tensors(&fx::fixture_dir());
    check_dense(&out, &src, DType::F16);

    let file = HobFile::open(&out).unwrap();
    assert_eq!(
        (file.n_layers(), file.n_experts(), file.expert_dims()),
        (2, 4, (64, 128))
    );
    let kinds: Vec<VariantKind> = file.variants().iter().map(|v| v.kind).collect();
    assert_eq!(
        kinds,
        [
            VariantKind::F16,
            VariantKind::Int8,
            VariantKind::Int4,
            VariantKind::Int3,
            VariantKind::Int2
        ]
    );
    for l in 0..2 {
        for e in 0..4 {
            let x = file.expert(l, e, 0);
            let p = format!("model.layers.{l}.block_sparse_moe.experts.{e}");
            for (view, w) in [(x.gate(), "w1"), (x.up(), "w3"), (x.down(), "w2")] {
                let want = &src[&format!("{p}.{w}.weight")].values;
                assert_eq!(&decode(DType::F16, view.codes), want, "{p}.{w} f16 copy");
            }
        }
    }
    let bounds = [0.0, 0.01, 0.12, 0.25, 0.5];
    for (vi, bound) in bounds.iter().enumerate() {
        let rel = variant_error(&file, &src, vi);
        assert!(
            rel <= *bound,
            "{}: relative RMS error {rel} above {bound}",
            file.variants()[vi]
        );
        if vi > 0 {
            assert!(
                rel > 0.0,
                "{}: a quantized variant cannot be exact",
                file.variants()[vi]
            );
        }
    }

    let o = hob(&["inspect", out.to_str().unwrap()]);
    assert_ok(&o);
    let text = stdout(&o);
    for w in [
        "general.architecture",
        "mixtral",
        "blk.1.ffn_gate_inp.weight",
        "int2/g64",
        "int3/g64",
        "3.500 bits/weight",
        "chars)",
    ] {
        assert!(text.contains(w), "inspect lacks '{w}': {text}");
    }

    let o = hob(&["inspect", "--json", "--verify", out.to_str().unwrap()]);
    assert_ok(&o);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["tensors"].as_array().unwrap().len(), file.tensors().len());
    assert_eq!(j["experts"]["variants"][2]["variant"], "int4/g64");
    assert_eq!(j["experts"]["variants"][2]["count"], 8);
    assert_eq!(j["metadata"]["general.architecture"], "mixtral");
    assert_eq!(j["verify"]["checksums"], file.tensors().len() + 2 * 4 * 5);

    // --entropy: each integer variant's code entropy, below its width.
    let o = hob(&["inspect", "--json", "--entropy", out.to_str().unwrap()]);
    assert_ok(&o);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = j["entropy"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in rows {
        let (h, bits) = (
            r["order0_bits"].as_f64().unwrap(),
            r["bits"].as_f64().unwrap(),
        );
        assert!(h > 0.5 * bits && h <= bits, "{r}");
    }

    let o = hob(&["inspect", "--verify", out.to_str().unwrap()]);
    assert_ok(&o);
    let n = file.tensors().len() + 2 * 4 * 5;
    assert!(
        stdout(&o).contains(&format!("verify: all {n} checksums OK")),
        "{}",
        stdout(&o)
    );
}

#[test]
fn verify_names_a_corrupted_expert() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiny.hob");
    convert(&fx::fixture_dir(), &out, &["--experts", "f16,int4"]);
    let offset = HobFile::open(&out).unwrap().expert_record(1, 2, 1).offset as usize;
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[offset + 3] ^= 0x40;
    std::fs::write(&out, bytes).unwrap();
    let o = hob(&["inspect", "--verify", out.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("checksum") && err.contains("expert"), "{err}");
}

#[test]
fn converting_twice_gives_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.hob"), tmp.path().join("b.hob"));
    convert(&fx::fixture_dir(), &a, &["--experts", "f16,int8,int4,int2"]);
    convert(&fx::fixture_dir(), &b, &["--experts", "f16,int8,int4,int2"]);
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "two converts differ"
    );
}

#[test]
fn every_source_dtype_and_sharding_converts() {
    for (dtype, sharded, dense, stored) in [
        (Dtype::F32, false, None, DType::F32),
        (Dtype::BF16, true, None, DType::Bf16),
        (Dtype::F16, false, Some("f32"), DType::F32),
        (Dtype::F32, true, Some("bf16"), DType::Bf16),
        (Dtype::F32, false, Some("f16"), DType::F16),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let src_dir = tmp.path().join("model");
        std::fs::create_dir(&src_dir).unwrap();
        let src = fx::rewrite(&fx::fixture_dir(), &src_dir, dtype, sharded);
        let out = tmp.path().join("m.hob");
        let mut extra = vec!["--experts", "f16,int4"];
        if let Some(d) = dense {
            extra.extend(["--dense", d]);
        }
        convert(&src_dir, &out, &extra);
        check_dense(&out, &src, stored);
    }
}

#[test]
fn non_finite_expert_fails_mid_stream_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src_dir = tmp.path().join("model");
    std::fs::create_dir(&src_dir).unwrap();
    let mut t = fx::rewrite(&fx::fixture_dir(), &src_dir, Dtype::F16, false);
    let name = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
    t.get_mut(name).unwrap().values[7] = f32::NAN;
    fx::write_tensors(&src_dir, &t, false);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    convert_fails(
        &src_dir,
        &out_dir,
        &["--experts", "f16,int4"],
        &[name, "non-finite"],
    );
}

/// A writable copy of the fixture to break.
fn fixture_copy(tmp: &Path) -> PathBuf {
    let dir = tmp.join("model");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(fx::fixture_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

#[test]
fn errors_before_writing_name_the_problem_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();

    let missing = tmp.path().join("no-such-checkpoint");
    convert_fails(&missing, &out_dir, &[], &["no-such-checkpoint"]);

    let model = fixture_copy(tmp.path());
    convert_fails(
        &model,
        &out_dir,
        &["--experts", "f16,int5"],
        &["unknown variant 'int5'", "int3"],
    );
    convert_fails(
        &model,
        &out_dir,
        &["--experts", "int3/g32"],
        &["int3", "multiple of 64"],
    );
    convert_fails(
        &model,
        &out_dir,
        &["--experts", "int4,int4"],
        &["listed twice"],
    );
    convert_fails(
        &model,
        &out_dir,
        &["--experts", "int4/g96"],
        &["group size"],
    );
    convert_fails(&model, &out_dir, &["--dense", "f64"], &["--dense", "f64"]);
    convert_fails(
        &model,
        &tmp.path().join("no-such-out-dir"),
        &[],
        &["no-such-out-dir"],
    );

    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    std::fs::write(
        model.join("config.json"),
        config.replace("MixtralForCausalLM", "LlamaForCausalLM"),
    )
    .unwrap();
    convert_fails(
        &model,
        &out_dir,
        &[],
        &["config.json: architecture 'LlamaForCausalLM' is not supported (supported: MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM, PhimoeForCausalLM, GptOssForCausalLM, Glm4MoeForCausalLM, DeepseekV2ForCausalLM, Glm4MoeLiteForCausalLM)"],
    );
    std::fs::write(model.join("config.json"), &config).unwrap();

    let name = "model.layers.0.self_attn.v_proj.weight";
    let mut t = fx::read_tensors(&model);
    let v_proj = t.remove(name).unwrap();
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ] {
        std::fs::remove_file(model.join(f)).unwrap();
    }
    fx::write_tensors(&model, &t, true);
    convert_fails(
        &model,
        &out_dir,
        &[],
        &[name, "not found", "model.safetensors.index.json"],
    );

    let mut bad = v_proj.clone();
    bad.shape = vec![64, 32];
    t.insert(name.into(), bad);
    fx::write_tensors(&model, &t, true);
    convert_fails(
        &model,
        &out_dir,
        &[],
        &[name, "expected shape [32, 64], found [64, 32]"],
    );
}

/// Issue 49, item 3: a syntax error inside tokenizer.json's "decoder" panicked in the tokenizers
/// crate; convert names the file and the line and embeds nothing.
#[test]
fn convert_refuses_a_tokenizer_json_that_panicked_the_tokenizers_crate() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let model = fixture_copy(tmp.path());
    let path = model.join("tokenizer.json");
    let json = std::fs::read_to_string(&path).unwrap();
    let decoder = "\"decoder\": {\n    \"type\": \"ByteLevel\",";
    assert!(json.contains(decoder));
    std::fs::write(
        &path,
        json.replacen(decoder, "\"decoder\": {\n    \"type\": \"ByteLevel\"", 1),
    )
    .unwrap();
    let shown = path.display().to_string();
    convert_fails(
        &model,
        &out_dir,
        &[],
        &[
            &format!("{shown}: not a Hugging Face tokenizer: invalid JSON: expected `,` or `}}`"),
            "at line 44 column 5",
        ],
    );
    // Valid JSON with a decoder the crate does not know: refused the same way.
    std::fs::write(
        &path,
        json.replacen(
            decoder,
            "\"decoder\": {\n    \"type\": \"NoSuchDecoder\",",
            1,
        ),
    )
    .unwrap();
    convert_fails(
        &model,
        &out_dir,
        &[],
        &[&format!("{shown}: not a Hugging Face tokenizer: ")],
    );
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A convert that runs for seconds (1 GB: one synthetic Mixtral layer, int2 experts).
fn start_slow_convert(out: &Path) -> Child {
    common::hob_command()
        .args(["convert", "--synthetic", "mixtral-8x7b", "--layers", "1"])
        .args(["--experts", "int2", "--no-progress", "-o"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait until `child` has created its temporary file in `dir`; its path.
fn wait_for_temp_file(dir: &Path, child: &mut Child) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(name) = names_in(dir).into_iter().find(|n| n.contains(".tmp-")) {
            return dir.join(name);
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("convert ended ({status}) before its temporary file appeared");
        }
        assert!(Instant::now() < deadline, "no temporary file after 300 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The process that wrote `tmp` (`OUT.tmp-PID`): hob itself, also when the test started it
/// through a runner (.ci/qemu-runner, whose shell would hold a signal until hob ended).
fn writer_pid(tmp: &Path) -> libc::pid_t {
    let name = tmp.file_name().unwrap().to_str().unwrap();
    name.rsplit("tmp-").next().unwrap().parse().unwrap()
}

fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill takes integers only; `pid` belongs to a child of ours that is still running
    // (its temporary file exists), so it is not a reused pid.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Issue 49, item 8: Ctrl-C, SIGTERM or SIGHUP during a convert left `OUT.tmp-PID` behind at its
/// full preallocated size.
#[test]
fn interrupted_convert_leaves_no_temp_file() {
    for (signal, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.hob");
        let mut child = start_slow_convert(&out);
        let tmp = wait_for_temp_file(dir.path(), &mut child);
        send_signal(writer_pid(&tmp), signal);
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(128 + signal),
            "{name}: {}: {err}",
            o.status
        );
        assert!(
            err.contains(&format!(
                "hob convert: interrupted; removed the unfinished output {}\n",
                tmp.display()
            )),
            "{name}: {err}"
        );
        assert!(
            names_in(dir.path()).is_empty(),
            "{name}: {:?}",
            names_in(dir.path())
        );
    }
}

/// Issue 49, item 8: after `kill -9` (which no handler sees) the temporary file stayed forever;
/// the next convert to the same output removes it, and only files of dead processes.
#[test]
fn killed_convert_temp_file_is_removed_by_the_next_convert() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let mut child = start_slow_convert(&out);
    let tmp = wait_for_temp_file(dir.path(), &mut child);
    let pid = writer_pid(&tmp);
    // The child first: a runner that saw its hob killed would start it once more.
    child.kill().unwrap();
    send_signal(pid, libc::SIGKILL);
    child.wait().unwrap();
    // Natively hob is the child, reaped above; under a runner it is reaped by its parent.
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(tmp.exists(), "SIGKILL cannot be handled: the file stays");
    // A live process's file (this test's) and another output's file are not touched.
    let live = dir.path().join(format!("m.hob.tmp-{}", std::process::id()));
    let other = dir.path().join(format!("other.hob.tmp-{pid}"));
    std::fs::write(&live, b"busy").unwrap();
    std::fs::write(&other, b"not ours").unwrap();

    let err = stderr(&hob(&convert_args(&fx::fixture_dir(), &out, &[])));
    assert!(
        err.contains(&format!(
            "hob convert: removed {}, left by an interrupted convert (process {pid}, which is gone)",
            tmp.display()
        )),
        "{err}"
    );
    assert!(out.exists(), "{err}");
    let mut expected = vec![
        "m.hob".to_string(),
        format!("m.hob.tmp-{}", std::process::id()),
        format!("other.hob.tmp-{pid}"),
    ];
    expected.sort();
    assert_eq!(names_in(dir.path()), expected);
}

/// Issue 49, item 8: `-o DIR` failed only after the whole conversion (at the final rename).
#[test]
fn output_naming_a_directory_fails_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("models");
    std::fs::create_dir(&dir).unwrap();
    let shown = dir.display().to_string();
    let want = |out: &str| {
        format!("error: -o {out}: names a directory; give the path of the .hob file to write (e.g. {shown}/model.hob)")
    };
    // Checked before the source is even opened.
    let missing = tmp.path().join("no-such-checkpoint");
    for out in [format!("{shown}/"), shown.clone()] {
        let o = hob(&convert_args(&missing, Path::new(&out), &[]));
        assert!(!o.status.success());
        assert_eq!(stderr(&o).trim_end(), want(&out));
    }
    let o = hob(&[
        "convert",
        "--synthetic",
        "mixtral-8x7b",
        "--layers",
        "1",
        "--no-progress",
        "-o",
        &shown,
    ]);
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim_end(), want(&shown));
    assert!(names_in(&dir).is_empty() && names_in(tmp.path()) == ["models"]);
}

/// Relative RMS error of variant `vi` of `file` against the fixture's f32 experts.
fn variant_error(file: &HobFile, src: &BTreeMap<String, fx::Tensor>, vi: usize) -> f64 {
    let (mut sse, mut ss) = (0f64, 0f64);
    for l in 0..file.n_layers() {
        for e in 0..file.n_experts() {
            let x = file.expert(l, e, vi);
            let p = format!("model.layers.{l}.block_sparse_moe.experts.{e}");
            for (view, w) in [(x.gate(), "w1"), (x.up(), "w3"), (x.down(), "w2")] {
                let want = &src[&format!("{p}.{w}.weight")].values;
                for (a, b) in matrix_f32(view).iter().zip(want) {
                    sse += ((a - b) as f64).powi(2);
                    ss += (*b as f64).powi(2);
                }
            }
        }
    }
    (sse / ss).sqrt()
}

/// ap8 (issue 54 item 1): one stored blob, read at every width as a prefix; each width's error
/// near the separately quantized variant's, each view's checksum its own, and a CPU run with a
/// view as HOBBIT's low tier.
#[test]
fn ap8_stores_one_blob_and_reads_every_width() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ap8.hob");
    let summary = convert(&fx::fixture_dir(), &out, &["--experts", "ap8,int4,int2"]);
    // 8.875 bits a weight and a row pair (32 bits) over the fixture's 64 columns.
    assert!(summary.contains("9.375"), "{summary}");
    let src = fx::read_tensors(&fx::fixture_dir());
    let file = HobFile::open(&out).unwrap();
    let names: Vec<String> = file.variants().iter().map(|v| v.name()).collect();
    assert_eq!(
        names,
        ["ap8", "int4/g64", "int2/g64", "ap8@2", "ap8@3", "ap8@4", "ap8@5", "ap8@6", "ap8@7"]
    );
    let err: Vec<f64> = (0..names.len())
        .map(|vi| variant_error(&file, &src, vi))
        .collect();
    // Narrower views lose more; ap8@4 and ap8@2 stay near int4's and int2's own searches.
    let by_width = [err[3], err[4], err[5], err[6], err[7], err[8], err[0]];
    assert!(by_width.windows(2).all(|w| w[0] > w[1]), "{by_width:?}");
    assert!(err[0] < 0.006, "ap8 at 8 bits: {}", err[0]);
    assert!(
        err[5] < 1.15 * err[1],
        "ap8@4 {} vs int4 {}",
        err[5],
        err[1]
    );
    assert!(
        err[3] < 1.15 * err[2],
        "ap8@2 {} vs int2 {}",
        err[3],
        err[2]
    );
    file.verify().unwrap();

    // A byte of the lowest plane is read by the whole blob alone; a byte of the top chunk by
    // every view.
    let layout = hob::format::ap8::ApLayout::new(64, 128).unwrap();
    let offset = file.expert_record(1, 2, 0).offset as usize;
    drop(file);
    let bytes = std::fs::read(&out).unwrap();
    for (at, clean, broken) in [
        (layout.parts[2].planes[5] + 3, "ap8@7", "ap8"),
        (layout.parts[1].top + 5, "int4/g64", "ap8@2"),
    ] {
        let mut b = bytes.clone();
        b[offset + at] ^= 0x10;
        let bad = tmp.path().join("bad.hob");
        std::fs::write(&bad, &b).unwrap();
        let f = HobFile::open(&bad).unwrap();
        let v = |n: &str| f.variants().iter().position(|v| v.name() == n).unwrap();
        f.verify_expert(1, 2, v(clean)).unwrap();
        let e = f.verify_expert(1, 2, v(broken)).unwrap_err().to_string();
        assert!(
            e.contains("checksum") && e.contains(&format!("variant {broken})")),
            "{e}"
        );
    }

    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question. ".repeat(40),
    )
    .unwrap();
    let o = hob(&[
        "perplexity",
        "-m",
        out.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
        "--device",
        "cpu",
        "--expert-variant",
        "ap8",
        "--low",
        "ap8@3",
    ]);
    assert_ok(&o);
    let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(
        all.contains("Final estimate") && all.contains("(ap8@3)"),
        "{all}"
    );
}
