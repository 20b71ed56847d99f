//! Whole models on the CUDA backend and the HOBBIT engine: the tiny fixture and the demo model
//! against the CPU and transformers, quantized experts against the CPU, and the engine's
//! invariant: with one precision and nothing skipped, any cache size, policy, prefetch depth,
//! slot memory and tier gives the all-resident logits bit for bit (cooperative CPU experts: up to
//! float rounding). Without a GPU the tests count as ignored (CI has none); tools/stage_gpu.sh runs
//! them on the device machine with --include-ignored. Bounds: tests/gpu_backend.rs's header.

mod common;

use common::gpu::{cpu_session, engine_session, exact_offload, gpu, gpu_session};
use common::{argmax, convert_fixture, nmse, reference};
use hob::backend::cpu::CpuBackend;
use hob::experts::cache::Policy;
use hob::experts::engine::{EngineConfig, Tier};
use hob::experts::{DirectExperts, PrecisionPlan, Thresholds};
use hob::format::HobFile;
use hob::generate::{Bound, Session};
use hob::model::{Logits, Model};

/// Prefill logits at every position, then `n` greedy steps: (prefill logits, ids, step logits).
fn greedy(s: &mut dyn Session, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    s.truncate(0);
    let all = s.forward(prompt, Logits::All).unwrap().to_vec();
    let vocab = s.config().vocab;
    let mut logits = all[all.len() - vocab..].to_vec();
    let (mut ids, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let next = argmax(&logits);
        ids.push(next);
        logits = s.forward(&[next], Logits::Last).unwrap().to_vec();
        steps.extend_from_slice(&logits);
    }
    (all, ids, steps)
}

/// The decode logits after each of `ids` (prompt first, then one token at a time).
fn teacher_forced(s: &mut dyn Session, prompt: &[u32], ids: &[u32]) -> Vec<f32> {
    s.truncate(0);
    s.forward(prompt, Logits::Last).unwrap();
    let mut steps = Vec::new();
    for &id in ids {
        steps.extend_from_slice(s.forward(&[id], Logits::Last).unwrap());
    }
    steps
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn fixture_on_the_gpu_matches_the_cpu_and_transformers() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let (c_all, c_ids, c_steps) = greedy(&mut *cpu_session(&file, &model), &r.input_ids, 32);
    let mut full = gpu_session(&g, &file, &model, None);
    let (g_all, g_ids, g_steps) = greedy(&mut *full, &r.input_ids, 32);
    // Every expert resident: decode routes and computes its experts on the device.
    assert_eq!(full.expert_stats().device_routed, 32, "{}", full.describe());
    // ... from one recording of a decode step (a CUDA graph), replayed for every later token.
    assert_eq!(full.decode_replays(), 32, "{}", full.describe());
    let (e_pre, e_dec) = (nmse(&g_all, &c_all), nmse(&g_steps, &c_steps));
    let e_ref = nmse(&g_all, &r.logits);
    println!("fixture: GPU vs CPU prefill NMSE {e_pre:.2e}, decode {e_dec:.2e}; vs transformers {e_ref:.2e}");
    assert!(e_pre <= 1e-5 && e_dec <= 1e-5 && e_ref <= 1e-5);
    assert_eq!(g_ids, c_ids, "greedy tokens differ between GPU and CPU");
    assert_eq!(
        g_ids, r.greedy_ids,
        "greedy tokens differ from transformers"
    );

    // Offloading changes speed, never results: a cache of a quarter of the experts gives the
    // same logits bit for bit as the all-resident run.
    let total = file.n_layers() * file.n_experts();
    let mut quarter = gpu_session(&g, &file, &model, Some(total / 4));
    let (q_all, q_ids, q_steps) = greedy(&mut *quarter, &r.input_ids, 32);
    let stats = quarter.expert_stats();
    println!(
        "quarter cache ({} of {total} slots): {} uses, {} misses, {} bytes loaded",
        total / 4,
        stats.uses(),
        stats.misses(),
        stats.bytes_loaded
    );
    assert!(stats.misses() > 0, "a quarter cache must miss");
    assert_eq!(stats.device_routed, 0, "a quarter cache routes on the host");
    // Its decode layers (both experts in slots) take the routed kernels, or, where one load
    // landed before the other was looked at, compute the landed expert first.
    let layers = 32 * file.n_layers() as u64;
    assert_eq!(
        stats.slot_routed_layers + stats.early_layers,
        layers,
        "{}",
        quarter.describe()
    );
    assert_eq!(q_ids, g_ids);
    assert!(
        q_all == g_all && q_steps == g_steps,
        "logits differ with a quarter cache"
    );
    // ... and so does the per-expert path (five launches an expert).
    let slot = file.expert_layout(0).padded_size;
    let mut cfg = EngineConfig::simple(0, Some(total / 4 * slot));
    cfg.tuning.preload = false;
    cfg.tuning.routed_slots = false;
    let mut per_expert = engine_session(&g, &model, cfg);
    let (p_all, p_ids, p_steps) = greedy(&mut *per_expert, &r.input_ids, 32);
    assert_eq!(per_expert.expert_stats().slot_routed_layers, 0);
    assert_eq!(p_ids, g_ids);
    assert!(
        p_all == g_all && p_steps == g_steps,
        "logits differ with a quarter cache, experts one at a time"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn quantized_experts_on_the_gpu_match_the_cpu() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("int4,int8,int2");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    for v in 0..file.variants().len() {
        let cpu_b = CpuBackend::new(2).unwrap();
        let mut cpu: Box<dyn Session> = Box::new(
            Bound::new(
                &model,
                cpu_b,
                Box::new(DirectExperts::new(&file, v).unwrap()),
                128,
                "cpu".into(),
            )
            .unwrap(),
        );
        let mut gs = engine_session(&g, &model, EngineConfig::simple(v, None));
        let (want, want_ids, want_steps) = greedy(&mut *cpu, &r.input_ids, 8);
        let (got, ids, steps) = greedy(&mut *gs, &r.input_ids, 8);
        let name = &file.variants()[v];
        // Decode's products round x to 16 bits of each chunk's largest value (matvec_q_stage.cu
        // qdstage; bound 1e-8 a product). The decode logits are compared on the CPU's tokens, so
        // a token picked differently cannot hide a larger error.
        let mut fs = engine_session(&g, &model, EngineConfig::simple(v, None));
        let forced = teacher_forced(&mut *fs, &r.input_ids, &want_ids);
        let (e, e_dec) = (nmse(&got, &want), nmse(&forced, &want_steps));
        println!("{name} experts: GPU vs CPU prefill NMSE {e:.2e}, decode {e_dec:.2e}");
        assert!(e <= 1e-5 && e_dec <= 1e-5, "{name}");
        assert_eq!(ids, want_ids, "{name}");
        // Decode routed on the device (the routed-expert kernels) computes what host routing
        // and the per-expert kernels compute, bit for bit.
        assert_eq!(gs.expert_stats().device_routed, 8, "{name}");
        assert_eq!(gs.decode_replays(), 8, "{name}");
        // Host routing: the routed kernels on a table of slots, then one expert at a time.
        for slots in [true, false] {
            let mut c = EngineConfig::simple(v, None);
            c.tuning.device_routing = false;
            c.tuning.routed_slots = slots;
            let mut hs = engine_session(&g, &model, c);
            let (h_all, h_ids, h_steps) = greedy(&mut *hs, &r.input_ids, 8);
            let st = hs.expert_stats();
            assert_eq!(st.device_routed, 0, "{name}");
            let want_layers = if slots { 8 * file.n_layers() as u64 } else { 0 };
            assert_eq!(
                st.slot_routed_layers, want_layers,
                "{name} routed slots {slots}"
            );
            assert_eq!(hs.decode_replays(), 0, "{name}");
            assert_eq!(h_ids, ids, "{name}");
            assert!(
                h_all == got && h_steps == steps,
                "{name}: host (routed slots {slots}) and device routing differ: prefill + decode \
                 NMSE {:.2e} (first difference at {:?} of {}), decode steps NMSE {:.2e}",
                nmse(&h_all, &got),
                h_all
                    .iter()
                    .zip(&got)
                    .position(|(a, b)| a.to_bits() != b.to_bits()),
                got.len(),
                nmse(&h_steps, &steps)
            );
        }
        // Prefill experts grouped (int4: a gemm_q4h launch a product for all of a layer's) or
        // one at a time: the same bits.
        if name.to_string().starts_with("int4") {
            assert!(gs.expert_stats().grouped_layers > 0, "{name}");
        }
        let mut c = EngineConfig::simple(v, None);
        c.tuning.grouped_prefill = false;
        let mut os = engine_session(&g, &model, c);
        let (o_all, o_ids, o_steps) = greedy(&mut *os, &r.input_ids, 8);
        assert_eq!(os.expert_stats().grouped_layers, 0, "{name}");
        assert_eq!(o_ids, ids, "{name}");
        assert!(
            o_all == got && o_steps == steps,
            "{name}: grouped prefill and one expert at a time differ: NMSE {:.2e}",
            nmse(&o_all, &got)
        );
    }
}

/// The demo model, where tools/demo.sh built it (models/smollm2-moe.hob in the checkout).
#[test]
#[ignore = "needs a CUDA GPU and models/smollm2-moe.hob (bash tools/demo.sh), which tools/stage_gpu.sh does not carry"]
fn demo_model_on_the_gpu_matches_the_cpu() {
    let g = gpu();
    let path = common::paths::repo_root().join("models/smollm2-moe.hob");
    assert!(
        path.exists(),
        "no {}: bash tools/demo.sh builds it",
        path.display()
    );
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let prompt: Vec<u32> = (0..48).map(|i| 1 + (i * 7919) % 4000).collect();
    let (c_all, c_ids, c_steps) = greedy(&mut *cpu_session(&file, &model), &prompt, 32);
    let (g_all, g_ids, g_steps) = greedy(&mut *gpu_session(&g, &file, &model, None), &prompt, 32);
    let (e_pre, e_dec) = (nmse(&g_all, &c_all), nmse(&g_steps, &c_steps));
    println!("demo model: GPU vs CPU prefill NMSE {e_pre:.2e}, decode {e_dec:.2e}");
    assert!(e_pre <= 1e-5 && e_dec <= 1e-5);
    assert_eq!(g_ids, c_ids);
}

/// HOBBIT's engine with T1 = T2 = 1 (all high, nothing skipped): any cache size, policy,
/// prefetch depth, slot memory (device or mapped host) and slow tier gives the all-resident
/// logits bit for bit; cooperative CPU experts give them up to float rounding.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn the_engine_in_exact_mode_matches_the_all_resident_run() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16,int4");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let (want_all, want_ids, want_steps) =
        greedy(&mut *gpu_session(&g, &file, &model, None), &r.input_ids, 16);
    let total = file.n_layers() * file.n_experts();
    let exact = |slots: usize| exact_offload(&file, slots);
    let policies = [
        Policy::Lru,
        Policy::Lfu,
        Policy::parse("hobbit", None).unwrap(),
    ];
    let mut cases: Vec<(String, EngineConfig)> = Vec::new();
    for slots in [total, total / 4, 3] {
        for (pi, policy) in policies.iter().enumerate() {
            for prefetch in [0, 2] {
                let mut c = exact(slots);
                c.policy = *policy;
                c.prefetch = prefetch;
                cases.push((
                    format!("{slots} slots, policy {pi}, prefetch {prefetch}"),
                    c,
                ));
            }
            // Gated decode (a partial cache without prefetch: routed on the device, held at a
            // layer's gate on a miss).
            let mut c = exact(slots);
            c.policy = *policy;
            c.tuning.gated_decode = true;
            cases.push((format!("{slots} slots, policy {pi}, gated"), c));
        }
    }
    // Kernels timed: decode steps launched as they run (no CUDA graph), each gated layer
    // followed one layer behind its launches.
    let mut c = exact(3);
    c.tuning.gated_decode = true;
    c.tuning.gated_follow_lag = 1;
    cases.push(("3 slots, kernels timed, gated".into(), c));
    let mut c = exact(total / 4);
    c.mapped = true;
    c.prefetch = 2;
    cases.push(("mapped host slots (unified-memory mode)".into(), c));
    let mut c = exact(total / 4);
    c.tier = Tier::Disk;
    c.prefetch = 1;
    cases.push(("SSD tier".into(), c));
    let mut c = exact(total / 4);
    c.mapped = true;
    c.tier = Tier::Disk;
    cases.push((
        "mapped host slots loaded from the SSD, matrix by matrix".into(),
        c,
    ));
    let mut c = exact(total / 4);
    c.pin_file = false;
    c.prefetch = 2;
    cases.push(("copies through pinned staging".into(), c));
    let mut c = exact(total / 4);
    c.pace_bytes_per_s = Some(2e9);
    c.prefetch = 2;
    cases.push(("link paced on the copy stream".into(), c));
    // Decode layers that computed their cached experts while other loads landed (early_layer).
    let mut early = 0;
    for (name, cfg) in cases {
        let (direct, disk, mapped) = (cfg.pin_file, cfg.tier == Tier::Disk, cfg.mapped);
        let mut s = engine_session(&g, &model, cfg);
        if name.contains("kernels timed") {
            assert!(s.kernel_clock(true), "{name}: no kernel clock");
        }
        let how = s.describe();
        println!("{name}: {how}");
        if direct && !disk && !mapped {
            // The fixture's experts fit in half of any host's RAM: page-locked, loaded by DMA.
            assert!(how.contains("page-locked"), "{name}: {how}");
        } else if !disk && !mapped {
            assert!(how.contains("staging"), "{name}: {how}");
        }
        let (all, ids, steps) = greedy(&mut *s, &r.input_ids, 16);
        let st = s.expert_stats();
        println!(
            "{name}: {} uses, {} misses, {} prefetched ({} used, {} dropped while loading), {} bytes loaded, {} layers with cached experts first",
            st.uses(),
            st.misses(),
            st.prefetch_issued,
            st.prefetch_used,
            st.prefetch_cancelled,
            st.bytes_loaded,
            st.early_layers
        );
        early += st.early_layers;
        // Gated decode takes every decode token of a partial cache where it is on.
        let gated = name.ends_with("gated") && !name.starts_with(&format!("{total} "));
        assert_eq!(
            st.gated_tokens > 0,
            gated,
            "{name}: {} gated tokens",
            st.gated_tokens
        );
        assert_eq!(st.skipped + st.substituted, 0, "{name}");
        assert_eq!(ids, want_ids, "{name}: greedy tokens differ");
        assert!(
            all == want_all && steps == want_steps,
            "{name}: logits differ"
        );
    }
    assert!(
        early > 0,
        "no decode layer computed its cached experts while a load landed"
    );
    // Cooperative mode: missed decode experts computed on the CPU, with and without prefetches
    // into the idle link (a prefetch still in flight may be overtaken by the CPU), with and
    // without loads behind the CPU (a CPU-computed miss also loaded over an idle link), and with
    // the link paced on the copy stream.
    let (mut chances, mut loaded) = (0, 0);
    for (prefetch, behind, paced) in [
        (0, true, false),
        (0, false, false),
        (2, true, false),
        (0, true, true),
    ] {
        let mut c = exact(total / 4);
        c.cpu_experts = Some(2);
        c.prefetch = prefetch;
        c.load_behind = behind;
        if paced {
            c.pace_bytes_per_s = Some(2e9);
        }
        let mut s = engine_session(&g, &model, c);
        let (all, ids, steps) = greedy(&mut *s, &r.input_ids, 16);
        let st = s.expert_stats();
        let e = nmse(&steps, &want_steps);
        let case = format!("prefetch {prefetch}, load-behind {behind}, paced {paced}");
        println!(
            "cooperative, {case}: {} experts on the CPU ({} overtaking a load, {} loaded behind of {} chances), {} prefetched ({} used), decode NMSE {e:.2e}",
            st.cpu_computed, st.late_to_cpu, st.loaded_behind, st.behind_chances, st.prefetch_issued, st.prefetch_used
        );
        if !behind {
            assert_eq!(st.loaded_behind, 0, "--no-load-behind loads nothing behind");
            assert_eq!(st.behind_chances, 0, "--no-load-behind looks for no chance");
        } else {
            // A CPU miss that finds the link idle (whether one does depends on when the loads
            // before it land) and the judge wanting (it loads its first misses whatever the
            // score) is loaded behind, unless every slot it could take is protected.
            assert!(st.loaded_behind <= st.behind_chances);
            chances += st.behind_chances;
            loaded += st.loaded_behind;
        }
        assert!(
            st.cpu_computed > 0,
            "a quarter cache must send misses to the CPU"
        );
        assert_eq!(all, want_all, "prefill never uses the CPU");
        assert_eq!(ids, want_ids, "{case}");
        assert!(e <= 1e-10, "cooperative decode NMSE {e:e} ({case})");
    }
    println!("load-behind: {loaded} loaded of {chances} chances (an idle link, the judge wanting)");
    assert!(
        chances > 0 && loaded * 2 >= chances,
        "an idle link loads CPU misses behind: {loaded} of {chances}"
    );
}

/// A prefill layer whose groups outnumber the slots: an expert routed both high and low in
/// one prefill is two groups in one slot (no low variant: the low routes take the high copy).
/// Groups are placed as slots free up while earlier ones run, so the slot must stay unevictable
/// until its last group's kernels are queued; with one mark per key, running the first group
/// released it and a later placement could load another expert over it (the bug this pins:
/// benches/results/2026-11-27-h100-l2-prefetch-holds.md).
/// Any cache size must give the all-resident run's logits with the same plan, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn prefill_groups_sharing_a_slot_under_pressure_match_the_all_resident_run() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let slot = file.expert_layout(0).padded_size;
    // T1 = 0: every route but a token's top-1 is low; T2 = 1: none skipped.
    let config = |slots: Option<usize>, prefetch: usize| {
        let mut c = EngineConfig::simple(0, slots.map(|n| n * slot));
        c.tuning.preload = slots.is_none();
        c.plan = PrecisionPlan {
            high: 0,
            low: None,
            thresholds: Thresholds::new(0.0, 1.0).unwrap(),
            renormalize_skips: false,
        };
        c.prefetch = prefetch;
        c
    };
    let (want_all, want_ids, want_steps) = greedy(
        &mut *engine_session(&g, &model, config(None, 0)),
        &r.input_ids,
        8,
    );
    for slots in [2, 3] {
        for prefetch in [0, 1] {
            let mut s = engine_session(&g, &model, config(Some(slots), prefetch));
            let (all, ids, steps) = greedy(&mut *s, &r.input_ids, 8);
            let st = s.expert_stats();
            println!(
                "{slots} slots, prefetch {prefetch}: {} uses, {} misses, prefill NMSE {:.2e}",
                st.uses(),
                st.misses(),
                nmse(&all, &want_all)
            );
            assert_eq!(st.skipped, 0);
            assert!(st.misses() > 0, "{slots} slots must miss");
            assert!(
                all == want_all,
                "{slots} slots, prefetch {prefetch}: prefill logits differ (NMSE {:.2e})",
                nmse(&all, &want_all)
            );
            assert_eq!(ids, want_ids, "{slots} slots, prefetch {prefetch}");
            assert!(
                steps == want_steps,
                "{slots} slots, prefetch {prefetch}: decode logits differ"
            );
        }
    }
}

/// Dynamic precision on the GPU computes what the CPU computes with the same plan.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn dynamic_precision_on_the_gpu_matches_the_cpu() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16,int4");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let plan = PrecisionPlan {
        high: 0,
        low: Some(1),
        thresholds: Thresholds::new(0.55, 0.7).unwrap(),
        renormalize_skips: false,
    };
    let mut cpu: Box<dyn Session> = Box::new(
        Bound::new(
            &model,
            CpuBackend::new(2).unwrap(),
            Box::new(DirectExperts::with_plan(&file, plan.clone()).unwrap()),
            128,
            "cpu".into(),
        )
        .unwrap(),
    );
    let mut c = EngineConfig::simple(0, None);
    c.plan = plan;
    c.low_share = 0.5;
    c.substitute_low = false;
    c.tuning.upgrade_low = false;
    let mut gs = engine_session(&g, &model, c);
    let (c_all, c_ids, c_steps) = greedy(&mut *cpu, &r.input_ids, 16);
    let (g_all, g_ids, g_steps) = greedy(&mut *gs, &r.input_ids, 16);
    let (cs, gst) = (cpu.expert_stats(), gs.expert_stats());
    println!(
        "dynamic precision: CPU skipped {} GPU skipped {}; NMSE prefill {:.2e} decode {:.2e}",
        cs.skipped,
        gst.skipped,
        nmse(&g_all, &c_all),
        nmse(&g_steps, &c_steps)
    );
    assert!(gst.skipped > 0 && gst.per_variant[1].hits + gst.per_variant[1].misses > 0);
    assert!(nmse(&g_all, &c_all) <= 1e-5 && nmse(&g_steps, &c_steps) <= 1e-5);
    assert_eq!(g_ids, c_ids);
}

/// Gated decode with CPU experts (int4 experts, a quarter cache, no prefetch), with and without
/// load-behind: a held layer's misses computed on the CPU join the device's sum; decode is the
/// all-resident int4 run's up to the CPU kernel's rounding, prefill (host-routed) its bits.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn gated_decode_with_cpu_experts_matches_the_all_resident_run() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16,int4");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let total = file.n_layers() * file.n_experts();
    let int4 = |slots: usize| {
        let mut c = EngineConfig::simple(1, Some(slots * file.expert_layout(1).padded_size));
        c.tuning.preload = false;
        c
    };
    let mut resident = engine_session(&g, &model, int4(total));
    let (want_all, want_ids, want_steps) = greedy(&mut *resident, &r.input_ids, 16);
    drop(resident);
    let coop = |gated: bool, behind: bool| {
        let mut c = int4(total / 4);
        c.cpu_experts = Some(2);
        c.load_behind = behind;
        c.tuning.gated_decode = gated;
        let mut s = engine_session(&g, &model, c);
        let (all, ids, steps) = greedy(&mut *s, &r.input_ids, 16);
        (all, ids, nmse(&steps, &want_steps), s.expert_stats())
    };
    let (.., host_e, _) = coop(false, false);
    // Float rounding; on an AVX-512 VNNI host the CPU's int4 kernel also rounds x to 15-16 bits a
    // block (src/quant/x86/vnni.rs): 3.5e-8 on the H100's host, 2026-12-07. A CPU result lost
    // or added twice would be ~1e-2.
    let bound = if hob::quant::packed_rounds_x() {
        1e-6
    } else {
        1e-10
    };
    for behind in [false, true] {
        let (all, ids, e, st) = coop(true, behind);
        println!(
            "gated with CPU experts, load-behind {behind}: {} gated tokens, {} layers held, {} experts on the CPU, {} loaded behind them, decode NMSE {e:.2e} (host-routed {host_e:.2e})",
            st.gated_tokens, st.gated_stalls, st.cpu_computed, st.loaded_behind
        );
        assert!(st.gated_tokens > 0 && st.cpu_computed > 0);
        assert!(behind || st.loaded_behind == 0);
        assert_eq!(all, want_all, "prefill never uses the CPU");
        assert_eq!(ids, want_ids, "load-behind {behind}");
        assert!(
            e <= bound,
            "gated cooperative decode NMSE {e:e} (load-behind {behind})"
        );
    }
}

/// Issue 49: one NaN on the hidden-state path on the GPU (a router weight, an output row) is an
/// error naming the file and the layer, in prefill and in the device-routed decode (a one-token
/// prompt), never a panic or an expert index out of range.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn nan_activations_on_the_gpu_are_an_error_naming_the_layer() {
    use common::damage::{damaged_fixture, tensor};
    let _ = gpu();
    let router = damaged_fixture("f16", |p, b| {
        let at = tensor(p, "blk.1.ffn_gate_inp.weight").offset as usize + 4 * 70;
        b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let output = damaged_fixture("f16", |p, b| {
        let at = tensor(p, "output.weight").offset as usize + 2 * 64 * 5;
        b[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    });
    let cases = [
        (
            &router.1,
            "non-finite activation at layer 1 (router logits)",
        ),
        (&output.1, "non-finite activation in the output logits"),
    ];
    for (path, needle) in cases {
        let m = path.to_str().unwrap();
        let prompts: [&[&str]; 2] = [&["-p", "The capital of France"], &["--no-chat", "-p", ""]];
        for prompt in prompts {
            let mut args = vec!["run", "-m", m, "--device", "cuda", "-n", "4", "--temp", "0"];
            args.extend_from_slice(prompt);
            let (ok, _, stderr) = common::hob(&args);
            assert!(!ok && !stderr.contains("panicked"), "{args:?}: {stderr}");
            let line = stderr
                .lines()
                .find(|l| l.starts_with("error:"))
                .unwrap_or("");
            assert!(
                line.contains(m) && line.contains(needle),
                "{args:?}: {stderr}"
            );
        }
    }
}

/// Issue 55, item 4: too little device memory for the resident weights, or for one expert slot,
/// is an error naming the flag, never a panic or a CUDA out-of-memory abort.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn too_little_device_memory_is_an_error_naming_the_flag() {
    let _ = gpu();
    let (_dir, path) = convert_fixture("f16,int4");
    let m = path.to_str().unwrap();
    for flags in [
        &["--gpu-mem", "0.0001"][..],
        &["--expert-cache", "0.00001"][..],
    ] {
        let mut args = vec!["run", "-m", m, "--device", "cuda", "-n", "2", "-p", "hi"];
        args.extend_from_slice(flags);
        let (ok, _, stderr) = common::hob(&args);
        assert!(!ok && !stderr.contains("panicked"), "{args:?}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or("");
        assert!(
            line.contains(flags[0]) || line.contains("slot"),
            "{args:?}: {stderr}"
        );
        println!("{flags:?}: {line}");
    }
}

/// Issue 55, item 2: page-locking the model file refused (here: its pages are already registered,
/// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; elsewhere a driver or memlock refusal) leaves
/// expert loads going through pinned staging buffers, with the all-resident logits.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn page_locking_refused_falls_back_to_staging_with_the_same_logits() {
    use cudarc::driver::sys;
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16,int4");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let want = greedy(&mut *gpu_session(&g, &file, &model, None), &r.input_ids, 8);
    let map = file.shared_map();
    let page = 4096;
    let len = map.len() / page * page;
    g.ctx.bind_to_thread().unwrap();
    let at = map.as_ptr() as *mut std::ffi::c_void;
    // SAFETY: at .. at + len is inside the live read-only mapping `map`, registered read-only
    // and unregistered below, before `map` is dropped.
    let res =
        unsafe { sys::cuMemHostRegister_v2(at, len, sys::CU_MEMHOSTREGISTER_READ_ONLY) }.result();
    res.expect("the test registers the file's pages first");
    let slots = file.n_layers() * file.n_experts() / 4;
    let mut c = EngineConfig::simple(0, Some(slots * file.expert_layout(0).padded_size));
    c.tuning.preload = false;
    c.prefetch = 2;
    let got = {
        let mut s = engine_session(&g, &model, c);
        let how = s.describe();
        println!("with the file's pages already locked: {how}");
        assert!(
            how.contains("staging") && !how.contains("page-locked"),
            "{how}"
        );
        let got = greedy(&mut *s, &r.input_ids, 8);
        assert!(s.expert_stats().misses() > 0, "a quarter cache loads");
        got
    };
    // SAFETY: `at` was registered above; no copy from it is in flight (the session is gone).
    unsafe { sys::cuMemHostUnregister(at) }.result().unwrap();
    assert_eq!(got.1, want.1, "greedy tokens");
    assert!(got.0 == want.0 && got.2 == want.2, "logits differ");
}

/// Issue 55, item 2: device memory taken by another program between two requests, so that a
/// longer prompt cannot grow the work buffers, is an error naming what could not be allocated
/// (never a panic or a sticky CUDA error); once the memory is back, the same session gives the
/// all-resident logits again.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn device_memory_refused_mid_run_is_an_error_and_the_session_recovers() {
    let g = gpu();
    let r = reference();
    let (_dir, path) = convert_fixture("f16,int4");
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    let want = greedy(&mut *gpu_session(&g, &file, &model, None), &r.input_ids, 8);
    let mut s = gpu_session(&g, &file, &model, None);
    s.forward(&r.input_ids[..2], Logits::Last).unwrap();
    // Take every free byte, in halving chunks down to 64 KiB.
    let mut hog = Vec::new();
    let mut chunk = 1usize << 30;
    while chunk >= 1 << 16 {
        // SAFETY: never read; only held, then freed.
        match unsafe { g.stream.alloc::<u8>(chunk) } {
            Ok(b) => hog.push(b),
            Err(_) => chunk /= 2,
        }
    }
    g.stream.synchronize().unwrap();
    println!(
        "took {} GiB",
        hog.iter().map(|b| b.len()).sum::<usize>() >> 30
    );
    s.truncate(0);
    let err = match s.forward(&r.input_ids, Logits::All) {
        Ok(_) => panic!("a prompt past the work buffers ran with no device memory free"),
        Err(e) => e.to_string(),
    };
    println!("with no device memory free: {err}");
    assert!(err.contains("cannot allocate"), "{err}");
    drop(hog);
    g.stream.synchronize().unwrap();
    let got = greedy(&mut *s, &r.input_ids, 8);
    assert_eq!(got.1, want.1, "greedy tokens after the memory came back");
    assert!(
        got.0 == want.0 && got.2 == want.2,
        "logits differ after recovery"
    );
}
