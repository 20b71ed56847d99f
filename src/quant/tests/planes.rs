//! ap8 (quant::planes): every width's kernels against the dequantize-then-multiply reference,
//! and a hand-built group that pins the byte layout of formats/hob.md.

use half::f16;

use super::{check_kernels, Rng};
use crate::format::ap8::{self, ApLayout};
use crate::quant::{quantize_ap8_expert, Matrix, WeightKind};

/// Matrix `part` of an ap8 blob read at `width` (gate and up [ffn, hidden], down [hidden, ffn]).
fn part<'a>(blob: &'a [u8], (hidden, ffn): (usize, usize), width: u8, part: u8) -> Matrix<'a> {
    let (rows, cols) = if part == 2 {
        (hidden, ffn)
    } else {
        (ffn, hidden)
    };
    let prefix = ApLayout::new(hidden, ffn).unwrap().prefix(width);
    Matrix {
        kind: WeightKind::Ap8 { width, part },
        group_size: ap8::SUB,
        rows,
        cols,
        codes: &blob[..prefix],
        scales: &[],
        mins: &[],
    }
}

#[test]
fn every_width_matches_the_reference_and_narrows_gracefully() {
    let mut rng = Rng(54);
    let (hidden, ffn) = (128, 192);
    let n = hidden * ffn;
    let src: Vec<Vec<f32>> = (0..3).map(|_| rng.normals(n)).collect();
    let blob = quantize_ap8_expert(hidden, ffn, [&src[0], &src[1], &src[2]]);
    let mut last = f64::INFINITY;
    for width in ap8::MIN_WIDTH..=ap8::MAX_WIDTH {
        let (mut sse, mut ss) = (0f64, 0f64);
        for p in 0..3u8 {
            let m = part(&blob, (hidden, ffn), width, p);
            let x = rng.normals(m.cols);
            check_kernels(&m, &x);
            for (a, b) in m.to_f32().iter().zip(&src[usize::from(p)]) {
                sse += f64::from(a - b).powi(2);
                ss += f64::from(*b).powi(2);
            }
            // A prefill product is the matvec's, token by token.
            let xs = rng.normals(3 * m.cols);
            let mut batched = vec![0.0; 3 * m.rows];
            m.matmul_rows(&xs, 3, 0..m.rows, &mut batched, &mut Vec::new());
            for t in 0..3 {
                let mut one = vec![0.0; m.rows];
                m.matvec_rows_scalar(&xs[t * m.cols..(t + 1) * m.cols], 0..m.rows, &mut one);
                for (r, &o) in one.iter().enumerate() {
                    let b = batched[r * 3 + t];
                    assert!(
                        (o - b).abs() <= 1e-4 * (1.0 + o.abs()),
                        "w{width} row {r}: {o} {b}"
                    );
                }
            }
        }
        let rel = (sse / ss).sqrt();
        // Normal values: the separate widths' errors at g64 are 0.34 / 0.17 / 0.085 at 2 / 3 / 4
        // bits; a parent range a 16 reads below them.
        let bound = [0.33, 0.165, 0.085, 0.05, 0.025, 0.013, 0.0065][usize::from(width - 2)];
        assert!(
            rel < bound && rel < last,
            "width {width}: relative RMS {rel}"
        );
        last = rel;
    }
    // The header holds each narrower view's checksum of what follows it.
    let l = ApLayout::new(hidden, ffn).unwrap();
    for k in 2..8u8 {
        let at = 4 * usize::from(k - 2);
        let crc = u32::from_le_bytes(blob[at..at + 4].try_into().unwrap());
        assert_eq!(
            crc,
            crc32c::crc32c(&blob[ap8::HEADER..l.prefix(k)]),
            "width {k}"
        );
    }
}

/// Rows long enough for the integer kernel's whole 256-column blocks and its windows of 16 groups
/// (1088 columns: 4 blocks and a part, 68 groups), and rows of one block and a part (320).
#[test]
fn long_rows_match_the_reference_at_every_width() {
    let mut rng = Rng(541);
    let (hidden, ffn) = (1088, 320);
    let n = hidden * ffn;
    let src: Vec<Vec<f32>> = (0..3).map(|_| rng.normals(n)).collect();
    let blob = quantize_ap8_expert(hidden, ffn, [&src[0], &src[1], &src[2]]);
    for width in ap8::MIN_WIDTH..=ap8::MAX_WIDTH {
        for p in [0u8, 2] {
            let m = part(&blob, (hidden, ffn), width, p);
            // Groups of x far apart in size: each group's own rounding of x.
            let mut x = rng.normals(m.cols);
            for (i, v) in x.iter_mut().enumerate() {
                *v *= [1.0, 1e-3, 40.0][(i / 16) % 3];
            }
            check_kernels(&m, &x);
            // An odd run of rows (the kernel takes rows two at a time): as the whole product.
            let (mut all, mut some) = (vec![0.0; m.rows], vec![0.0; 5]);
            m.matvec_rows(&x, 0..m.rows, &mut all);
            m.matvec_rows(&x, 3..8, &mut some);
            assert_eq!(some, all[3..8], "width {width} part {p}");
        }
    }
}

/// One value placed by hand: the up matrix's row 3, column 5, parent code 181 = 0b10_110101.
#[test]
fn known_ap8_value_pins_its_bytes() {
    let (hidden, ffn) = (64, 64);
    let l = ApLayout::new(hidden, ffn).unwrap();
    let mut blob = vec![0u8; l.prefix(8)];
    let p = l.parts[1];
    // Row 3's pair (0.5, 0.25); its first 16 (sub-range 12): a = 2, b = 8, so s8 1.0, m8 -2.0.
    blob[p.pairs + 12..p.pairs + 14].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    blob[p.pairs + 14..p.pairs + 16].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    blob[p.subs + 12] = 2 | 8 << 4;
    // Width 2's correction of row 3's 64: a = 1 (low nibble), b = -2 (high nibble 0xe).
    blob[p.corr[0] + 3] = 0xe1;
    let i = 3 * 64 + 5;
    blob[p.top + i / 4] |= 0b10 << (2 * (i % 4));
    for (t, bit) in [1u8, 1, 0, 1, 0, 1].into_iter().enumerate() {
        blob[p.planes[t] + i / 8] |= bit << (i % 8);
    }
    let value = |width: u8| {
        let m = part(&blob, (hidden, ffn), width, 1);
        let mut row = vec![0.0; 64];
        m.row_to_f32(3, &mut row);
        row[5]
    };
    let f = |v: f32| f16::from_f32(v).to_f32();
    assert_eq!(value(8), 181.0 - 2.0);
    // Width 4: code 11, buckets of 16 codes, scale 16, min -2 + 7.5 (no correction).
    assert_eq!(value(4), 11.0 * 16.0 + 5.5);
    // Width 3: code 5 = 0b101, buckets of 32.
    assert_eq!(value(3), 5.0 * 32.0 + (-2.0 + 15.5));
    // Width 2: code 2, scale 64 (1 + 1/96), min (-2 + 31.5) - 2 * 64 / 24, each rounded to f16.
    let s = f(64.0 * (1.0 + 1.0 / 96.0));
    assert_eq!(value(2), s * 2.0 + f(29.5 + 64.0 * (-2.0 / 24.0)));
    // The other matrices and rows read nothing of it.
    let gate = part(&blob, (hidden, ffn), 8, 0).to_f32();
    assert!(gate.iter().all(|&v| v == 0.0));
}

/// The AVX-512 tables are `ap8::sub_pair` and `ap8::group_params`, bit for bit: random row
/// pairs (normal, subnormal, large), every sub-range byte and correction byte, rows of 64 to
/// 320 columns (a run of 16s crosses up to five rows), at every width, from any first 64.
#[cfg(target_arch = "x86_64")]
#[test]
fn simd_group_params_are_the_scalar_ones() {
    use crate::quant::planes::{part_tables, table_at};
    use crate::quant::x86::Level;
    if Level::detected().is_none_or(|l| l < Level::Avx512) {
        return;
    }
    let mut rng = Rng(8);
    let pick = |r: &mut Rng| match r.next_u64() % 4 {
        0 => f16::from_bits(r.next_u64() as u16 & 0x03ff), // subnormal
        1 => f16::from_f32((r.normal() * 3000.0).abs()),
        _ => f16::from_f32(r.normal().abs() * 0.01),
    };
    for (hidden, ffn) in [(64, 64), (128, 320), (192, 64)] {
        let l = ApLayout::new(hidden, ffn).unwrap();
        let mut blob = vec![0u8; l.prefix(8)];
        for b in blob.iter_mut().skip(ap8::HEADER) {
            *b = rng.next_u64() as u8;
        }
        for p in &l.parts {
            for r in 0..p.rows {
                let (d, dm) = (pick(&mut rng), pick(&mut rng));
                blob[p.pairs + 4 * r..p.pairs + 4 * r + 2].copy_from_slice(&d.to_le_bytes());
                blob[p.pairs + 4 * r + 2..p.pairs + 4 * r + 4].copy_from_slice(&dm.to_le_bytes());
            }
        }
        for k in 2..=8u8 {
            for p in &l.parts {
                let t = part_tables(&blob, p, k);
                let subs = p.rows * p.cols / ap8::SUB;
                for j0 in [0, 4, 8, 20] {
                    let n = subs - j0;
                    let (mut s, mut m) = (vec![0f32; n], vec![0f32; n]);
                    // SAFETY: AVX-512F and F16C (checked above); the blob holds the part's tables.
                    unsafe { crate::quant::x86::ap8_params(k, t, j0, &mut s, &mut m) };
                    for j in 0..n {
                        let (ws, wm) = table_at(k, t, j0 + j);
                        assert_eq!(
                            (s[j].to_bits(), m[j].to_bits()),
                            (ws.to_f32().to_bits(), wm.to_f32().to_bits()),
                            "[{hidden}, {ffn}] k {k} part rows {} 16 {}",
                            p.rows,
                            j0 + j
                        );
                    }
                }
            }
        }
    }
}

/// Prefill's AVX-512 dequantization of an ap8 view gives `row_to_f32`'s values bit for bit, at
/// every width, from any first row (its tables are made 16 rows at a time).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_dequantization_of_every_width_is_the_scalar_one() {
    use crate::quant::x86::{ap8_dequant_rows_512, Level};
    if Level::detected().is_none_or(|l| l < Level::Avx512) {
        eprintln!("no AVX-512: nothing to compare");
        return;
    }
    let mut rng = Rng(542);
    let (hidden, ffn) = (192, 320);
    let n = hidden * ffn;
    let src: Vec<Vec<f32>> = (0..3).map(|_| rng.normals(n)).collect();
    let blob = quantize_ap8_expert(hidden, ffn, [&src[0], &src[1], &src[2]]);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for width in ap8::MIN_WIDTH..=ap8::MAX_WIDTH {
        for p in [0u8, 2] {
            let m = part(&blob, (hidden, ffn), width, p);
            let slow = m.to_f32();
            for rows in [0..m.rows, 3..40] {
                let mut fast = vec![0f32; rows.len() * m.cols];
                // SAFETY: AVX-512F and F16C (detected); an ap8 view whose prefix holds its width,
                // fast holds the rows' values.
                unsafe { ap8_dequant_rows_512(&m, rows.clone(), &mut fast) };
                let want = &slow[rows.start * m.cols..rows.end * m.cols];
                assert_eq!(
                    bits(&fast),
                    bits(want),
                    "width {width} part {p} rows {rows:?}"
                );
            }
        }
    }
}
