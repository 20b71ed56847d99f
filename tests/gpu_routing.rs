//! The CUDA backend's routing kernels against each other and against the CPU's routing rules
//! (model::routing, the rules the model tests hold to transformers): the decode token's fused
//! RMSNorm + router + top-k, the warp-a-token and one-thread forms of every rule, and
//! group-limited routing (GLM-4.5, DeepSeek). Without a GPU the tests count as ignored (CI has
//! none); tools/stage_gpu.sh runs them on the device machine with --include-ignored.

mod common;

use common::gpu::{from_gpu, gpu, to_gpu};
use common::nmse;
use hob::backend::cpu::CpuBackend;
use hob::backend::cuda::{self, CudaBackend};
use hob::format::DType;
use hob::model::routing::Routing;
use hob::model::{Backend, MoeBlock, RouteOut, RouteReads};
use hob::quant::Matrix;

use common::random::random;

/// The one-launch RMSNorm + router + top-k of a decode token (moe_route_norm) on Mixtral's shapes
/// (an f32 router of 8 rows over 4096, top 2): with the router copied in before the wait (each
/// thread's chunk of every row in registers, products added in row_dot's order) and without (a
/// warp a row through row_dot), the same normalized row as the RMSNorm launch, bit for bit, the
/// same routes bit for bit, and the CPU's experts. Qwen3-MoE's (128 rows over 2048, top 8) and
/// OLMoE's (64 over 2048) take the many-block form (moe_route_norm_wide), held to the same.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn norm_route_in_one_launch_matches_its_other_forms() {
    for (n, ne, k) in [(4096, 8, 2), (2048, 128, 8), (2048, 64, 8), (3584, 64, 8)] {
        for _ in 0..2 {
            norm_route_forms(n, ne, k);
        }
    }
}

fn norm_route_forms(n: usize, ne: usize, k: usize) {
    let g = gpu();
    let cpu = CpuBackend::new(2).unwrap();
    let mut b = CudaBackend::empty(g.clone()).unwrap();
    // Small router weights: logits of a few units, so the softmax weights are not saturated and
    // carry the logits' last bits.
    let bytes: Vec<u8> = random(ne * n, 7)
        .iter()
        .flat_map(|v| (0.02 * v).to_le_bytes())
        .collect();
    let router = Matrix::dense(DType::F32, ne, n, &bytes);
    b.make_resident(&router).unwrap();
    let w: Vec<f32> = random(n, 8).iter().map(|v| 1.0 + 0.5 * v).collect();
    b.make_resident_vector(&w).unwrap();
    let x = random(2 * n, 9);
    let xd = to_gpu(&b, &x);
    let mut host = Vec::new();
    let block = MoeBlock {
        norm: &w,
        router: &router,
        next: None,
        eps: 1e-5,
        routing: hob::model::routing::Routing::Softmax { renormalize: true },
        norm_bias: None,
        router_bias: None,
        ffn: &hob::model::experts::ExpertFfn::PLAIN,
    };
    let none = hob::model::ops::Route {
        expert: usize::MAX,
        weight: f32::NAN,
    };
    let bits = |r: &[hob::model::ops::Route]| -> Vec<(usize, u32)> {
        r.iter().map(|r| (r.expert, r.weight.to_bits())).collect()
    };

    // Two tokens: the RMSNorm launch, the router product, top-k (separate launches).
    let (mut xn2, mut lg2) = (b.alloc(2 * n).unwrap(), b.alloc(2 * ne).unwrap());
    let mut r2 = vec![none; 2 * k];
    b.norm_route(
        &xd,
        2,
        &block,
        RouteOut {
            xn: &mut xn2,
            logits: &mut lg2,
            routes: &mut r2,
            host: &mut host,
            reads: RouteReads::NONE,
        },
    )
    .unwrap();
    let xn_rows = from_gpu(&b, &xn2, 2 * n);
    let (mut cxn, mut clg) = (vec![0.0; n], vec![0.0; ne]);
    let mut cr = vec![none; k];
    cpu.norm_route(
        &x[..n].to_vec(),
        1,
        &block,
        RouteOut {
            xn: &mut cxn,
            logits: &mut clg,
            routes: &mut cr,
            host: &mut host,
            reads: RouteReads::NONE,
        },
    )
    .unwrap();
    let e = nmse(&xn_rows[..n], &cxn);
    println!("norm_route: RMSNorm launch vs CPU NMSE {e:.2e}, CPU routes {cr:?}");
    assert!(e <= 1e-10);

    let mut seen = Vec::new();
    for pre in [true, false] {
        g.set_router_preload(pre);
        let (mut xn1, mut lg1) = (b.alloc(n).unwrap(), b.alloc(ne).unwrap());
        let mut r1 = vec![none; k];
        b.norm_route(
            &xd,
            1,
            &block,
            RouteOut {
                xn: &mut xn1,
                logits: &mut lg1,
                routes: &mut r1,
                host: &mut host,
                reads: RouteReads::NONE,
            },
        )
        .unwrap();
        let xn = from_gpu(&b, &xn1, n);
        println!("norm_route one launch, router copied in first {pre}: routes {r1:?}");
        assert!(
            xn.iter()
                .zip(&xn_rows[..n])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "preload {pre}: xn differs from the RMSNorm launch's"
        );
        let experts: Vec<usize> = r1.iter().map(|r| r.expert).collect();
        assert_eq!(experts, cr.iter().map(|r| r.expert).collect::<Vec<_>>());
        for (a, c) in r1.iter().zip(&cr) {
            assert!((a.weight - c.weight).abs() <= 1e-5, "{r1:?} vs CPU {cr:?}");
        }
        seen.push(bits(&r1));
    }
    g.set_router_preload(true);
    assert_eq!(seen[0], seen[1], "the two forms' routes differ");
    // Not saturated: the weights are not 1 and 0.
    assert!(seen[0]
        .iter()
        .all(|&(_, w)| f32::from_bits(w) < 0.99 && f32::from_bits(w) > 0.01));
    norm_route_reads(&mut b, &xd, &block, seen[0].clone());
}

/// A decode token's reads with its routes (the engine's stacked gates' product and xn, in one
/// wait) give what the separate launch and read-backs give, bit for bit, and leave the routes
/// as they are without them.
fn norm_route_reads(
    b: &mut CudaBackend,
    xd: &cudarc::driver::CudaSlice<f32>,
    block: &MoeBlock<'_>,
    routes: Vec<(usize, u32)>,
) {
    let (n, ne) = (block.router.cols, block.router.rows);
    let k = routes.len();
    let rows = 3 * ne;
    let bytes: Vec<u8> = random(rows * n, 11)
        .iter()
        .flat_map(|v| (0.02 * v).to_le_bytes())
        .collect();
    let stacked = Matrix::dense(DType::F32, rows, n, &bytes);
    b.make_resident(&stacked).unwrap();
    let none = hob::model::ops::Route {
        expert: usize::MAX,
        weight: f32::NAN,
    };
    let (mut xn, mut lg, mut prod) = (
        b.alloc(n).unwrap(),
        b.alloc(ne).unwrap(),
        b.alloc(rows).unwrap(),
    );
    let (mut r, mut host) = (vec![none; k], Vec::new());
    let (mut prod_host, mut xn_host) = (vec![0f32; rows], vec![0f32; n]);
    let reads = RouteReads {
        product: Some((stacked, &mut prod, &mut prod_host[..])),
        xn: Some(&mut xn_host[..]),
    };
    let out = RouteOut {
        xn: &mut xn,
        logits: &mut lg,
        routes: &mut r,
        host: &mut host,
        reads,
    };
    b.norm_route(xd, 1, block, out).unwrap();
    let got: Vec<(usize, u32)> = r.iter().map(|r| (r.expert, r.weight.to_bits())).collect();
    assert_eq!(got, routes, "routes read with the product and xn differ");
    let same = |a: &[f32], c: &[f32]| a.iter().zip(c).all(|(a, c)| a.to_bits() == c.to_bits());
    assert!(same(&from_gpu(b, &xn, n), &xn_host), "xn");
    let mut prod2 = b.alloc(rows).unwrap();
    b.matmul(&stacked, &xn, 1, &mut prod2).unwrap();
    assert!(same(&from_gpu(b, &prod2, rows), &prod_host), "product");
    println!("norm_route with its reads ({rows} product rows, xn of {n}): bit for bit");
}

/// The routing kernels' forms against each other on logits with ties, probabilities that
/// underflow to zero and NaN: moe_route (route_one_warp; gpt-oss's rule and sparsemixer by one
/// thread, route_one) and route_topk (a warp a token: route_one_warp, gpt-oss's rule by
/// route_topk_softmax_warp) give the same experts and weights, bit for bit, for 4 to 128 experts
/// and top 1 to 4, for each routing rule (renormalized softmax, the softmax's own weights,
/// sparsemixer at k = 2, gpt-oss's top-k logits' softmax); and, without NaN, the CPU's routing's
/// experts and weights.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn warp_routing_matches_one_thread_routing() {
    let g = gpu();
    let b = CudaBackend::empty(g.clone()).unwrap();
    let p = |d: &cudarc::driver::CudaSlice<f32>| cuda::ptr(d, &g.stream);
    let (mut checked, mut tied) = (0, 0);
    for ne in [4usize, 8, 16, 32, 128] {
        // An identity router: the logits are x, exactly.
        let bytes: Vec<u8> = (0..ne * ne)
            .flat_map(|i| f32::from(u8::from(i / ne == i % ne)).to_le_bytes())
            .collect();
        let mut codes = g.alloc::<u8>(bytes.len(), "router").unwrap();
        g.stream.memcpy_htod(&bytes, &mut codes).unwrap();
        let m = Matrix::dense(DType::F32, ne, ne, &bytes);
        let dm = cuda::DevMat::new(&m, cuda::ptr(&codes, &g.stream), 0, 0);
        let rules = [
            Routing::Softmax { renormalize: true },
            Routing::Softmax { renormalize: false },
            Routing::SparseMixer { jitter_eps: 0.01 },
            Routing::TopkSoftmax,
        ];
        for (k, routing) in [1usize, 2, 4]
            .into_iter()
            .flat_map(|k| rules.map(|r| (k, r)))
        {
            let sparse = matches!(routing, Routing::SparseMixer { .. });
            if k > ne || (sparse && k != 2) {
                continue;
            }
            for trial in 0..64u64 {
                let r = random(ne, 1000 + trial * 37 + ne as u64 * 7 + k as u64);
                let logits: Vec<f32> = match trial % 4 {
                    // Coarse values: many ties.
                    0 => r.iter().map(|v| (v * 2.0).round()).collect(),
                    // Far apart: most probabilities underflow to exactly zero (ties at 0).
                    1 => r.iter().map(|v| v * 200.0).collect(),
                    // All equal.
                    2 => vec![0.5; ne],
                    _ => r.iter().map(|v| v * 4.0).collect(),
                };
                let mut logits = logits;
                if trial == 63 {
                    logits[ne / 2] = f32::NAN;
                }
                let x = to_gpu(&b, &logits);
                let (scratch, warp, one) = (
                    b.alloc(ne).unwrap(),
                    b.alloc(2 * k).unwrap(),
                    b.alloc(2 * k).unwrap(),
                );
                g.moe_route(&dm, p(&x), (k, routing), p(&warp), p(&scratch))
                    .unwrap();
                g.route(p(&x), 1, ne, (k, routing), p(&one)).unwrap();
                let (a, c) = (from_gpu(&b, &warp, 2 * k), from_gpu(&b, &one, 2 * k));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&a),
                    bits(&c),
                    "{routing:?} ne {ne} k {k} logits {logits:?}: moe_route {a:?} vs route_topk {c:?}"
                );
                // Against the CPU's routing (forward::route_softmax_topk, the path the model
                // tests hold to transformers' logits): the same experts in the same order (ties
                // to the lower index), weights within float rounding (expf against Rust's exp).
                if !logits.iter().any(|l| l.is_nan()) {
                    let mut cr = vec![
                        hob::model::Route {
                            expert: 0,
                            weight: 0.0
                        };
                        k
                    ];
                    routing.route(&logits, &mut cr);
                    for (j, r) in cr.iter().enumerate() {
                        assert_eq!(
                            a[j].to_bits() as usize,
                            r.expert,
                            "{routing:?} ne {ne} k {k} {logits:?}"
                        );
                        // (No margin for sparsemixer on all-zero logits: an infinite weight on
                        // both, which the forward pass refuses.)
                        let same = !r.weight.is_finite() && !a[k + j].is_finite();
                        assert!(
                            same || (a[k + j] - r.weight).abs() <= 2e-6,
                            "{routing:?} ne {ne} k {k} {logits:?}: weight {} vs CPU {}",
                            a[k + j],
                            r.weight
                        );
                    }
                }
                checked += 1;
                let mut sorted = logits.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                tied += usize::from(sorted.windows(2).take(k).any(|w| w[0] == w[1]));
            }
        }
    }
    println!("warp routing: {checked} cases, {tied} with a tie among the top k");
    assert!(
        tied > checked / 4,
        "too few ties exercised: {tied} of {checked}"
    );
}

/// GLM-4.5's and DeepSeek's group-limited routing on the device (route.cu route_grouped) against
/// the CPU's rule (model::routing::route_grouped, the one the model tests hold to transformers):
/// the same experts in the same order, weights within float rounding (expf against Rust's exp),
/// sigmoid and softmax scores, one group and groups kept by value, renormalized or not, scaled;
/// non-finite logits give NaN weights (the layer's refusal).
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn grouped_routing_on_the_gpu_matches_the_cpu_rule() {
    use hob::backend::cuda::{self, CudaBackend};
    use hob::model::routing::{Grouped, Routing};
    use hob::model::{Backend, Route};
    let g = gpu();
    let b = CudaBackend::empty(g.clone()).unwrap();
    let p = |d: &cudarc::driver::CudaSlice<f32>| cuda::ptr(d, &g.stream);
    let put = |v: &[f32]| {
        let mut d = b.alloc(v.len()).unwrap();
        b.upload(v, &mut d).unwrap();
        d
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut cases = 0;
    for ne in [16usize, 64, 128, 256] {
        for (softmax, groups, topk_groups) in
            [(false, 1, 1), (false, 8, 4), (true, 1, 1), (true, 8, 3)]
        {
            for (k, renormalize, scale) in [(1, true, 1.0f32), (4, false, 2.5), (8, true, 2.5)] {
                // The config refuses fewer candidates than k (ModelConfig's group check).
                if topk_groups * (ne / groups) < k {
                    continue;
                }
                let rule = Grouped {
                    softmax,
                    groups,
                    topk_groups,
                    renormalize,
                    scale,
                };
                for trial in 0..8 {
                    let mut logits: Vec<f32> = (0..ne).map(|_| 4.0 * next()).collect();
                    let bias: Vec<f32> = (0..ne).map(|_| 0.1 * next()).collect();
                    if trial == 7 {
                        logits[ne / 3] = f32::NAN;
                    }
                    let (x, bd, out) = (put(&logits), put(&bias), b.alloc(2 * k).unwrap());
                    g.route_grouped(p(&x), (1, ne, p(&bd)), (k, rule), p(&out))
                        .unwrap();
                    let mut got = vec![0.0f32; 2 * k];
                    b.download(&out, &mut got).unwrap();
                    let mut want = vec![Route::default(); k];
                    let routing = Routing::Grouped {
                        rule,
                        bias: Some(&bias),
                    };
                    routing.route(&logits, &mut want);
                    let what = format!("ne {ne} k {k} {rule:?} trial {trial}");
                    for (j, r) in want.iter().enumerate() {
                        if trial == 7 {
                            assert!(got[k + j].is_nan(), "{what}: weight {}", got[k + j]);
                            continue;
                        }
                        assert_eq!(
                            got[j].to_bits() as usize,
                            r.expert,
                            "{what}: {got:?} vs {want:?}"
                        );
                        let tol = 2e-6 * r.weight.abs().max(1.0);
                        assert!(
                            (got[k + j] - r.weight).abs() <= tol,
                            "{what}: weight {} vs CPU {}",
                            got[k + j],
                            r.weight
                        );
                    }
                    cases += 1;
                }
            }
        }
    }
    println!("grouped routing: {cases} cases");
}

/// A decode token's RMSNorm, router and group-limited routing in one launch (moe_route_norm with
/// a grouped rule: route.cu route_grouped_warp after the router's rows) on GLM-4.7-Flash's,
/// GLM-4.5-Air's and DeepSeek-V3's router shapes: with the router copied in before the wait and
/// without, the same normalized row and routes bit for bit; the CPU's experts in the CPU's order
/// and its weights within float rounding (model::routing::route_grouped, the rule the model tests
/// hold to transformers); the selection bias picks, never adds to the weights.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn grouped_norm_route_in_one_launch_matches_the_cpu_rule() {
    use hob::model::routing::Grouped;
    let g = gpu();
    let cpu = CpuBackend::new(2).unwrap();
    let mut b = CudaBackend::empty(g.clone()).unwrap();
    let none = hob::model::ops::Route {
        expert: usize::MAX,
        weight: f32::NAN,
    };
    let (mut cases, mut host) = (0, Vec::new());
    for (n, ne, k) in [(2048, 64, 4), (4096, 128, 8), (7168, 256, 8), (4096, 8, 2)] {
        let bytes: Vec<u8> = random(ne * n, 17)
            .iter()
            .flat_map(|v| (0.02 * v).to_le_bytes())
            .collect();
        let router = Matrix::dense(DType::F32, ne, n, &bytes);
        b.make_resident(&router).unwrap();
        let w: Vec<f32> = random(n, 18).iter().map(|v| 1.0 + 0.5 * v).collect();
        b.make_resident_vector(&w).unwrap();
        let sel: Vec<f32> = random(ne, 19).iter().map(|v| 0.05 * v).collect();
        b.make_resident_vector(&sel).unwrap();
        let x = random(n, 20);
        let xd = to_gpu(&b, &x);
        let groups = if ne >= 64 { 8 } else { 1 };
        for (softmax, top, renormalize, scale, biased) in [
            (false, 1, true, 1.8f32, true),
            (false, groups.min(4), true, 2.5, true),
            (true, groups.min(3), false, 1.0, false),
        ] {
            let groups = if top == 1 { 1 } else { groups };
            let rule = Grouped {
                softmax,
                groups,
                topk_groups: top,
                renormalize,
                scale,
            };
            let block = MoeBlock {
                norm: &w,
                router: &router,
                next: None,
                eps: 1e-5,
                routing: Routing::Grouped {
                    rule,
                    bias: biased.then_some(&sel[..]),
                },
                norm_bias: None,
                router_bias: None,
                ffn: &hob::model::experts::ExpertFfn::PLAIN,
            };
            let (mut cxn, mut clg) = (vec![0.0; n], vec![0.0; ne]);
            let mut cr = vec![none; k];
            let out = RouteOut {
                xn: &mut cxn,
                logits: &mut clg,
                routes: &mut cr,
                host: &mut host,
                reads: RouteReads::NONE,
            };
            cpu.norm_route(&x, 1, &block, out).unwrap();
            let mut seen = Vec::new();
            for pre in [true, false] {
                g.set_router_preload(pre);
                let (mut xn, mut lg) = (b.alloc(n).unwrap(), b.alloc(ne).unwrap());
                let mut r = vec![none; k];
                let out = RouteOut {
                    xn: &mut xn,
                    logits: &mut lg,
                    routes: &mut r,
                    host: &mut host,
                    reads: RouteReads::NONE,
                };
                b.norm_route(&xd, 1, &block, out).unwrap();
                let what = format!("{n} x {ne} top {k} {rule:?} bias {biased} preload {pre}");
                let e = nmse(&from_gpu(&b, &xn, n), &cxn);
                assert!(e <= 1e-10, "{what}: xn NMSE {e:.2e}");
                let experts: Vec<usize> = r.iter().map(|r| r.expert).collect();
                let want: Vec<usize> = cr.iter().map(|r| r.expert).collect();
                assert_eq!(experts, want, "{what}: {r:?} vs CPU {cr:?}");
                for (a, c) in r.iter().zip(&cr) {
                    let tol = 2e-6 * c.weight.abs().max(1.0);
                    assert!(
                        (a.weight - c.weight).abs() <= tol,
                        "{what}: {r:?} vs CPU {cr:?}"
                    );
                }
                let bits: Vec<u32> = r.iter().map(|r| r.weight.to_bits()).collect();
                seen.push((bits, from_gpu(&b, &xn, n)));
                cases += 1;
            }
            g.set_router_preload(true);
            assert_eq!(
                seen[0].0, seen[1].0,
                "{rule:?}: the two forms' weights differ"
            );
            let same = seen[0].1.iter().zip(&seen[1].1);
            assert!(same.into_iter().all(|(a, c)| a.to_bits() == c.to_bits()));
        }
    }
    println!("grouped norm_route in one launch: {cases} cases");
}
