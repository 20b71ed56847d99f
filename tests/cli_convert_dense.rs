//! `hob convert --dense int8|int4` (issue 56): dense matrices packed like expert matrices, read
//! back by the CPU path. Logits against transformers' on the tiny fixtures, the same at every
//! thread count, and the plan's classes and errors.

mod common;

use common::{convert_dir, family_dir, hob, nmse, reference_in};
use hob::backend::cpu::CpuBackend;
use hob::experts::DirectExperts;
use hob::format::{DType, HobFile, TensorType};
use hob::model::{Logits, Model};

fn prefill(file: &HobFile, ids: &[u32], threads: usize) -> Vec<f32> {
    let model = Model::load(file).unwrap();
    let backend = CpuBackend::new(threads).unwrap();
    let mut experts = DirectExperts::new(file, 0).unwrap();
    let mut st = model.new_state(&backend, 128).unwrap();
    let mut out = model
        .forward(
            &mut st,
            &ids[..ids.len() - 1],
            &backend,
            &mut experts,
            Logits::All,
        )
        .unwrap()
        .to_vec();
    // The last token as a decode step: the one-token kernels too.
    let last = *ids.last().unwrap();
    out.extend_from_slice(
        model
            .forward(&mut st, &[last], &backend, &mut experts, Logits::Last)
            .unwrap(),
    );
    out
}

/// Each family's fixture with packed dense matrices: every matrix packed, vectors f32, logits
/// near transformers' (f16 experts, so the distance is the dense quantization's), identical at
/// 1 and 3 threads.
#[test]
fn packed_dense_matrices_run_near_the_reference() {
    for (family, dense, bound) in [
        ("mixtral", "int8/g32", 2e-3),
        ("qwen2-moe", "int8/g16", 2e-3),
        ("qwen3-moe", "int4/g32", 0.15),
        ("phimoe", "int8/g32", 3e-2),
    ] {
        let dir = family_dir(family);
        let r = reference_in(&dir);
        let (_tmp, path) = convert_dir(&dir, "f16", &["--dense", dense, "--group-size", "16"]);
        let file = HobFile::open(&path).unwrap();
        let want = TensorType::parse(dense, None).unwrap();
        for t in file.tensors() {
            if t.shape.len() == 2 && !t.name.contains("ffn_gate_inp") {
                assert_eq!(t.dtype, want, "{family}: {}", t.name);
            } else {
                assert_eq!(t.dtype, DType::F32, "{family}: {}", t.name);
            }
        }
        let one = prefill(&file, &r.input_ids, 1);
        let three = prefill(&file, &r.input_ids, 3);
        assert!(one == three, "{family}: -t 1 and -t 3 differ");
        let e = nmse(&one, &r.logits);
        println!("{family}: --dense {dense}: prefill NMSE vs transformers {e:.2e}");
        assert!(e <= bound, "{family}: --dense {dense}: NMSE {e}");
    }
}

/// Per-class plans keep the unlisted classes in the source dtype; a bad plan names the problem
/// and leaves no file.
#[test]
fn classes_and_bad_plans() {
    let dir = family_dir("qwen2-moe");
    let (_tmp, path) = convert_dir(
        &dir,
        "f16",
        &[
            "--dense",
            "attn=int8/g32,shared=int4/g16",
            "--group-size",
            "16",
        ],
    );
    let file = HobFile::open(&path).unwrap();
    let ty = |name: &str| file.tensor(name).unwrap().info.dtype.name();
    assert_eq!(ty("blk.0.attn_q.weight"), "int8/g32");
    assert_eq!(ty("blk.0.ffn_up_shexp.weight"), "int4/g16");
    assert_eq!(ty("token_embd.weight"), "f16");
    assert_eq!(ty("blk.0.attn_q.bias"), "f32");

    let out = tempfile::tempdir().unwrap();
    let o = out.path().join("x.hob");
    for (plan, says) in [
        ("mlp=int8", "unknown class 'mlp'"),
        ("q4_k", "--dense 'q4_k'"),
        ("int8/g48", "token_embd.weight"),
    ] {
        let (ok, _, err) = hob(&[
            "convert",
            "--from",
            dir.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
            "--experts",
            "f16",
            "--dense",
            plan,
            "--no-progress",
        ]);
        assert!(!ok && err.contains(says), "--dense {plan}: {err}");
        assert!(!o.exists(), "--dense {plan} left a file");
    }
}
