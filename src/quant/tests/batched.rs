//! The batched (prefill) products: against the f64 reference for every kind, at shapes that leave
//! partial register tiles in rows, tokens and columns, and bit-identical however rows and tokens
//! are split (each output's arithmetic depends on the column count alone).

use super::*;

fn matmul(m: &Matrix, x: &[f32], t: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = vec![0.0f32; rows.len() * t];
    m.matmul_rows(x, t, rows, &mut out, &mut Vec::new());
    out
}

#[test]
fn batched_products_match_the_reference_and_any_split() {
    let mut rng = Rng(41);
    // Rows and tokens past whole 4 x 6 tiles; 80 and 200 columns past whole 16-column blocks
    // (200: f16 rows then take the dequantized path).
    let shapes: [(usize, usize); 5] = [(1, 16), (7, 64), (9, 80), (6, 200), (13, 256)];
    for kind in ALL_KINDS {
        for &(rows, cols) in &shapes {
            let g = if cols % 64 == 0 { 64 } else { 16 };
            if kind.is_quantized() && cols % g != 0
                || matches!(kind, WeightKind::Mxfp4 | WeightKind::Int4k) && cols % 32 != 0
                || kind == WeightKind::Int2k && cols % 16 != 0
                || kind == WeightKind::Int3 && g != 64
            {
                continue;
            }
            let (bytes, vl) = stored(kind, g as u32, rows, cols, &rng.normals(rows * cols));
            let m = as_matrix(&bytes, &vl, rows, cols);
            for t in [1usize, 2, 6, 7, 13] {
                let x = rng.normals(t * cols);
                let whole = matmul(&m, &x, t, 0..rows);
                for r in 0..rows {
                    for i in 0..t {
                        let (dot, mag) = reference_dot(&m, r, &x[i * cols..(i + 1) * cols]);
                        let got = whole[r * t + i] as f64;
                        assert!(
                            (got - dot).abs() <= 4e-6 * mag.max(1e-30),
                            "{kind:?} [{rows}x{cols}] t={t} ({r}, {i}): {got} vs f64 {dot}"
                        );
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                // Rows split at 3 (mid-tile), and the last token alone.
                let cut = 3.min(rows);
                let mut split = matmul(&m, &x, t, 0..cut);
                split.extend(matmul(&m, &x, t, cut..rows));
                assert_eq!(
                    bits(&split),
                    bits(&whole),
                    "{kind:?} [{rows}x{cols}] t={t}: rows split"
                );
                let last = matmul(&m, &x[(t - 1) * cols..], 1, 0..rows);
                let column: Vec<f32> = (0..rows).map(|r| whole[r * t + t - 1]).collect();
                assert_eq!(
                    bits(&last),
                    bits(&column),
                    "{kind:?} [{rows}x{cols}] t={t}: one token"
                );
            }
        }
    }
}

/// The AVX-512 dequantization of prefill gives `row_to_f32`'s values, bit for bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_dequantization_is_the_scalar_one() {
    use super::super::x86::{dequant_rows_512, Level};
    if Level::detected().is_none_or(|l| l < Level::Avx512) {
        eprintln!("no AVX-512: nothing to compare");
        return;
    }
    let mut rng = Rng(43);
    let (rows, cols) = (5, 256);
    for kind in [
        WeightKind::Int8,
        WeightKind::Int4,
        WeightKind::Int3,
        WeightKind::Int2,
        WeightKind::Mxfp4,
    ] {
        for g in [16u32, 32, 64, 256] {
            let fits = match kind {
                WeightKind::Mxfp4 => g == 32,
                WeightKind::Int3 => g % 64 == 0,
                _ => true,
            };
            if !fits {
                continue;
            }
            let (bytes, vl) = stored(kind, g, rows, cols, &rng.normals(rows * cols));
            let m = as_matrix(&bytes, &vl, rows, cols);
            let mut fast = vec![0.0f32; rows * cols];
            // SAFETY: AVX-512F and VL (detected); a matrix of a kind it takes, whole rows, and
            // fast holds rows x cols.
            unsafe { dequant_rows_512(&m, 0..rows, &mut fast) };
            let slow = m.to_f32();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "{kind:?} g{g}");
        }
    }
}
