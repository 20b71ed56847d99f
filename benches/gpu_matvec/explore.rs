//! `gpu_matvec explore`: every block size and split of hob's integer kernels, and the ceilings.

use super::*;

/// Time hob's integer kernels at every block size and split on the bench shapes (cold), check each
/// result, and print the table beside the production plan's pick; then the ceilings: a launch
/// doing nothing, and a kernel that only reads as many bytes as each matrix has.
pub(super) fn explore_candidates(
    gpu: &Gpu,
    bench: &BenchKernels,
    cpu: &CpuBackend,
    copy: f64,
) -> usize {
    let mut failed = 0;
    // GPU_MATVEC_KINDS=int2 and GPU_MATVEC_EXPLORE=dp4a,scalar: only those kinds and candidates.
    let kinds = std::env::var("GPU_MATVEC_KINDS").ok();
    let only = std::env::var("GPU_MATVEC_EXPLORE").ok();
    let wanted = |list: &Option<String>, name: &str| {
        list.as_deref()
            .is_none_or(|o| o.split(',').any(|k| k == name))
    };
    for kind in ["int8", "int4", "int2"] {
        if !wanted(&kinds, kind) {
            continue;
        }
        let code = name_kind(kind);
        for (rows, cols) in SHAPES {
            // GPU_MATVEC_SHAPES=4096x14336: only those shapes (e.g. for a profiler's launch count).
            if std::env::var("GPU_MATVEC_SHAPES")
                .is_ok_and(|o| !o.split(',').any(|s| s == format!("{rows}x{cols}")))
            {
                continue;
            }
            let t = TestMat::new(gpu, kind, rows, cols, false, ROTATE_BYTES);
            let x = random(cols, 7);
            let want = t.reference(cpu, &x);
            let xd = upload(gpu, &x);
            let y = gpu.alloc::<f32>(rows, "y").expect("alloc");
            let (xp, yp) = (cuda::ptr(&xd, &gpu.stream), cuda::ptr(&y, &gpu.stream));
            let n = t.mats[0].row_bytes as usize / 16;
            let i = (code - 3) as usize;
            // (name, kernel, the NMSE bound its results are checked against)
            let mut cands: Vec<(String, &QKernel, f64)> = vec![
                ("scalar".into(), &gpu.kernels.matvec_q[i], 1e-10),
                (
                    "dp4a".into(),
                    &gpu.kernels.matvec_qd[i],
                    gpu.kernels.matvec_qd[i].shape.nmse_bound(),
                ),
            ];
            if let Some(q) = &gpu.kernels.matvec_qm {
                cands.push(("mma".into(), &q[i], 1e-10));
            }
            for (name, q, staged) in &bench.qm {
                if q.shape.kind == code {
                    cands.push((name.clone(), q, if *staged { 1e-10 } else { f64::INFINITY }));
                }
            }
            cands.retain(|(name, _, _)| wanted(&only, name));
            for (cname, q, bound) in cands {
                let bound = bound.max(cpu_floor(code));
                let f = &q.f;
                let mut best = (f64::MAX, String::new());
                let max_threads = f.max_threads_per_block().unwrap_or(1024) as u32;
                for warps in [4usize, 8, 12, 16, 24, 32] {
                    let smem = q_smem(&q.shape, warps, n);
                    let block = 32 * warps as u32;
                    if block > max_threads || smem > gpu.q_limits.smem_max {
                        continue;
                    }
                    let per_sm = f
                        .occupancy_max_active_blocks_per_multiprocessor(block, smem, None)
                        .unwrap_or(0) as usize;
                    if per_sm == 0 {
                        continue;
                    }
                    for split in [1usize, 2, 4, 8, 16] {
                        if warps % split != 0 || (split > 1 && q.shape.step_chunks() * split > n) {
                            continue;
                        }
                        let tiles = rows.div_ceil(warps / split * q.shape.rows);
                        let grid = tiles.min(gpu.q_limits.sm_count * per_sm);
                        let c = LaunchConfig {
                            grid_dim: (grid as u32, 1, 1),
                            block_dim: (block, 1, 1),
                            shared_mem_bytes: smem as u32,
                        };
                        let qa = (split as i32, n as i32);
                        let s = time(gpu, &bench.spin, |i| {
                            launch(gpu, f, c, &t.mats[i % t.mats.len()], xp, yp, qa)
                        });
                        launch(gpu, f, c, &t.mats[0], xp, yp, qa);
                        let e = nmse(&download(gpu, &y, rows), &want);
                        if e > bound {
                            failed += 1;
                        }
                        if std::env::var_os("GPU_MATVEC_EXPLORE_ALL").is_some() {
                            println!(
                                "  {kind} {rows}x{cols} {cname} warps {warps} split {split} grid {grid} ({per_sm}/SM): {:.2} µs {:.1}%",
                                s * 1e6,
                                100.0 * t.bytes as f64 / s / copy
                            );
                        }
                        if s < best.0 {
                            best = (
                                s,
                                format!(
                                    "warps {warps} split {split} grid {grid} ({per_sm}/SM, {} regs) NMSE {e:.1e}",
                                    q.shape.regs
                                ),
                            );
                        }
                    }
                }
                println!(
                    "explore {kind} {rows}x{cols} {cname}: {:.2} µs {:.1}% at {}",
                    best.0 * 1e6,
                    100.0 * t.bytes as f64 / best.0 / copy,
                    best.1,
                );
            }
            let auto = gpu.q_plan(&t.mats[0]);
            let prod = &gpu.q_kernels(&t.mats[0]).0.shape;
            println!(
                "production {kind} {rows}x{cols}: {} kernel, {auto:?}",
                if prod.mma() {
                    "mma"
                } else if prod.dp_parts > 0 {
                    "dp4a"
                } else {
                    "scalar"
                }
            );
            // The ceiling: reading these bytes and nothing else (one launch, same rotation).
            let words = (t.bytes / 16) as u64;
            let sink = gpu.alloc::<u32>(1, "sink").expect("alloc");
            let sp = cuda::ptr(&sink, &gpu.stream);
            let c = LaunchConfig {
                grid_dim: (gpu.q_limits.sm_count as u32 * 8, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // Seconds to read the first `words` 16-byte words of each matrix copy.
            let read = |words: u64| {
                time(gpu, &bench.spin, |i| {
                    let mut b = gpu.stream.launch_builder(&bench.read);
                    let p = t.mats[i % t.mats.len()].codes;
                    b.arg(&p);
                    b.arg(&words);
                    b.arg(&sp);
                    // SAFETY: bench_read reads `words` 16-byte words from p (inside the matrix
                    // copy: codes, scales and mins are contiguous there) and writes at most
                    // sink[0].
                    unsafe { b.launch(c) }.expect("read");
                })
            };
            let s = read(words);
            println!(
                "ceiling {kind} {rows}x{cols}: reading {:.1} MB takes {:.2} µs, {:.1}% of the copy figure",
                t.bytes as f64 / 1e6,
                s * 1e6,
                100.0 * t.bytes as f64 / s / copy
            );
            // The same read launched as hob launches its kernels (dependent launch: the next
            // launch starts early, each waits after its first loads), over grid, block and depth.
            let (mut best, mut forms) = ((f64::MAX, String::new()), 0);
            for (u, f) in &bench.read_pdl {
                let max_threads = f.max_threads_per_block().unwrap_or(256) as u32;
                for threads in [256u32, 512, 1024] {
                    for per_sm in [1u32, 2, 4, 8, 16] {
                        if threads > max_threads || threads * per_sm > 2048 {
                            continue;
                        }
                        let c = LaunchConfig {
                            grid_dim: (gpu.q_limits.sm_count as u32 * per_sm, 1, 1),
                            block_dim: (threads, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        let s = time(gpu, &bench.spin, |i| {
                            let p = t.mats[i % t.mats.len()].codes;
                            let mut params = [
                                (&p) as *const _ as *mut std::ffi::c_void,
                                (&words) as *const _ as *mut std::ffi::c_void,
                                (&sp) as *const _ as *mut std::ffi::c_void,
                            ];
                            // SAFETY: bench_read_pdl_* take (pointer, u64, pointer), as params
                            // holds; they read `words` 16-byte words from p (inside the matrix
                            // copy) and write at most sink[0], after their wait.
                            unsafe { gpu.launch_raw(f, c, &mut params) }.expect("read");
                        });
                        forms += 1;
                        if s < best.0 {
                            best = (s, format!("{threads} threads, {per_sm} blocks an SM, {u} words a thread in flight"));
                        }
                    }
                }
            }
            println!(
                "ceiling {kind} {rows}x{cols}, dependent launch (best of {forms} forms): {:.2} µs, {:.1}% of the copy figure, at {}",
                best.0 * 1e6,
                100.0 * t.bytes as f64 / best.0 / copy,
                best.1
            );
            // The codes alone: read in one stream, and in the kernels' row patterns (best split).
            let m0 = t.mats[0];
            let n16 = m0.row_bytes / 16;
            let code_bytes = rows as f64 * m0.row_bytes as f64;
            let s = read((rows * m0.row_bytes as usize / 16) as u64);
            let mut line = format!(
                "pattern {kind} {rows}x{cols}: codes {:.1} MB in one stream {:.2} µs ({:.1}%)",
                code_bytes / 1e6,
                s * 1e6,
                100.0 * code_bytes / s / copy
            );
            for (what, f) in [
                ("mma", &bench.read_rows[0]),
                ("scalar", &bench.read_rows[1]),
            ] {
                let rc = LaunchConfig {
                    grid_dim: (gpu.q_limits.sm_count as u32, 1, 1),
                    block_dim: (512, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut best = (f64::MAX, 0);
                for split in [1i32, 2, 4, 8, 16] {
                    let rows_i = rows as i32;
                    let s = time(gpu, &bench.spin, |i| {
                        let mut b = gpu.stream.launch_builder(f);
                        let p = t.mats[i % t.mats.len()].codes;
                        b.arg(&p);
                        b.arg(&rows_i);
                        b.arg(&n16);
                        b.arg(&split);
                        b.arg(&sp);
                        // SAFETY: bench_read_rows_* read rows x n16 16-byte words from p (the
                        // matrix copy's codes) and writes at most sink[0].
                        unsafe { b.launch(rc) }.expect("read_rows");
                    });
                    if s < best.0 {
                        best = (s, split);
                    }
                }
                line += &format!(
                    "; {what} pattern {:.2} µs ({:.1}%, split {})",
                    best.0 * 1e6,
                    100.0 * code_bytes / best.0 / copy,
                    best.1
                );
            }
            println!("{line}");
        }
    }
    let s = time(gpu, &bench.spin, |_| {
        let b = gpu.stream.launch_builder(&bench.empty);
        let c = LaunchConfig {
            grid_dim: (gpu.q_limits.sm_count as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = b;
        // SAFETY: bench_empty takes nothing and does nothing.
        unsafe { b.launch(c) }.expect("empty");
    });
    println!(
        "ceiling: an empty launch takes {:.2} µs back to back",
        s * 1e6
    );
    failed
}
