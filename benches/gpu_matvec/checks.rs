//! The layout and input checks of `gpu_matvec` (run after its tables).

use super::*;

/// Layouts and inputs away from the benchmark's: groups that split a 16-byte chunk, ragged row
/// counts, x staged in several column tiles, and x outside [2^-40, 2^42) (K fitted to x).
pub(super) fn checks(gpu: &Gpu, cpu: &CpuBackend) -> usize {
    let mut failed = 0;
    let mut check = |name: String, t: &TestMat, x: &[f32], tchunks: Option<i32>| {
        let want = t.reference(cpu, x);
        let m = &t.mats[0];
        let xd = upload(gpu, x);
        let y = gpu.alloc::<f32>(m.rows as usize, "y").expect("alloc");
        let (xp, yp) = (cuda::ptr(&xd, &gpu.stream), cuda::ptr(&y, &gpu.stream));
        match tchunks {
            None => gpu.matvec(m, xp, yp).expect("matvec"),
            Some(tc) => {
                // The production kernel with a forced column tile (several tiles per row).
                let p = gpu.q_plan(m).expect("a plan");
                let f = &gpu.q_kernels(m).0.f;
                let c = LaunchConfig {
                    grid_dim: (p.grid, 1, 1),
                    block_dim: (p.block, 1, 1),
                    shared_mem_bytes: p.smem,
                };
                assert!(tc % 32 == 0 && tc <= p.tchunks);
                launch(gpu, f, c, m, xp, yp, (p.split, tc));
            }
        }
        let got = download(gpu, &y, m.rows as usize);
        let e = nmse(&got, &want);
        let bound = if m.is_ap8() || m.is_int2k() {
            1e-8
        } else if m.row_bytes % 16 == 0 {
            gpu.q_kernels(m).0.shape.nmse_bound()
        } else {
            1e-10
        }
        .max(t.cpu_floor());
        let ok = e <= bound && got.iter().all(|v| v.is_finite());
        println!(
            "check {name}: NMSE {e:.2e}{}",
            if ok { "" } else { "  FAILED" }
        );
        if !ok {
            failed += 1;
        }
    };
    let cases: [(&str, usize, usize); 18] = [
        ("int8/g16", 1001, 4096),
        ("int8/g128", 300, 4096),
        ("int4/g384", 100, 4608),
        ("int8/g48", 333, 4608),
        ("int8", 1, 64),
        ("int4/g16", 1001, 4096),
        ("int4/g32", 77, 14336),
        ("int4/g48", 130, 4608),
        ("int4/g128", 4099, 1024),
        ("int4", 3, 64),
        ("int2/g16", 1001, 4096),
        ("int2/g32", 999, 2048),
        ("int2/g48", 130, 4608),
        ("int2/g128", 8203, 128),
        ("int2", 5, 64),
        ("int8", 8203, 64),
        ("int4", 20000, 4096),
        ("int2", 4096, 28672),
    ];
    for (kind, rows, cols) in cases {
        let t = TestMat::new(gpu, kind, rows, cols, true, 0);
        check(
            format!("{kind} [{rows}, {cols}]"),
            &t,
            &random(cols, 11),
            None,
        );
    }
    for (kind, rows, cols, tc) in [
        ("int8", 515, 4096, 32),
        ("int4", 515, 14336, 64),
        ("int2", 515, 14336, 32),
        ("int4/g16", 100, 4096, 32),
        ("int2/g32", 70, 4096, 32),
    ] {
        let t = TestMat::new(gpu, kind, rows, cols, true, 0);
        check(
            format!("{kind} [{rows}, {cols}] column tiles of {tc} chunks"),
            &t,
            &random(cols, 12),
            Some(tc),
        );
    }
    // matvec_c32.cu's loop (ap8, int2k): ragged row tiles (int2k; ap8's rows are whole 64s),
    // rows of 2 to 448 chunks, one partial step.
    for (kind, rows, cols) in [
        ("ap8@3", 1024, 4096),
        ("ap8@2", 64, 64),
        ("ap8@8", 320, 14336),
        ("ap8@5", 4096, 768),
        ("ap8@4", 64, 192),
        ("ap8@6", 64, 1088),
        ("ap8@7", 128, 2048),
        ("int2k", 1001, 4096),
        ("int2k", 3, 64),
        ("int2k", 70, 14336),
        ("int2k", 9, 96),
    ] {
        let t = TestMat::new(gpu, kind, rows, cols, true, 0);
        check(
            format!("{kind} [{rows}, {cols}]"),
            &t,
            &random(cols, 14),
            None,
        );
    }
    for kind in ["int8", "int4", "int2", "ap8@3", "int2k"] {
        // (ap8's rows come in whole 64s.)
        let rows = if kind.starts_with("ap8") { 1024 } else { 1001 };
        let t = TestMat::new(gpu, kind, rows, 4096, true, 0);
        let x = random(4096, 13);
        for (what, f) in [
            ("x * 2^50", 2f32.powi(50)),
            ("x * 2^-70", 2f32.powi(-70)),
            ("x * 0", 0.0),
        ] {
            let xs: Vec<f32> = x.iter().map(|v| v * f).collect();
            check(format!("{kind} [{rows}, 4096] {what}"), &t, &xs, None);
        }
        let mut xs = x.clone();
        xs[77] = 1e20;
        check(
            format!("{kind} [{rows}, 4096] one x of 1e20"),
            &t,
            &xs,
            None,
        );
    }
    failed
}
