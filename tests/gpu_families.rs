//! The MoE families beside Mixtral on the CUDA backend and the HOBBIT engine (issue 50): each
//! fixture against the CPU and transformers, and offloading that changes speed, never results.
//! Ignored without a GPU; tools/stage_gpu.sh runs them on the device machine. Bounds as in
//! tests/gpu_engine.rs.

mod common;

use common::gpu::{cpu_session, gpu, gpu_session};
use common::{convert_dir, family_dir, hob, nmse, reference_in};
use hob::format::HobFile;
use hob::generate::Session;
use hob::model::{Logits, Model};

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// Prefill logits at every position, then `n` greedy steps: (prefill logits, ids, the logits
/// each greedy token was chosen from: transformers' greedy_logits).
fn greedy(s: &mut dyn Session, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    s.truncate(0);
    let all = s.forward(prompt, Logits::All).unwrap().to_vec();
    let vocab = s.config().vocab;
    let mut logits = all[all.len() - vocab..].to_vec();
    let (mut ids, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        steps.extend_from_slice(&logits);
        let next = argmax(&logits);
        ids.push(next);
        logits = s.forward(&[next], Logits::Last).unwrap().to_vec();
    }
    (all, ids, steps)
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn qwen3_moe_on_the_gpu_matches_the_cpu_and_transformers() {
    let g = gpu();
    let dir = family_dir("qwen3-moe");
    let r = reference_in(&dir);
    let (_tmp, path) = convert_dir(&dir, "f16", &[]);
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let n = r.greedy_ids.len();
    let (c_all, c_ids, c_steps) = greedy(&mut *cpu_session(&file, &model), &r.input_ids, n);
    let mut full = gpu_session(&g, &file, &model, None);
    let (g_all, g_ids, g_steps) = greedy(&mut *full, &r.input_ids, n);
    let (e_pre, e_dec) = (nmse(&g_all, &c_all), nmse(&g_steps, &c_steps));
    let (r_pre, r_dec) = (nmse(&g_all, &r.logits), nmse(&g_steps, &r.greedy_logits));
    println!(
        "qwen3-moe: GPU vs CPU prefill NMSE {e_pre:.2e}, decode {e_dec:.2e}; vs transformers \
         {r_pre:.2e}, {r_dec:.2e}; {}",
        full.describe()
    );
    assert!(e_pre <= 1e-5 && e_dec <= 1e-5 && r_pre <= 1e-5 && r_dec <= 1e-5);
    assert_eq!(g_ids, c_ids, "greedy tokens differ between GPU and CPU");
    assert_eq!(
        g_ids, r.greedy_ids,
        "greedy tokens differ from transformers"
    );

    // A quarter of the experts cached: the all-resident logits bit for bit.
    let total = file.n_layers() * file.n_experts();
    let mut quarter = gpu_session(&g, &file, &model, Some(total / 4));
    let (q_all, q_ids, q_steps) = greedy(&mut *quarter, &r.input_ids, n);
    let stats = quarter.expert_stats();
    println!(
        "qwen3-moe quarter cache ({} of {total} slots): {} uses, {} misses",
        total / 4,
        stats.uses(),
        stats.misses()
    );
    assert!(stats.misses() > 0, "a quarter cache must miss");
    assert_eq!(q_ids, g_ids);
    assert!(
        q_all == g_all && q_steps == g_steps,
        "logits differ with a quarter cache"
    );
}

/// The CUDA backend's routing renormalizes the top-k weights: the families whose weights are
/// used as they are are refused by name, not run wrong.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn families_the_gpu_does_not_run_yet_are_refused_by_name() {
    let _ = gpu();
    for (family, arch) in [
        ("olmoe", "olmoe"),
        ("qwen2-moe", "qwen2moe"),
        ("phimoe", "phimoe"),
    ] {
        let (_tmp, path) = convert_dir(&family_dir(family), "f16", &[]);
        let m = path.to_str().unwrap();
        let (ok, _, stderr) = hob(&["run", "-m", m, "-p", "hi", "-n", "2", "--device", "cuda"]);
        assert!(!ok, "{family}: {stderr}");
        let want = format!("the CUDA backend does not run {arch} models yet: use --device cpu");
        assert!(stderr.contains(&want), "{family}: {stderr}");
    }
}
