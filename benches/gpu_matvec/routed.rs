//! The routed launches' table of `gpu_matvec` (decode's routed experts).

use super::*;

/// Decode's routed form of the integer kinds, as the engine launches it (Gpu::matvec_sel; by
/// default k = 2 experts of Mixtral's shape): one launch for both experts' gate and up products
/// (four 14336x4096 matrices), one for their down products (two 4096x14336) on plain x as decode runs it (after the `swiglu` launch,
/// timed alone) and with each block staging SwiGLU itself (the form it replaced:
/// benches/results/2026-11-24-h100-routed.md), and the four plain launches the gate and up launch
/// replaces. Cold: each launch reads the next of several sets of matrices. The gate and up
/// outputs are checked bit for bit against plain launches (the same plan: the same sums).
/// Returns the failed checks.
pub(super) fn routed(gpu: &Gpu, bench: &BenchKernels, copy: f64, only: Option<&str>) -> usize {
    // GPU_MATVEC_ROUTED_K=8: more experts a launch (a launch's start then weighs less).
    let k: usize = std::env::var("GPU_MATVEC_ROUTED_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&k| (1..=SLOTS_MAX_K).contains(&k))
        .unwrap_or(2);
    // GPU_MATVEC_ROUTED_SHAPE=768x2048: an expert's ffn x dim (Qwen3-30B-A3B's; default Mixtral's).
    let (ffn, dim) = std::env::var("GPU_MATVEC_ROUTED_SHAPE")
        .ok()
        .and_then(|v| {
            let (f, d) = v.split_once('x')?;
            Some((f.parse().ok()?, d.parse().ok()?))
        })
        .filter(|&(f, d): &(usize, usize)| f > 0 && d > 0)
        .unwrap_or((14336, 4096));
    println!("Routed launches (k = {k} experts of {ffn} x {dim}, decode's form: Gpu::matvec_sel):");
    println!();
    println!("| kind | launch | bytes | cold µs | cold GB/s | cold share | warm µs | warm share |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut failed = 0;
    for kind in ["int8", "int4", "int4k", "int3", "int2", "int2k", "mxfp4"] {
        if only.is_some_and(|o| !o.split(',').any(|k| k == kind)) {
            continue;
        }
        let gu = TestMat::new(gpu, kind, ffn, dim, false, 2 * ROTATE_BYTES);
        let dn = TestMat::new(gpu, kind, dim, ffn, false, ROTATE_BYTES);
        let sets = (gu.mats.len() / (2 * k)).min(dn.mats.len() / k).max(1);
        let mut tables = Vec::new();
        for st in 0..sets {
            let at = |v: &[DevMat], i: usize| v[i % v.len()];
            let experts: Vec<(usize, f32, [DevMat; 3])> = (0..k)
                .map(|e| {
                    let gate = at(&gu.mats, 2 * k * st + e);
                    let up = at(&gu.mats, 2 * k * st + k + e);
                    (
                        e,
                        0.6 - 0.2 * e as f32,
                        [gate, up, at(&dn.mats, k * st + e)],
                    )
                })
                .collect();
            let tab = gpu
                .alloc::<u8>(
                    3 * SLOTS_MAX_K * std::mem::size_of::<DevMat>(),
                    "expert table",
                )
                .expect("alloc");
            let rt = gpu
                .alloc::<f32>(cuda::SLOT_ROUTES_LEN, "routes")
                .expect("alloc");
            let (tp, rp) = (cuda::ptr(&tab, &gpu.stream), cuda::ptr(&rt, &gpu.stream));
            gpu.put_slots(&SlotArgs::new(&experts).expect("slots"), tp, rp)
                .expect("put_slots");
            tables.push((tab, rt, tp, rp, experts));
        }
        let xd = upload(gpu, &random(dim, 11));
        let h = gpu
            .alloc::<f32>(2 * k * ffn, "gate and up outputs")
            .expect("alloc");
        let o = gpu.alloc::<f32>(k * dim, "down outputs").expect("alloc");
        let one = gpu.alloc::<f32>(ffn, "a plain output").expect("alloc");
        let s = &gpu.stream;
        let (xp, hp, op, onep) = (
            cuda::ptr(&xd, s),
            cuda::ptr(&h, s),
            cuda::ptr(&o, s),
            cuda::ptr(&one, s),
        );
        let routed = |t: &(_, _, u64, u64, _)| cuda::Routed {
            tab: t.2,
            routes: t.3,
            k,
        };
        let gate_up = |i: usize| {
            let t = &tables[i % sets];
            gpu.matvec_sel(
                &gu.mats[0],
                routed(t),
                (0, 2 * k),
                (xp, 0, false),
                (hp, ffn),
            )
            .expect("matvec_sel");
        };
        let down = |i: usize| {
            let t = &tables[i % sets];
            gpu.matvec_sel(&dn.mats[0], routed(t), (2, k), (hp, ffn, true), (op, dim))
                .expect("matvec_sel");
        };
        let down_plain = |i: usize| {
            let t = &tables[i % sets];
            gpu.matvec_sel(&dn.mats[0], routed(t), (2, k), (hp, ffn, false), (op, dim))
                .expect("matvec_sel");
        };
        // SwiGLU in place on a copy of the outputs (its values drift over the repeats; the
        // time does not depend on them).
        let scratch = gpu
            .alloc::<f32>(2 * k * ffn, "SwiGLU scratch")
            .expect("alloc");
        let sp = cuda::ptr(&scratch, s);
        let swiglu = |_: usize| {
            gpu.swiglu(sp, sp + (k * ffn * 4) as u64, k * ffn)
                .expect("swiglu");
        };
        // Gate, up and SwiGLU as decode launches them (Gpu::routed_gate_up: one launch where
        // matvec_qd_*_gu applies), and the same with the one-launch form off.
        let gate_up_glu = |i: usize| {
            let t = &tables[i % sets];
            gpu.routed_gate_up(&gu.mats[0], routed(t), xp, (hp, ffn))
                .expect("routed_gate_up");
        };
        let gate_up_glu2 = |i: usize| {
            gpu.set_routed_gu(false);
            gate_up_glu(i);
            gpu.set_routed_gu(true);
        };
        let plain4 = |i: usize| {
            for j in 0..2 * k {
                let m = &gu.mats[(2 * k * (i % sets) + j) % gu.mats.len()];
                gpu.matvec(m, xp, onep).expect("matvec");
            }
        };
        let rows: [(&str, usize, &RunAt); 7] = [
            ("gate + up, one launch", 2 * k * gu.bytes, &gate_up),
            (
                "gate + up + SwiGLU, one launch (_gu)",
                2 * k * gu.bytes,
                &gate_up_glu,
            ),
            (
                "gate + up + SwiGLU, two launches",
                2 * k * gu.bytes,
                &gate_up_glu2,
            ),
            ("gate + up, four plain launches", 2 * k * gu.bytes, &plain4),
            ("down (SwiGLU staged), one launch", k * dn.bytes, &down),
            (
                "down (plain x staged), one launch",
                k * dn.bytes,
                &down_plain,
            ),
            ("SwiGLU launch alone (bytes: down's)", k * dn.bytes, &swiglu),
        ];
        // The launch plan the routed kernels take (the plain one's: the same sums).
        println!(
            "| {kind} | plan {:?} | | | | | | |",
            gpu.q_plan(&gu.mats[0])
        );
        for (name, bytes, run) in rows {
            // (MXFP4 has no kernel staging SwiGLU: gpt-oss's activation runs in its own launch.)
            if kind == "mxfp4" && name.starts_with("down (SwiGLU staged)") {
                continue;
            }
            let cold = time(gpu, &bench.spin, run);
            let warm = time(gpu, &bench.spin, |_| run(0));
            println!(
                "| {kind} | {name} | {:.1} MB | {:.1} | {:.0} | {:.0}% | {:.1} | {:.0}% |",
                bytes as f64 / 1e6,
                cold * 1e6,
                bytes as f64 / cold / 1e9,
                100.0 * bytes as f64 / cold / copy,
                warm * 1e6,
                100.0 * bytes as f64 / warm / copy,
            );
        }
        // SwiGLU of gate and up in one launch against the two launches, bit for bit.
        let glu_rows = |one: bool| {
            gpu.set_routed_gu(one);
            gate_up_glu(0);
            gpu.set_routed_gu(true);
            download(gpu, &h, k * ffn)
        };
        let (g1, g2) = (glu_rows(true), glu_rows(false));
        if g1.iter().zip(&g2).any(|(a, b)| a.to_bits() != b.to_bits()) {
            println!("FAILED: {kind} gate + up + SwiGLU in one launch differs from two launches");
            failed += 1;
        }
        // The routed gate and up outputs against plain launches on the same matrices.
        gate_up(0);
        let got = download(gpu, &h, 2 * k * ffn);
        let experts = &tables[0].4;
        for j in 0..2 * k {
            let m = &experts[j % k].2[j / k];
            gpu.matvec(m, xp, onep).expect("matvec");
            let want = download(gpu, &one, ffn);
            if got[j * ffn..(j + 1) * ffn] != want[..] {
                println!("FAILED: {kind} routed output {j} differs from the plain launch's");
                failed += 1;
            }
        }
    }
    failed
}
