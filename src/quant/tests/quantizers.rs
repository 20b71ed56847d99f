//! The quantizers: error bounds, known codes and bit orders, determinism, degenerate groups.

use super::*;

/// Plain min/max (absmax for int8) quantization with f16-rounded parameters: the baseline the clip
/// search must beat. Returns the squared error of the group.
fn plain_group_sse(kind: VariantKind, w: &[f32]) -> f64 {
    let r = |v: f32| f16::from_f32(v).to_f32();
    match kind {
        VariantKind::Int8 => {
            let s = r(w.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0);
            w.iter()
                .map(|&v| {
                    let q = if s > 0.0 {
                        (v / s).round().clamp(-127.0, 127.0)
                    } else {
                        0.0
                    };
                    ((s * q - v) as f64).powi(2)
                })
                .sum()
        }
        _ => {
            let nmax = ((1 << kind.bits()) - 1) as f32;
            let lo = w.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let hi = w.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let (s, m) = (r((hi - lo) / nmax), r(lo));
            w.iter()
                .map(|&v| {
                    let q = if s > 0.0 {
                        ((v - m) / s).round().clamp(0.0, nmax)
                    } else {
                        0.0
                    };
                    ((s * q + m - v) as f64).powi(2)
                })
                .sum()
        }
    }
}

/// Documented bounds on relative RMS error for group sizes up to 128 (the spec quotes them), per
/// variant and distribution. The measured values are printed by this test.
fn bound(kind: VariantKind, heavy: bool) -> f64 {
    match (kind, heavy) {
        (VariantKind::F16, _) => 3e-4,
        (VariantKind::Bf16, _) => 2.5e-3,
        (VariantKind::Int8, false) => 0.0075,
        (VariantKind::Int8, true) => 0.016,
        (VariantKind::Int4, false) => 0.11,
        (VariantKind::Int4, true) => 0.21,
        (VariantKind::Int4k, false) => 0.11,
        (VariantKind::Int4k, true) => 0.21,
        (VariantKind::Int3, false) => 0.21,
        (VariantKind::Int3, true) => 0.42,
        (VariantKind::Int2, false) => 0.40,
        (VariantKind::Int2, true) => 0.68,
        (VariantKind::Int2k, false) => 0.40,
        (VariantKind::Int2k, true) => 0.68,
        (VariantKind::Mxfp4, false) => 0.13,
        (VariantKind::Mxfp4, true) => 0.25,
        (VariantKind::Ap8, _) => unreachable!("ap8 stores experts: tests/planes.rs"),
    }
}

#[test]
fn round_trip_error_is_bounded_and_clip_search_beats_min_max() {
    let mut rng = Rng(5);
    let (rows, cols) = (64, 1024);
    for heavy in [false, true] {
        for kind in VariantKind::ALL {
            let groups: &[u32] = if kind == VariantKind::Ap8 {
                &[]
            } else if kind.is_float() {
                &[0]
            } else if matches!(kind, VariantKind::Mxfp4 | VariantKind::Int4k) {
                &[32]
            } else if kind == VariantKind::Int2k {
                &[16]
            } else if kind == VariantKind::Int3 {
                &[64, 128]
            } else {
                &[32, 64, 128]
            };
            for &g in groups {
                let src = if heavy {
                    heavy_tailed(&mut rng, rows * cols, 64)
                } else {
                    rng.normals(rows * cols)
                };
                let v = variant(kind, g);
                let l = v.matrix_layout(rows, cols).unwrap();
                let bytes = quantize_matrix(v, &l, &src);
                let e = measure_error(v, &l, &bytes, &src);
                let rel = e.relative_rms();
                let dist = if heavy { "heavy" } else { "N(0,1)" };
                let mut line = format!(
                    "{:>9} {dist:>6}: rel RMS {rel:.5} (bound {})",
                    v.name(),
                    bound(kind, heavy)
                );
                assert!(rel < bound(kind, heavy), "{line}");
                assert!(rel > 0.0, "{line}");
                if !kind.is_float() && kind != VariantKind::Mxfp4 {
                    let plain: f64 = src
                        .chunks_exact(g as usize)
                        .map(|w| plain_group_sse(kind, w))
                        .sum();
                    let plain_rel = (plain / e.ss).sqrt();
                    line += &format!(", plain min/max {plain_rel:.5}");
                    // The int4/int2 search minimises an error weighted toward the larger values
                    // (quantize.rs search_asym), so its plain squared error need only beat
                    // min/max's, not by a margin.
                    assert!(e.sse < plain, "{line}: clip search not better than min/max");
                }
                eprintln!("{line}");
            }
        }
    }
}

#[test]
fn measure_error_counts_and_sums() {
    let v = variant(VariantKind::Int8, 16);
    let l = v.matrix_layout(2, 16).unwrap();
    let src: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let bytes = quantize_matrix(v, &l, &src);
    let e = measure_error(v, &l, &bytes, &src);
    assert_eq!(e.count, 32);
    assert_eq!(e.ss, src.iter().map(|&v| (v * v) as f64).sum::<f64>());
    let mut total = ErrorStats::default();
    total.add(&e);
    total.add(&e);
    assert_eq!(
        (total.count, total.sse, total.ss),
        (64, 2.0 * e.sse, 2.0 * e.ss)
    );
}

#[test]
fn known_int8_group_pins_codes_and_scale() {
    // q * 0.5 for q = -127, 127, 0, 1, ..., 13: exact with scale 0.5 (f16 0x3800).
    let q: Vec<i8> = [-127i8, 127, 0].into_iter().chain(1..=13).collect();
    let src: Vec<f32> = q.iter().map(|&q| q as f32 * 0.5).collect();
    let v = variant(VariantKind::Int8, 16);
    let l = v.matrix_layout(1, 16).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(bytes.len(), 128);
    let codes: Vec<u8> = q.iter().map(|&q| q as u8).collect();
    assert_eq!(&bytes[..16], &codes[..]);
    assert_eq!(&bytes[l.scales.clone()], &[0x00, 0x38]);
    assert!(bytes[16..l.scales.start]
        .iter()
        .chain(&bytes[l.scales.end..])
        .all(|&b| b == 0));
    let mut row = vec![0.0; 16];
    view(v, &l, &bytes).row_to_f32(0, &mut row);
    assert_eq!(row, src);
}

#[test]
fn known_int4_group_pins_nibble_order() {
    // -2 + 0.25 q for q = 0..15, then reversed: scale 0.25 (0x3400), min -2 (0xc000).
    let q: Vec<u8> = (0..16).chain((0..16).rev()).collect();
    let src: Vec<f32> = q.iter().map(|&q| -2.0 + 0.25 * q as f32).collect();
    let v = variant(VariantKind::Int4, 32);
    let l = v.matrix_layout(1, 32).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(
        &bytes[..16],
        &[
            0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45,
            0x23, 0x01
        ]
    );
    assert_eq!(&bytes[l.scales.clone()], &[0x00, 0x34]);
    assert_eq!(&bytes[l.mins.clone()], &[0x00, 0xc0]);
    let mut row = vec![0.0; 32];
    view(v, &l, &bytes).row_to_f32(0, &mut row);
    assert_eq!(row, src);
}

#[test]
fn known_int2_group_pins_bit_order() {
    // -1.5 + q for q = 0,1,2,3, 3,2,1,0 repeated: scale 1 (0x3c00), min -1.5 (0xbe00).
    let q: Vec<u8> = [0u8, 1, 2, 3, 3, 2, 1, 0].repeat(2);
    let src: Vec<f32> = q.iter().map(|&q| -1.5 + q as f32).collect();
    let v = variant(VariantKind::Int2, 16);
    let l = v.matrix_layout(1, 16).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(&bytes[..4], &[0xe4, 0x1b, 0xe4, 0x1b]);
    assert_eq!(&bytes[l.scales.clone()], &[0x00, 0x3c]);
    assert_eq!(&bytes[l.mins.clone()], &[0x00, 0xbe]);
    let mut x = vec![0.0f32; 16];
    x[1] = 1.0;
    x[6] = 2.0;
    let mut out = [0.0f32];
    view(v, &l, &bytes).matvec_rows(&x, 0..1, &mut out);
    assert_eq!(out[0], src[1] + 2.0 * src[6]);
}

#[test]
fn known_int3_group_pins_bit_order() {
    // -3.5 + q for q = e % 8 over 64 values: scale 1 (0x3c00), min -3.5 (0xc300). Low bits as
    // int2's (0xe4 = fields 0, 1, 2, 3), then the high bits (formats' int3_hi_bit): element
    // 16 w + 4 b + s at bit 4 (w % 2) + s of high byte 4 (w / 2) + b.
    let q: Vec<u8> = (0..64).map(|e| (e % 8) as u8).collect();
    let src: Vec<f32> = q.iter().map(|&q| -3.5 + q as f32).collect();
    let v = variant(VariantKind::Int3, 64);
    let l = v.matrix_layout(1, 64).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(&bytes[..16], &[0xe4; 16]);
    // High bits: element e has one when e % 8 >= 4, i.e. for every low byte b odd (elements
    // 4 b .. 4 b + 3): high bytes 1 and 3 of each pair of words, both nibbles.
    assert_eq!(
        &bytes[16..24],
        &[0x00, 0xff, 0x00, 0xff, 0x00, 0xff, 0x00, 0xff]
    );
    assert_eq!(&bytes[l.scales.clone()], &[0x00, 0x3c]);
    assert_eq!(&bytes[l.mins.clone()], &[0x00, 0xc3]);
    let mut row = vec![0.0; 64];
    view(v, &l, &bytes).row_to_f32(0, &mut row);
    assert_eq!(row, src);
    let mut x = vec![0.0f32; 64];
    x[5] = 1.0;
    x[62] = 2.0;
    let mut out = [0.0f32];
    view(v, &l, &bytes).matvec_rows(&x, 0..1, &mut out);
    assert_eq!(out[0], src[5] + 2.0 * src[62]);
}

#[test]
fn float_variants_round_to_nearest_even() {
    // 1 + 2^-11 lies halfway between f16 1.0 and 1 + 2^-10: ties to even (1.0, 0x3c00);
    // 1 + 3 * 2^-11 ties up to 1 + 2^-9 (0x3c02). For bf16, 1 + 2^-8 ties to 1.0 (0x3f80).
    let src = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11)];
    let v = variant(VariantKind::F16, 0);
    let bytes = quantize_matrix(v, &v.matrix_layout(1, 2).unwrap(), &src);
    assert_eq!(&bytes[..4], &[0x00, 0x3c, 0x02, 0x3c]);
    let v = variant(VariantKind::Bf16, 0);
    let bytes = quantize_matrix(
        v,
        &v.matrix_layout(1, 2).unwrap(),
        &[1.0 + 2f32.powi(-8), -2.0],
    );
    assert_eq!(&bytes[..4], &[0x80, 0x3f, 0x00, 0xc0]);
}

#[test]
fn quantization_is_deterministic() {
    let mut rng = Rng(6);
    let src = heavy_tailed(&mut rng, 32 * 256, 64);
    let n = 64 * 64;
    let ap_src = heavy_tailed(&mut rng, 3 * n, 64);
    let parts = [&ap_src[..n], &ap_src[n..2 * n], &ap_src[2 * n..]];
    let ap8 = crate::quant::quantize_ap8_expert(64, 64, parts);
    assert_eq!(ap8, crate::quant::quantize_ap8_expert(64, 64, parts), "ap8");
    for kind in VariantKind::ALL
        .into_iter()
        .filter(|&k| k != VariantKind::Ap8)
    {
        let v = variant(kind, 64);
        let l = v.matrix_layout(32, 256).unwrap();
        assert_eq!(
            quantize_matrix(v, &l, &src),
            quantize_matrix(v, &l, &src),
            "{}",
            v.name()
        );
    }
}

#[test]
fn degenerate_groups_quantize_to_finite_parameters() {
    let g = 16;
    let groups: Vec<Vec<f32>> = vec![
        vec![0.0; g],
        vec![3.25; g],
        vec![-7.0; g],
        (0..g).map(|i| i as f32 * 1e-9).collect(),
        (0..g).map(|i| if i == 3 { 1e-30 } else { 0.0 }).collect(),
        (0..g).map(|i| (i as f32 - 8.0) * 1e6).collect(),
        (0..g).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect(),
    ];
    for kind in [VariantKind::Int8, VariantKind::Int4, VariantKind::Int2] {
        let v = variant(kind, g as u32);
        for src in &groups {
            let l = v.matrix_layout(1, g).unwrap();
            let bytes = quantize_matrix(v, &l, src);
            let mut row = vec![0.0f32; g];
            view(v, &l, &bytes).row_to_f32(0, &mut row);
            assert!(
                row.iter().all(|w| w.is_finite()),
                "{} {src:?} -> {row:?}",
                v.name()
            );
            let amax = src.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let err = row
                .iter()
                .zip(src)
                .fold(0.0f32, |a, (w, s)| a.max((w - s).abs()));
            // Constant groups are exact up to f16 rounding; values beyond f16's range saturate.
            let tol = if amax > 65504.0 {
                amax
            } else {
                (amax * 0.6).max(1e-7)
            };
            assert!(err <= tol, "{} {src:?} -> {row:?}", v.name());
        }
    }
    let v = variant(VariantKind::Int4, 16);
    let bytes = quantize_matrix(v, &v.matrix_layout(1, 16).unwrap(), &[3.25; 16]);
    let mut row = vec![0.0f32; 16];
    view(v, &v.matrix_layout(1, 16).unwrap(), &bytes).row_to_f32(0, &mut row);
    assert_eq!(row, vec![3.25; 16]);
}

/// Values already on a 4-bit grid whose codes do not span it (a llama.cpp Q4_K sub-block as the
/// GGUF reader dequantizes it: scale * q - min, q in 2..=13 here) keep that grid: the error is
/// the f16 rounding of scale and min, not a second 4-bit rounding.
#[test]
fn values_on_a_five_bit_symmetric_grid_are_int8_exactly() {
    // A GGUF's Q5_0 blocks read back: w = d * (q - 16), q in 0..32, d an f16 per 32 values.
    let mut rng = Rng(12);
    let (rows, cols, g) = (16, 256, 32);
    let mut src = Vec::with_capacity(rows * cols);
    for group in 0..rows * cols / g {
        let d = f16::from_f32(0.0021 + 0.0003 * (group % 11) as f32).to_f32();
        for _ in 0..g {
            let q = (rng.next_u64() % 32) as i32 - 16;
            src.push(d * q as f32);
        }
    }
    let v = variant(VariantKind::Int8, g as u32);
    let l = v.matrix_layout(rows, cols).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    let e = measure_error(v, &l, &bytes, &src);
    assert_eq!(e.relative_rms(), 0.0, "int8/g32 on Q5_0 values");
}

#[test]
fn values_on_a_four_bit_grid_keep_it() {
    let mut rng = Rng(11);
    let (rows, cols, g) = (16, 256, 32);
    let mut src = Vec::with_capacity(rows * cols);
    for group in 0..rows * cols / g {
        let scale = 0.003 + 0.0007 * (group % 13) as f32;
        let min = 0.02 + 0.001 * (group % 7) as f32;
        for _ in 0..g {
            let q = 2 + (rng.next_u64() % 12) as u32;
            src.push(scale * q as f32 - min);
        }
    }
    let v = variant(VariantKind::Int4, g as u32);
    let l = v.matrix_layout(rows, cols).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    let e = measure_error(v, &l, &bytes, &src);
    let plain: f64 = src
        .chunks_exact(g)
        .map(|w| plain_group_sse(VariantKind::Int4, w))
        .sum();
    eprintln!(
        "on-grid int4/g32: rel RMS {:.2e}, plain min/max {:.2e}",
        e.relative_rms(),
        (plain / e.ss).sqrt()
    );
    assert!(e.relative_rms() < 2e-3, "rel RMS {}", e.relative_rms());
}

#[test]
fn known_int4k_row_pins_its_bytes() {
    // Group 0: -2 + 0.25 q for q = 0..15 then reversed; group 1: the same halved. The row's
    // pair: d = f16(0.25 / 255) (0x1404), m = f16(2 / 127) (0x2408); group 0 takes a = 255,
    // b = -127 (f16(d a) = 0.25 and f16(m b) = -2: exact), its codes in int4's nibble order.
    let q: Vec<u8> = (0..16).chain((0..16).rev()).collect();
    let g0: Vec<f32> = q.iter().map(|&q| -2.0 + 0.25 * q as f32).collect();
    let src: Vec<f32> = g0
        .iter()
        .chain(g0.iter())
        .enumerate()
        .map(|(i, &w)| match i < 32 {
            true => w,
            false => 0.5 * w,
        })
        .collect();
    let v = variant(VariantKind::Int4k, 32);
    let l = v.matrix_layout(1, 64).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(
        &bytes[..16],
        &[
            0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45,
            0x23, 0x01
        ]
    );
    assert_eq!(&bytes[l.mins.clone()], &[0x04, 0x14, 0x08, 0x24]);
    assert_eq!(&bytes[l.scales.start..l.scales.start + 2], &[255, 0x81]);
    let m = view(v, &l, &bytes);
    let mut row = vec![0.0; 64];
    m.row_to_f32(0, &mut row);
    assert_eq!(&row[..32], &src[..32]);
    let err = row[32..]
        .iter()
        .zip(&src[32..])
        .fold(0.0f32, |a, (r, s)| a.max((r - s).abs()));
    assert!(err < 0.07, "group 1 within half its step: {err}");
    let mut x = vec![0.0f32; 64];
    x[3] = 1.0;
    x[40] = 2.0;
    let mut out = [0.0f32];
    m.matvec_rows(&x, 0..1, &mut out);
    assert_eq!(out[0], row[3] + 2.0 * row[40]);
}

#[test]
fn known_int2k_row_pins_its_bytes() {
    // Group 0: -1.75 + 0.9375 q for q = 0, 1, 2, 3, 3, 2, 1, 0 twice; group 1 the same halved.
    // The row's pair: d = 0.9375 / 15 = 0.0625 (0x2c00), dm = 1.75 / 7 = 0.25 (0x3400); group
    // 0's byte a = 15 | b = -7 << 4 (0x9f), exact; its codes in int2's bit order.
    let q: Vec<u8> = [0u8, 1, 2, 3, 3, 2, 1, 0].repeat(2);
    let g0: Vec<f32> = q.iter().map(|&q| -1.75 + 0.9375 * q as f32).collect();
    let src: Vec<f32> = g0
        .iter()
        .chain(g0.iter())
        .enumerate()
        .map(|(i, &w)| match i < 16 {
            true => w,
            false => 0.5 * w,
        })
        .collect();
    let v = variant(VariantKind::Int2k, 16);
    let l = v.matrix_layout(1, 32).unwrap();
    let bytes = quantize_matrix(v, &l, &src);
    assert_eq!(&bytes[..4], &[0xe4, 0x1b, 0xe4, 0x1b]);
    assert_eq!(&bytes[l.mins.clone()], &[0x00, 0x2c, 0x00, 0x34]);
    assert_eq!(bytes[l.scales.start], 0x9f);
    let m = view(v, &l, &bytes);
    let mut row = vec![0.0; 32];
    m.row_to_f32(0, &mut row);
    assert_eq!(&row[..16], &src[..16]);
    let mut x = vec![0.0f32; 32];
    x[1] = 1.0;
    x[20] = 2.0;
    let mut out = [0.0f32];
    m.matvec_rows(&x, 0..1, &mut out);
    assert_eq!(out[0], row[1] + 2.0 * row[20]);
}

#[test]
fn f16_round_is_halfs_rounding() {
    let want = |v: f32| f16::from_f32(v.clamp(-65504.0, 65504.0)).to_f32();
    let mut edges = vec![
        0.0f32,
        -0.0,
        65504.0,
        65519.9,
        65520.0,
        1e9,
        -1e9,
        f32::MIN_POSITIVE,
    ];
    for e in [-24i32, -15, -14, -1, 0, 15] {
        let p = 2f32.powi(e);
        // Powers of two, their halfway points to f16 neighbours and just either side.
        for v in [
            p,
            p * (1.0 + 1.0 / 2048.0),
            p * (1.0 + 3.0 / 2048.0),
            p * 0.999_99,
        ] {
            edges.extend([
                v,
                -v,
                f32::from_bits(v.to_bits() + 1),
                f32::from_bits(v.to_bits() - 1),
            ]);
        }
    }
    let mut rng = Rng(5);
    let random = (0..2_000_000).map(|_| {
        let b = rng.next_u64() as u32;
        // Exponents across f16's range and a little beyond (2^-30 .. 2^17).
        f32::from_bits((b & 0x807f_ffff) | ((97 + (b >> 23) % 48) << 23))
    });
    for v in edges.into_iter().chain(random) {
        let (got, w) = (super::super::quantize::f16_round(v), want(v));
        assert_eq!(
            got.to_bits(),
            w.to_bits(),
            "f16_round({v:e} = {:#x})",
            v.to_bits()
        );
    }
}

#[test]
fn the_avx2_search_is_the_baseline_search() {
    use super::super::quantize::{search_asym, search_asym_inline, Scratch};
    let mut rng = Rng(9);
    for (nmax, steps, step, g) in [
        (15.0, 16, 0.02, 32),
        (7.0, 16, 0.025, 64),
        (3.0, 16, 0.035, 16),
    ] {
        let (mut a, mut b) = (Scratch::new(g), Scratch::new(g));
        for _ in 0..2000 {
            let scale = 0.001 + (rng.next_u64() % 1000) as f32 * 1e-4;
            let w: Vec<f32> = rng.normals(g).iter().map(|v| v * scale).collect();
            let (p, q) = (
                search_asym(&w, nmax, steps, step, &mut a),
                search_asym_inline(&w, nmax, steps, step, &mut b),
            );
            assert_eq!(
                (p.scale.to_bits(), p.min.to_bits()),
                (q.scale.to_bits(), q.min.to_bits())
            );
            assert_eq!(a.q, b.q);
        }
    }
}

/// `grid_step` finds the least gap between levels over all pairs of distinct values; the form it
/// replaced sorted them and took adjacent gaps. Both must give the same grid, bit for bit, on
/// groups on grids of 2 to 16 levels, off-grid values, too many levels and signed zeros.
#[test]
fn the_grid_step_is_the_sorted_scans() {
    use super::super::quantize::grid_step;
    fn sorted_scan(w: &[f32], (lo, hi): (f32, f32), nmax: f32) -> Option<(f32, usize)> {
        let range = hi - lo;
        let per = 360_360.0 / f64::from(range);
        let off = |x: f32| {
            let f = f64::from(x - lo) * per;
            (f - f.round_ties_even()).abs() > 0.1
        };
        if range.is_nan() || range <= 0.0 || w.iter().take(5).any(|&x| off(x)) {
            return None;
        }
        let mut seen: Vec<f32> = Vec::new();
        for &x in w {
            if seen.iter().all(|y| y.to_bits() != x.to_bits()) {
                if seen.len() as f32 > nmax {
                    return None;
                }
                seen.push(x);
            }
        }
        seen.sort_unstable_by(f32::total_cmp);
        let gap = seen
            .windows(2)
            .map(|p| p[1] - p[0])
            .fold(f32::INFINITY, f32::min);
        let levels = (range / gap).round();
        if !gap.is_finite() || levels > nmax {
            return None;
        }
        let step = range / levels;
        seen.iter()
            .all(|&x| ((x - lo) / step - ((x - lo) / step).round()).abs() <= 1e-3)
            .then_some((step, (nmax - levels) as usize + 1))
    }
    let mut rng = Rng(21);
    let mut found = 0;
    for case in 0..30_000 {
        let nmax = [15.0, 7.0, 3.0][case % 3];
        let g = [16, 32, 64][case / 3 % 3];
        let levels = 1 + (rng.next_u64() % 17) as u32;
        let scale = f16::from_f32(1e-4 + (rng.next_u64() % 4000) as f32 * 1e-6).to_f32();
        let min = f16::from_f32((rng.next_u64() % 2000) as f32 * 1e-5 - 0.01).to_f32();
        let mut w: Vec<f32> = (0..g)
            .map(|_| scale * (rng.next_u64() % u64::from(levels)) as f32 - min)
            .collect();
        match case % 7 {
            0 => w[(rng.next_u64() % g as u64) as usize] += scale * 0.37,
            1 => {
                w[0] = 0.0;
                w[1] = -0.0;
            }
            _ => {}
        }
        let lo = w.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let hi = w.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let want = sorted_scan(&w, (lo, hi), nmax);
        let got = grid_step(&w, (lo, hi), nmax);
        assert_eq!(
            got.map(|(s, n)| (s.to_bits(), n)),
            want.map(|(s, n)| (s.to_bits(), n)),
            "case {case}: {w:?}"
        );
        found += usize::from(got.is_some());
    }
    assert!(found > 5000, "only {found} groups on a grid");
}
