//! The CUDA backend against the CPU backend (llama.cpp's test-backend-ops idea): every op on
//! random inputs by normalized MSE (whole models and the expert engine: tests/gpu_engine.rs).
//! Without a GPU the tests count as ignored (CI has none); tools/stage_gpu.sh runs them on the
//! device machine with --include-ignored.
//!
//! NMSE bounds, per op (documented in cuda/README.md):
//! - matmul, decode (matvec), every kind: 1e-10 (the same dequantized values; only the summation
//!   order differs), 1e-8 for the integer kinds' dp4a kernels (x rounded to 16 bits per chunk:
//!   Gpu::matvec_nmse_bound) and for every integer kind where the CPU's kernel rounds x so (AVX-512
//!   VNNI: hob::quant::packed_rounds_x); prefill (t > 1) of f32 weights (SGEMM): 1e-10; prefill
//!   of the other kinds (tokens and weights in f16, tensor-core GEMM with f32 accumulation): 1e-5;
//! - RMSNorm, RoPE, add: 1e-10; attention over the f16 KV cache: 1e-6 (K and V are rounded to f16);
//! - end to end, logits of the tiny fixture and the demo model: 1e-5, greedy tokens identical.

mod common;

use common::gpu::{from_gpu, gpu, to_gpu};
use common::nmse;
use hob::backend::cpu::CpuBackend;
use hob::backend::cuda::CudaBackend;
use hob::format::{DType, Variant};
use hob::model::ops::{AttentionShape, AttnPrep, QkvStep};
use hob::model::Backend;
use hob::quant::{quantize_matrix, Matrix};

use common::random::random;

/// The stored bytes of a [rows, cols] matrix in `kind` ("f32", "f16", "bf16" dense; "int8",
/// "int4/g32"... quantized).
fn stored(kind: &str, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Option<Variant>, DType) {
    let src = random(rows * cols, seed);
    if let Some(dt) = DType::parse(kind) {
        let bytes = match dt {
            DType::F32 => src.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => src
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::Bf16 => src
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
        return (bytes, None, dt);
    }
    let v = Variant::parse(kind, None).unwrap();
    let layout = v.matrix_layout(rows, cols).unwrap();
    (quantize_matrix(v, &layout, &src), Some(v), DType::F32)
}

fn matrix<'a>(
    bytes: &'a [u8],
    v: Option<Variant>,
    dt: DType,
    rows: usize,
    cols: usize,
) -> Matrix<'a> {
    match v {
        None => Matrix::dense(dt, rows, cols, bytes),
        Some(v) => {
            let l = v.matrix_layout(rows, cols).unwrap();
            Matrix::from_view(l.view(v, bytes))
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn matmul_matches_the_cpu_for_every_storage_kind() {
    let g = gpu();
    let cpu = CpuBackend::new(2).unwrap();
    // (kind, rows, cols): vectorized layouts, and ones whose rows are not 16-byte multiples.
    let cases = [
        ("f32", 70, 256),
        ("f16", 96, 512),
        ("bf16", 64, 384),
        ("int8", 80, 512),
        ("int4", 96, 512),
        ("int4/g32", 40, 256),
        ("int2", 72, 512),
        ("int2/g16", 24, 128),
        // The fixture's expert shapes: rows of one and two 16-byte chunks of int2 codes.
        ("int2", 128, 64),
        ("int2", 64, 128),
        ("f16", 33, 36),
        ("int8/g16", 17, 48),
        ("int4/g16", 19, 48),
        // Tall float matrices (an odd last row).
        ("f32", 8193, 64),
        ("f16", 8203, 128),
        ("bf16", 8193, 256),
        // 8192 rows and more take the 4-rows-per-warp kernels (a ragged last warp here).
        ("int8", 8203, 64),
        ("int4", 8203, 64),
        ("int2", 8203, 128),
        // Mixtral's down width and a 4096-wide row: on sm_90 the plain int2 kernel's ring of 3
        // with a ring step issued before it waits (matvec_q.cu matvec_q_body, LONE).
        ("int2", 40, 14336),
        ("int2", 300, 4096),
        // Wider than the x a block can stage at once (~23k columns): the column-tiled plans.
        ("int8", 40, 32768),
        ("int4", 40, 32768),
        ("int2", 40, 32768),
        // MXFP4 (gpt-oss's experts): the dp4a kernel (matvec_qd_mxfp4) on sm_61 and later, a
        // short row, gpt-oss-20b's 2880, an odd row count and Mixtral's width.
        ("mxfp4", 64, 256),
        ("mxfp4", 5760, 2880),
        ("mxfp4", 2887, 2880),
        ("mxfp4", 40, 14336),
        // int3 (matvec_qd_int3): 16-byte rows (columns a multiple of 128), Qwen3-MoE's expert
        // shapes, the column-tiled plans, a wider group; and rows of 24 * 9 bytes (matvec_any).
        ("int3", 96, 512),
        ("int3", 768, 2048),
        ("int3", 2048, 768),
        ("int3", 40, 32768),
        ("int3/g128", 300, 4096),
        ("int3", 64, 576),
        // int4k (matvec_qd_int4k): Qwen3-MoE's expert shapes, a short row, the column-tiled
        // plans, Mixtral's down width; 44 groups a row (DeepSeek-V2-Lite's 1408): loads in
        // registers where sm_90 takes the ring for the others.
        ("int4k", 130, 1408),
        ("int4k", 96, 256),
        ("int4k", 768, 2048),
        ("int4k", 2048, 768),
        ("int4k", 40, 32768),
        ("int4k", 300, 14336),
        // int2k (matvec_q_int2k: int2's scalar loop, a group a 16-column piece).
        ("int2k", 96, 256),
        ("int2k", 768, 2048),
        ("int2k", 2048, 768),
        ("int2k", 40, 32768),
        ("int2k", 130, 1408),
    ];
    let mut worst = 0.0f64;
    for (i, &(kind, rows, cols)) in cases.iter().enumerate() {
        let (bytes, v, dt) = stored(kind, rows, cols, i as u64 + 1);
        let m = matrix(&bytes, v, dt, rows, cols);
        let mut b = CudaBackend::empty(g.clone()).unwrap();
        b.make_resident(&m).unwrap();
        // int4 g64 and g32 prefill products run on gemm_q4h, int4k on gemm_q4k, MXFP4 on
        // gemm_mx4h (64 or 128 tokens a block, K in parts).
        let ts: &[usize] = if ["int4", "int4/g32", "int4k", "mxfp4"].contains(&kind) {
            &[1, 5, 70, 200]
        } else {
            &[1, 5]
        };
        for &t in ts {
            let x = random(t * cols, 100 + i as u64);
            let mut want = vec![0.0; t * rows];
            cpu.matmul_f32(&m, &x, t, &mut want);
            let xd = to_gpu(&b, &x);
            let mut yd = b.alloc(t * rows).unwrap();
            b.matmul(&m, &xd, t, &mut yd).unwrap();
            let got = from_gpu(&b, &yd, t * rows);
            let e = nmse(&got, &want);
            println!("matmul {kind:>9} [{rows:>4}, {cols:>5}] t={t}: NMSE {e:.2e}");
            let bound = if t == 1 {
                // The CPU's integer kernels may round x to 16 bits per group too (AVX-512 VNNI):
                // then the GPU's exact kernels meet the bound of its 16-bit x.
                let packed = kind.starts_with("int") || kind == "mxfp4";
                let cpu = if packed && hob::quant::packed_rounds_x() {
                    1e-8
                } else {
                    0.0
                };
                g.matvec_nmse_bound(&m).max(cpu)
            } else if kind == "f32" {
                1e-10
            } else {
                1e-5
            };
            assert!(e <= bound, "{kind} [{rows}, {cols}] t={t}: NMSE {e:e}");
            worst = worst.max(e);
        }
    }
    println!("matmul worst NMSE {worst:.2e}");
}

/// One token's q, k and v from integer matrices in one launch (`matmul_qkv`: matvec_qd_*_3)
/// give the three `matmul`s' bits: gpt-oss-20b's shapes (4096 and 512 rows of 2880), Qwen3's
/// (4096 and 512 of 2048), and a layout the one launch does not take (int4/g32: three launches).
/// `matmul_pair` of (k, q) likewise (DeepSeek-V2-Lite's kv_a and q: 576 and 3072 rows of 2048,
/// the f16 case).
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn integer_qkv_in_one_launch_equals_three_products() {
    let g = gpu();
    for (c, &(kind, q_rows, kv_rows, cols)) in [
        ("int8", 4096, 512, 2880),
        ("int4", 4096, 512, 2048),
        ("int2", 2048, 256, 2048),
        ("int4/g32", 1024, 256, 512),
        ("int8", 3072, 576, 2048),
        ("f16", 3072, 576, 2048),
    ]
    .iter()
    .enumerate()
    {
        let seed = 40 + 3 * c as u64;
        let rows = [q_rows, kv_rows, kv_rows];
        let st: Vec<_> = (0..3)
            .map(|i| stored(kind, rows[i], cols, seed + i as u64))
            .collect();
        let m: Vec<_> = (0..3)
            .map(|i| matrix(&st[i].0, st[i].1, st[i].2, rows[i], cols))
            .collect();
        let mut b = CudaBackend::empty(g.clone()).unwrap();
        for w in &m {
            b.make_resident(w).unwrap();
        }
        let xd = to_gpu(&b, &random(cols, seed + 7));
        let mut one: Vec<_> = rows.iter().map(|&r| b.alloc(r).unwrap()).collect();
        let [q, k, v] = &mut one[..] else {
            unreachable!()
        };
        b.matmul_qkv([&m[0], &m[1], &m[2]], &xd, 1, [q, k, v])
            .unwrap();
        for i in 0..3 {
            let mut y = b.alloc(rows[i]).unwrap();
            b.matmul(&m[i], &xd, 1, &mut y).unwrap();
            let (got, want) = (from_gpu(&b, &one[i], rows[i]), from_gpu(&b, &y, rows[i]));
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, w)| a.to_bits() == w.to_bits());
            assert!(
                same,
                "{kind} product {i} of q, k, v differs from its own matmul"
            );
        }
        let mut pair: Vec<_> = [kv_rows, q_rows]
            .iter()
            .map(|&r| b.alloc(r).unwrap())
            .collect();
        let [pk, pq] = &mut pair[..] else {
            unreachable!()
        };
        b.matmul_pair([&m[1], &m[0]], &xd, 1, [pk, pq]).unwrap();
        for (j, i) in [(0, 1), (1, 0)] {
            let same = from_gpu(&b, &pair[j], rows[i])
                .iter()
                .zip(&from_gpu(&b, &one[i], rows[i]))
                .all(|(a, w)| a.to_bits() == w.to_bits());
            assert!(
                same,
                "{kind} product {i} of the pair differs from its own matmul"
            );
        }
        println!(
            "q, k, v in one launch, and (k, q): {kind} [{q_rows} / {kv_rows}, {cols}] bit for bit"
        );
    }
}

/// A decode token's integer projection with its residual add (matmul_add: one launch,
/// matvec_qd_*_add, where x is one column tile) gives the bits of its matmul then add_assign, on
/// the ring's layouts, those with loads in registers (22 groups a row) and wider rows.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn integer_projection_with_its_residual_add_equals_product_then_add() {
    let g = gpu();
    for (c, &(kind, rows, cols)) in [
        ("int8", 2048, 2048),
        ("int8", 2048, 2816),
        ("int4", 2048, 2048),
        ("int4", 2048, 1408),
        ("int4/g32", 2048, 2816),
        ("int2", 1024, 2048),
        ("int8", 4096, 14336),
    ]
    .iter()
    .enumerate()
    {
        let seed = 90 + 5 * c as u64;
        let st = stored(kind, rows, cols, seed);
        let m = matrix(&st.0, st.1, st.2, rows, cols);
        let mut b = CudaBackend::empty(g.clone()).unwrap();
        b.make_resident(&m).unwrap();
        let xd = to_gpu(&b, &random(cols, seed + 1));
        let res = random(rows, seed + 2);
        let (mut fused, mut want) = (to_gpu(&b, &res), to_gpu(&b, &res));
        let (mut tmp, mut y) = (b.alloc(rows).unwrap(), b.alloc(rows).unwrap());
        b.matmul_add(&m, &xd, 1, &mut tmp, &mut fused).unwrap();
        b.matmul(&m, &xd, 1, &mut y).unwrap();
        b.add_assign(&mut want, &y, rows).unwrap();
        let (got, want) = (from_gpu(&b, &fused, rows), from_gpu(&b, &want, rows));
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, w)| a.to_bits() == w.to_bits());
        assert!(
            same,
            "{kind} [{rows}, {cols}]: the residual add in the product differs"
        );
        println!("{kind} [{rows}, {cols}]: matmul_add bit for bit with matmul + add_assign");
    }
}

/// A decode token embedded on the device (stage_token, then embed_staged, as a recorded step
/// launches it) gives the host conversion's row bit for bit, for every storage kind a table may
/// have, and the staged id is read at launch time (two tokens staged in turn).
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn device_embedding_matches_the_host_rows() {
    let g = gpu();
    for (i, kind) in ["f32", "f16", "bf16", "int8", "int4", "int2", "int4/g32"]
        .into_iter()
        .enumerate()
    {
        let (rows, cols) = (300, 256);
        let (bytes, v, dt) = stored(kind, rows, cols, 40 + i as u64);
        let m = matrix(&bytes, v, dt, rows, cols);
        let mut b = CudaBackend::empty(g.clone()).unwrap();
        b.make_resident(&m).unwrap();
        let mut d = b.alloc(cols).unwrap();
        for token in [7u32, 299] {
            assert!(
                b.stage_token(&m, token, 5).unwrap(),
                "{kind}: the device embeds"
            );
            b.embed_staged(&m, &mut d).unwrap();
            let got = from_gpu(&b, &d, cols);
            let mut want = vec![0.0; cols];
            m.row_to_f32(token as usize, &mut want);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{kind}: token {token}'s row differs from the host's");
        }
        // A token past the table is an error, not a read past it.
        assert!(b.stage_token(&m, rows as u32, 5).is_err(), "{kind}");
    }
    println!("device embedding: every kind bit-identical to the host's rows");
}

#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn norm_rope_add_and_attention_match_the_cpu() {
    let g = gpu();
    let cpu = CpuBackend::new(2).unwrap();
    let mut b = CudaBackend::empty(g).unwrap();
    let (t, width) = (6usize, 128usize);

    let w = random(width, 1);
    b.make_resident_vector(&w).unwrap();
    let x = random(t * width, 2);
    let (mut want, xd) = (vec![0.0; 3 * width], to_gpu(&b, &x));
    cpu.rms_norm(&x, 2..5, &w, 1e-5, &mut want).unwrap();
    let mut od = b.alloc(3 * width).unwrap();
    b.rms_norm(&xd, 2..5, &w, 1e-5, &mut od).unwrap();
    let e = nmse(&from_gpu(&b, &od, 3 * width), &want);
    println!("rms_norm NMSE {e:.2e}");
    assert!(e <= 1e-10);

    let inv_freq: Vec<f32> = (0..16)
        .map(|i| 1.0 / 10000f32.powf(i as f32 / 16.0))
        .collect();
    b.make_resident_vector(&inv_freq).unwrap();
    let mut want = x.clone();
    cpu.rope(&mut want, t, width, 37, &inv_freq).unwrap();
    let mut xd = to_gpu(&b, &x);
    b.rope(&mut xd, t, width, 37, &inv_freq).unwrap();
    let e = nmse(&from_gpu(&b, &xd, t * width), &want);
    println!("rope NMSE {e:.2e}");
    assert!(e <= 1e-10);

    let y = random(t * width, 3);
    let mut want = x.clone();
    cpu.add_assign(&mut want, &y, t * width).unwrap();
    let (mut xd, yd) = (to_gpu(&b, &x), to_gpu(&b, &y));
    b.add_assign(&mut xd, &yd, t * width).unwrap();
    assert_eq!(from_gpu(&b, &xd, t * width), want);

    // The ops of the other families: LayerNorm with a bias (Phi-3.5-MoE), a bias on each row, a
    // scale, a shared expert's sigmoid-gated SwiGLU (Qwen2-MoE).
    let bias = random(width, 4);
    b.make_resident_vector(&bias).unwrap();
    let mut want = vec![0.0; 3 * width];
    cpu.layer_norm(&x, 2..5, (&w, &bias), 1e-5, &mut want)
        .unwrap();
    let (xd, mut od) = (to_gpu(&b, &x), b.alloc(3 * width).unwrap());
    b.layer_norm(&xd, 2..5, (&w, &bias), 1e-5, &mut od).unwrap();
    let e = nmse(&from_gpu(&b, &od, 3 * width), &want);
    println!("layer_norm NMSE {e:.2e}");
    assert!(e <= 1e-10);
    let mut want = x.clone();
    cpu.add_rows(&mut want, t, &bias).unwrap();
    cpu.scale(&mut want, t * width, 0.75).unwrap();
    let mut xd = to_gpu(&b, &x);
    b.add_rows(&mut xd, t, &bias).unwrap();
    b.scale(&mut xd, t * width, 0.75).unwrap();
    assert_eq!(from_gpu(&b, &xd, t * width), want);
    // With a gate logit per row, and without (GLM-4.5's shared expert and dense MLP).
    let sl = random(t, 5);
    for gated in [true, false] {
        let mut want = x.clone();
        cpu.shared_gate(&mut want, &y, gated.then_some(&sl), (t, width))
            .unwrap();
        let (mut gd, ud, sd) = (to_gpu(&b, &x), to_gpu(&b, &y), to_gpu(&b, &sl));
        b.shared_gate(&mut gd, &ud, gated.then_some(&sd), (t, width))
            .unwrap();
        let e = nmse(&from_gpu(&b, &gd, t * width), &want);
        println!("shared_gate (gated {gated}) NMSE {e:.2e}");
        assert!(e <= 1e-10);
    }

    // Per-head QK-norm, RoPE and the KV store in one launch against the separate launches
    // (Qwen3-MoE's attention inputs): a prefill of 5 rows, then one token (position from the
    // device), 4 q heads and 2 kv heads of 32.
    let (hd, qw, kvw) = (32usize, 128usize, 64usize);
    let (qn, kn) = (random(hd, 6), random(hd, 7));
    let freq: Vec<f32> = (0..hd / 2)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
        .collect();
    for v in [&qn, &kn, &freq] {
        b.make_resident_vector(v).unwrap();
    }
    for (tt, start) in [(5usize, 0usize), (1, 5)] {
        let (q, k, v) = (
            random(tt * qw, 8),
            random(tt * kvw, 9),
            random(tt * kvw, 10),
        );
        let step = hob::model::ops::QkvStep {
            t: tt,
            q_width: qw,
            kv_width: kvw,
            start,
            layer: 0,
            inv_freq: &freq,
        };
        let mut got = Vec::new();
        for fused in [true, false] {
            let mut kvc = b.alloc_kv(1, 8, kvw, false).unwrap();
            let (qd, kd, mut vd) = (to_gpu(&b, &q), to_gpu(&b, &k), to_gpu(&b, &v));
            let (mut qo, mut ko) = (b.alloc(tt * qw).unwrap(), b.alloc(tt * kvw).unwrap());
            let out = [&mut qo, &mut ko, &mut vd];
            let norms = (&qn[..], &kn[..], 1e-6);
            if fused {
                b.qk_norm_rope_kv((&qd, &kd), out, norms, &step, &mut kvc)
                    .unwrap();
            } else {
                hob::model::ops::qk_norm_then_rope_kv(&b, (&qd, &kd), out, norms, &step, &mut kvc)
                    .unwrap();
            }
            let mut o = from_gpu(&b, &qo, tt * qw);
            o.extend(from_gpu(&b, &ko, tt * kvw));
            got.push(o);
        }
        let e = nmse(&got[0], &got[1]);
        println!("qk_norm_rope_kv t={tt}: fused vs separate NMSE {e:.2e}");
        assert!(e <= 1e-10);
    }

    // GQA attention over a cache filled in two writes (prefills), with and without a sliding
    // window, then one decode step: 8 heads over 2 KV heads of 32; Mixtral's heads (32 over 8 of
    // 128) with prefills of 70 and 45 (the prefill kernel's tiles of 8 queries and chunks of 32
    // positions, partly filled); 8 heads of 64 over 1 KV head (a group of 8); 16 heads over one
    // KV head of 576 (attention_wide). Then MLA's cache (values are the keys' rows, one KV head:
    // prefill through attention_prefill_latent, decode attention_wide or attention): DeepSeek-V2's
    // 16 heads over its latent of 576, 20 heads over 40 (the fixtures' width).
    let cases: [(usize, usize, usize, usize, [usize; 3], usize); 4] = [
        (8, 2, 32, 16, [9, 4, 1], 5),
        (32, 8, 128, 128, [70, 45, 1], 37),
        (8, 1, 64, 64, [33, 20, 1], 40),
        (16, 1, 576, 64, [33, 20, 1], 40),
    ];
    let latent = [
        (16, 1, 576, 64, [33, 20, 1], 0),
        (20, 1, 40, 64, [33, 20, 1], 0),
    ];
    let runs = cases
        .into_iter()
        .flat_map(|c| [(c, false), (c, true)])
        .map(|(c, on)| (c, on.then_some(c.5), false))
        .chain(latent.into_iter().map(|c| (c, None, true)));
    for ((nh, nkv, hd, ctx, steps, _), window, vk) in runs {
        let layers = 2usize;
        let (qd, kvd) = (nh * hd, nkv * hd);
        // The windowed runs also take gpt-oss's sinks: a logit per head in the denominator.
        let sink_logits: Vec<f32> = random(nh, 77).iter().map(|v| 2.0 * v).collect();
        b.make_resident_vector(&sink_logits).unwrap();
        let sinks = window.map(|_| &sink_logits[..]);
        let mut ckv = cpu.alloc_kv(layers, ctx, kvd, vk).unwrap();
        let mut gkv = b.alloc_kv(layers, ctx, kvd, vk).unwrap();
        let mut start = 0;
        for (step, tt) in steps.into_iter().enumerate() {
            let seed = 10 * step as u64;
            let k = random(tt * kvd, seed + 1);
            let v = if vk {
                k.clone()
            } else {
                random(tt * kvd, seed + 2)
            };
            let q = random(tt * qd, seed + 3);
            cpu.kv_write(&mut ckv, (1, start), tt, &k, &v).unwrap();
            b.kv_write(&mut gkv, (1, start), tt, &to_gpu(&b, &k), &to_gpu(&b, &v))
                .unwrap();
            let shape = AttentionShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                start_pos: start,
                t: tt,
                window,
                sinks,
            };
            let mut want = vec![0.0; tt * qd];
            cpu.attention(shape, &q, &ckv, 1, &mut want).unwrap();
            let mut od = b.alloc(tt * qd).unwrap();
            b.attention(shape, &to_gpu(&b, &q), &gkv, 1, &mut od)
                .unwrap();
            let e = nmse(&from_gpu(&b, &od, tt * qd), &want);
            println!(
                "attention {nh}/{nkv}x{hd} window {window:?} sinks {} values are keys {vk} t={tt} at {start}: NMSE {e:.2e}",
                sinks.is_some()
            );
            assert!(e <= 1e-6, "attention NMSE {e:e}");
            start += tt;
        }
    }
}

/// A decode token's attention in one launch (attention_prep: biases, per-head QK-norm, RoPE,
/// the cache rows, q's scale, attention) against the launches the forward pass makes otherwise
/// (add_rows, qk_norm_rope_kv or rope_kv, scale, attention), over a cache of earlier positions:
/// Qwen3's form (norms), gpt-oss's (biases, a scale, sinks and a window), both, and a plain one.
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn attention_in_one_launch_equals_its_separate_launches() {
    let mut b = CudaBackend::empty(gpu()).unwrap();
    // (heads, kv heads, head_dim, biases, norms, q scale, window and sinks, position)
    let cases = [
        (8usize, 2usize, 32usize, false, true, 1.0f32, false, 9usize),
        (32, 4, 128, false, true, 1.0, false, 40),
        (8, 1, 64, true, false, 1.34, true, 37),
        (8, 2, 64, true, true, 0.8, true, 5),
        (4, 4, 16, false, false, 1.0, false, 3),
    ];
    for (nh, nkv, hd, biased, normed, q_scale, windowed, pos) in cases {
        let (qw, kvw, ctx) = (nh * hd, nkv * hd, 64usize);
        let freq: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let (qn, kn) = (random(hd, 6), random(hd, 7));
        let bias = [random(qw, 11), random(kvw, 12), random(kvw, 13)];
        let sinks = random(nh, 14);
        for v in [&freq, &qn, &kn, &bias[0], &bias[1], &bias[2], &sinks] {
            b.make_resident_vector(v).unwrap();
        }
        let (q, k, v) = (random(qw, 8), random(kvw, 9), random(kvw, 10));
        let (pk, pv) = (random(pos * kvw, 15), random(pos * kvw, 16));
        let step = QkvStep {
            t: 1,
            q_width: qw,
            kv_width: kvw,
            start: pos,
            layer: 1,
            inv_freq: &freq,
        };
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            start_pos: pos,
            t: 1,
            window: windowed.then_some(7),
            sinks: windowed.then_some(&sinks[..]),
        };
        let prep = AttnPrep {
            bias: biased.then_some(&bias),
            norms: normed.then_some((&qn[..], &kn[..], 1e-6)),
            q_scale,
        };
        let mut got = Vec::new();
        for fused in [true, false] {
            let mut kvc = b.alloc_kv(2, ctx, kvw, false).unwrap();
            let (pkd, pvd) = (to_gpu(&b, &pk), to_gpu(&b, &pv));
            b.kv_write(&mut kvc, (1, 0), pos, &pkd, &pvd).unwrap();
            let (mut qd, mut kd, mut vd) = (to_gpu(&b, &q), to_gpu(&b, &k), to_gpu(&b, &v));
            let mut out = b.alloc(qw).unwrap();
            if fused {
                b.fused_attention([&qd, &kd, &vd], &prep, &step, shape, &mut kvc, &mut out)
                    .unwrap();
            } else if normed {
                if biased {
                    b.add_rows(&mut qd, 1, &bias[0]).unwrap();
                    b.add_rows(&mut kd, 1, &bias[1]).unwrap();
                    b.add_rows(&mut vd, 1, &bias[2]).unwrap();
                }
                let (mut qo, mut ko) = (b.alloc(qw).unwrap(), b.alloc(kvw).unwrap());
                let norms = (&qn[..], &kn[..], 1e-6);
                b.qk_norm_rope_kv(
                    (&qd, &kd),
                    [&mut qo, &mut ko, &mut vd],
                    norms,
                    &step,
                    &mut kvc,
                )
                .unwrap();
                b.scale(&mut qo, qw, q_scale).unwrap();
                b.attention(shape, &qo, &kvc, 1, &mut out).unwrap();
            } else {
                let qkv = [&mut qd, &mut kd, &mut vd];
                match biased {
                    true => b.bias_rope_kv_write(qkv, &bias, &step, &mut kvc).unwrap(),
                    false => b.rope_kv_write(qkv, &step, &mut kvc).unwrap(),
                }
                b.scale(&mut qd, qw, q_scale).unwrap();
                b.attention(shape, &qd, &kvc, 1, &mut out).unwrap();
            }
            got.push(from_gpu(&b, &out, qw));
        }
        let e = nmse(&got[0], &got[1]);
        println!(
            "attention in one launch {nh}/{nkv}x{hd} biases {biased} norms {normed} scale {q_scale} \
             window {windowed} at {pos}: NMSE {e:.2e} vs separate (bits equal: {})",
            got[0] == got[1]
        );
        assert!(e <= 1e-12, "NMSE {e:e}");
    }
}

/// One token's MLP hidden activations in one launch (`mlp_hidden`: matvec_qd_*_gu, or for float
/// kinds moe_gate_up_*, with a null table) give the two products' and `shared_gate`'s bits, with
/// and without a gate logit: DeepSeek-V2-Lite's shared expert (2816 rows of 2048), Qwen1.5-MoE's
/// (5632), int4, the float kinds (rows not a multiple of the block's 4), and a layout the one
/// launch does not take (int4/g32: the three launches).
#[test]
#[ignore = "needs a CUDA GPU: tools/stage_gpu.sh runs it on one with --include-ignored"]
fn mlp_hidden_in_one_launch_equals_the_products_and_gate() {
    let g = gpu();
    for (c, &(kind, rows, cols)) in [
        ("int8", 2816, 2048),
        ("int8", 5632, 2048),
        ("int4", 1408, 2048),
        ("int4/g32", 512, 256),
        ("f16", 2816, 2048),
        ("bf16", 301, 256),
        ("f32", 130, 512),
    ]
    .iter()
    .enumerate()
    {
        let seed = 90 + 3 * c as u64;
        let st: Vec<_> = (0..2).map(|i| stored(kind, rows, cols, seed + i)).collect();
        let m: Vec<_> = st
            .iter()
            .map(|s| matrix(&s.0, s.1, s.2, rows, cols))
            .collect();
        let mut b = CudaBackend::empty(g.clone()).unwrap();
        for w in &m {
            b.make_resident(w).unwrap();
        }
        let xd = to_gpu(&b, &random(cols, seed + 7));
        let sd = to_gpu(&b, &[0.3]);
        for s in [None, Some(&sd)] {
            let (mut h, mut u) = (b.alloc(rows).unwrap(), b.alloc(rows).unwrap());
            b.mlp_hidden([&m[0], &m[1]], &xd, 1, [&mut h, &mut u], s)
                .unwrap();
            let (mut wg, mut wu) = (b.alloc(rows).unwrap(), b.alloc(rows).unwrap());
            b.matmul(&m[0], &xd, 1, &mut wg).unwrap();
            b.matmul(&m[1], &xd, 1, &mut wu).unwrap();
            b.shared_gate(&mut wg, &wu, s, (1, rows)).unwrap();
            let same = from_gpu(&b, &h, rows)
                .iter()
                .zip(&from_gpu(&b, &wg, rows))
                .all(|(a, w)| a.to_bits() == w.to_bits());
            let gated = s.is_some();
            assert!(
                same,
                "{kind} [{rows}, {cols}] (gate logit: {gated}): one launch differs"
            );
        }
        println!("mlp hidden in one launch: {kind} [{rows}, {cols}] bit for bit");
    }
}
