//! int3, int4k, int2k and ap8 experts on the CUDA backend (matvec_q.cu matvec_qd_int3,
//! matvec_qd_int4k and matvec_q_int2k, _sel, _gu; ap8.cu; issue 54). The fixtures' 64-wide rows are not 16-byte rows in int3 (24 bytes), so
//! they take matvec_any; these tests use OLMoE's shapes (2048 x 1024 experts, 16-byte rows) from
//! `hob convert --synthetic`, one layer: the device-routed kernels against the CPU, against the
//! host-routed forms bit for bit, and offloading that changes speed, never results. Ignored
//! without a GPU; tools/stage_gpu.sh runs them on the device machine.

mod common;

use common::gpu::{cpu_session_at, engine_session, exact_offload, gpu};
use common::{argmax, hob, nmse};
use hob::experts::engine::EngineConfig;
use hob::format::HobFile;
use hob::generate::Session;
use hob::model::{Logits, Model};

/// Prefill logits at every position, then the logits after each of `ids` fed in turn (teacher
/// forcing: a token picked differently cannot hide a larger error).
fn forced(s: &mut dyn Session, prompt: &[u32], ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    s.truncate(0);
    let all = s.forward(prompt, Logits::All).unwrap().to_vec();
    let mut steps = Vec::new();
    for &t in ids {
        steps.extend_from_slice(s.forward(&[t], Logits::Last).unwrap());
    }
    (all, steps)
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn int3_experts_on_the_gpu_match_the_cpu_and_offload_exactly() {
    experts_match_the_cpu_and_offload_exactly("int3,int2");
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn int4k_experts_on_the_gpu_match_the_cpu_and_offload_exactly() {
    experts_match_the_cpu_and_offload_exactly("int4k,int2");
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn int2k_experts_on_the_gpu_match_the_cpu_and_offload_exactly() {
    experts_match_the_cpu_and_offload_exactly("int2k,int2");
}

/// Every width of ap8 (the stored variant 0, its views ap8@2..@7 after it), its planes read by
/// ap8.cu's kernels: the CPU's logits, and offloading that changes nothing.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn ap8_experts_on_the_gpu_match_the_cpu_and_offload_exactly() {
    experts_at_match_the_cpu_and_offload_exactly("ap8", &[0, 1, 2, 3, 4, 5, 6]);
}

/// Issue 54: where both pools hold widths of one ap8 blob (ap8@5 high, ap8@3 low), a high load
/// whose low copy is cached copies it slot to slot and loads only the missing planes: fewer
/// bytes over the link, the same logits as loading the whole blob (device and mapped slots).
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn ap8_high_loads_complete_cached_low_copies_with_the_same_logits() {
    let g = gpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("olmoe.hob");
    let p = path.to_str().unwrap();
    let args = ["convert", "--synthetic", "olmoe-1b-7b", "--layers", "1"];
    let (ok, _, err) = hob(&[&args[..], &["--experts", "ap8", "--no-progress", "-o", p]].concat());
    assert!(ok, "convert: {err}");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let idx = |name: &str| {
        let names: Vec<String> = file.variants().iter().map(|v| v.to_string()).collect();
        names.iter().position(|n| n == name).unwrap()
    };
    let prompt: Vec<u32> = [17u32, 4093, 512, 30001, 9, 777].to_vec();
    let ids: Vec<u32> = (0..24).map(|i| (i * 7919 + 13) % 30000).collect();
    for mapped in [false, true] {
        let run = |upgrade: bool| {
            let mut c = exact_offload(&file, file.n_experts() / 4);
            c.plan.high = idx("ap8@5");
            c.plan.low = Some(idx("ap8@3"));
            c.plan.thresholds = hob::experts::Thresholds { t1: 0.5, t2: 1.0 };
            c.budget = hob::experts::engine::Budget::Bytes(
                file.n_experts() / 4 * file.expert_layout(c.plan.high).padded_size,
            );
            c.low_share = 0.4;
            c.substitute_low = false;
            c.mapped = mapped;
            c.tuning.upgrade_planes = upgrade;
            let mut s = engine_session(&g, &model, c);
            let got = forced(&mut *s, &prompt, &ids);
            (got, s.expert_stats())
        };
        let (whole, ws) = run(false);
        let (planes, ps) = run(true);
        println!(
            "mapped {mapped}: {} upgrades ({} bytes taken slot to slot); loaded {} bytes, {} without",
            ps.upgraded, ps.upgrade_bytes, ps.bytes_loaded, ws.bytes_loaded
        );
        assert!(ps.upgraded > 0 && ws.upgraded == 0);
        assert_eq!(ps.bytes_loaded + ps.upgrade_bytes, ws.bytes_loaded);
        assert!(planes == whole, "loading missing planes changed the logits");
    }
}

/// `experts` (a high and a low variant) on the GPU: against the CPU, host- against
/// device-routed, both gate-up forms, and a quarter cache against the all-resident run.
fn experts_match_the_cpu_and_offload_exactly(experts: &str) {
    experts_at_match_the_cpu_and_offload_exactly(experts, &[0])
}

/// The same for each variant `v` of the file (the offloaded run's low copy: another variant).
fn experts_at_match_the_cpu_and_offload_exactly(experts: &str, vs: &[usize]) {
    let g = gpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("olmoe.hob");
    let p = path.to_str().unwrap();
    let (ok, _, err) = hob(&[
        "convert",
        "--synthetic",
        "olmoe-1b-7b",
        "--layers",
        "1",
        "--experts",
        experts,
        "--no-progress",
        "-o",
        p,
    ]);
    assert!(ok, "convert: {err}");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    for &v in vs {
        variant_matches_the_cpu_and_offloads_exactly(&g, &file, &model, v);
    }
}

fn variant_matches_the_cpu_and_offloads_exactly(
    g: &std::sync::Arc<hob::backend::cuda::Gpu>,
    file: &HobFile,
    model: &Model<'_>,
    v: usize,
) {
    let prompt: Vec<u32> = [17u32, 4093, 512, 30001, 9, 777].to_vec();
    // The CPU's greedy tokens, then every session fed those.
    let mut cpu = cpu_session_at(file, model, v);
    let first = cpu.forward(&prompt, Logits::All).unwrap().to_vec();
    let vocab = cpu.config().vocab;
    let mut ids = vec![argmax(&first[first.len() - vocab..])];
    for _ in 0..5 {
        let l = cpu.forward(&[*ids.last().unwrap()], Logits::Last).unwrap();
        ids.push(argmax(l));
    }
    let (c_all, c_steps) = forced(&mut *cpu, &prompt, &ids);

    let name = file.variants()[v].to_string();
    let mut gs = engine_session(g, model, EngineConfig::simple(v, None));
    let (g_all, g_steps) = forced(&mut *gs, &prompt, &ids);
    let (e_pre, e_dec) = (nmse(&g_all, &c_all), nmse(&g_steps, &c_steps));
    println!(
        "{name} experts: GPU vs CPU prefill NMSE {e_pre:.2e}, decode {e_dec:.2e}; {}",
        gs.describe()
    );
    // x rounded to 16 bits of each chunk's largest value (the dp4a kernels; the CPU's VNNI
    // kernel rounds too): 1e-8 a product.
    assert!(e_pre <= 1e-5 && e_dec <= 1e-5);
    assert_eq!(gs.expert_stats().device_routed, ids.len() as u64);

    // Host routing: the routed kernels on a table of slots, then one expert at a time (matvec):
    // the device-routed bits.
    for slots in [true, false] {
        let mut c = EngineConfig::simple(v, None);
        c.tuning.device_routing = false;
        c.tuning.routed_slots = slots;
        let mut hs = engine_session(g, model, c);
        let (h_all, h_steps) = forced(&mut *hs, &prompt, &ids);
        assert_eq!(hs.expert_stats().device_routed, 0);
        assert!(
            h_all == g_all && h_steps == g_steps,
            "host routing (routed slots {slots}) differs from device routing: NMSE {:.2e}",
            nmse(&h_steps, &g_steps)
        );
    }
    // The gate-up launch and the routed gate and up with swiglu: the same bits.
    g.set_routed_gu(false);
    let mut us = engine_session(g, model, EngineConfig::simple(v, None));
    let (u_all, u_steps) = forced(&mut *us, &prompt, &ids);
    g.set_routed_gu(true);
    assert!(u_all == g_all && u_steps == g_steps, "gate-up forms differ");

    // A quarter cache with prefetch, the high and the low variant, all high: the all-resident
    // logits.
    let mut c = exact_offload(file, file.n_layers() * file.n_experts() / 4);
    c.plan.high = v;
    c.plan.low = Some(if v == 1 { 0 } else { 1 });
    c.prefetch = 2;
    let mut q = engine_session(g, model, c);
    let (q_all, q_steps) = forced(&mut *q, &prompt, &ids);
    let st = q.expert_stats();
    println!(
        "quarter cache: {} uses, {} misses, decode NMSE vs all-resident {:.2e}",
        st.uses(),
        st.misses(),
        nmse(&q_steps, &g_steps)
    );
    assert!(st.misses() > 0, "a quarter cache must miss");
    assert!(
        q_all == g_all && q_steps == g_steps,
        "offloading changed the logits"
    );
}
