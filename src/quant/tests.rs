use half::f16;

use super::*;
use crate::format::{MatrixLayout, Variant, VariantKind};

/// splitmix64: a tiny deterministic generator, enough for test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
    fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// N(0, 1) with two outliers of magnitude 6..12 sigma in every group of `g`.
fn heavy_tailed(rng: &mut Rng, n: usize, g: usize) -> Vec<f32> {
    let mut v = rng.normals(n);
    for grp in v.chunks_mut(g) {
        for _ in 0..2 {
            let i = (rng.next_u64() % grp.len() as u64) as usize;
            let sign = if rng.next_u64().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            grp[i] = sign * (6.0 + 6.0 * rng.uniform() as f32);
        }
    }
    v
}

fn variant(kind: VariantKind, g: u32) -> Variant {
    Variant::new(kind, if kind.is_float() { 0 } else { g }).unwrap()
}

fn view<'a>(v: Variant, l: &MatrixLayout, bytes: &'a [u8]) -> Matrix<'a> {
    Matrix::from_view(crate::format::MatrixView {
        variant: v,
        rows: l.rows,
        cols: l.cols,
        codes: &bytes[l.codes.clone()],
        scales: &bytes[l.scales.clone()],
        mins: &bytes[l.mins.clone()],
    })
}

/// dot(dequantized row, x) in f64, and sum |w_i x_i| (the scale errors are measured against).
fn reference_dot(m: &Matrix, r: usize, x: &[f32]) -> (f64, f64) {
    let mut row = vec![0.0f32; m.cols];
    m.row_to_f32(r, &mut row);
    row.iter().zip(x).fold((0.0, 0.0), |(d, a), (&w, &xi)| {
        (d + w as f64 * xi as f64, a + (w as f64 * xi as f64).abs())
    })
}

/// Stored bytes for every kind: dense bytes for f32, quantized/converted ones for the variants.
fn stored(
    kind: WeightKind,
    g: u32,
    rows: usize,
    cols: usize,
    src: &[f32],
) -> (Vec<u8>, Option<(Variant, MatrixLayout)>) {
    let vk = match kind {
        WeightKind::F32 => return (bytemuck::cast_slice(src).to_vec(), None),
        WeightKind::F16 => VariantKind::F16,
        WeightKind::Bf16 => VariantKind::Bf16,
        WeightKind::Int8 => VariantKind::Int8,
        WeightKind::Int4 => VariantKind::Int4,
        WeightKind::Int2 => VariantKind::Int2,
    };
    let v = variant(vk, g);
    let l = v.matrix_layout(rows, cols).unwrap();
    (quantize_matrix(v, &l, src), Some((v, l)))
}

/// The matrix `stored` returned, viewed.
fn as_matrix<'a>(
    bytes: &'a [u8],
    vl: &Option<(Variant, MatrixLayout)>,
    rows: usize,
    cols: usize,
) -> Matrix<'a> {
    match vl {
        Some((v, l)) => view(*v, l, bytes),
        None => Matrix::dense(crate::format::DType::F32, rows, cols, bytes),
    }
}

const ALL_KINDS: [WeightKind; 6] = [
    WeightKind::F32,
    WeightKind::F16,
    WeightKind::Bf16,
    WeightKind::Int8,
    WeightKind::Int4,
    WeightKind::Int2,
];

/// A fast path of this CPU: on x86 the kernels of one level (the dispatch takes the highest, the
/// ones below are what CPUs without its features run), elsewhere the dispatched kernels.
#[derive(Clone, Copy, Debug)]
enum Fast {
    Dispatched,
    #[cfg(target_arch = "x86_64")]
    X86(super::x86::Level),
}

impl Fast {
    /// Every fast path this CPU can run.
    fn all() -> Vec<Fast> {
        #[cfg(target_arch = "x86_64")]
        if let Some(top) = super::x86::Level::detected() {
            return super::x86::Level::ALL
                .into_iter()
                .filter(|level| *level <= top)
                .map(Fast::X86)
                .collect();
        }
        vec![Fast::Dispatched]
    }

    fn matvec(self, m: &Matrix, x: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        match self {
            Fast::Dispatched => m.matvec_rows(x, rows, out),
            #[cfg(target_arch = "x86_64")]
            Fast::X86(level) => m.matvec_rows_at(level, x, rows, out),
        }
    }

    /// Whether int4 and int2 round x on this path (the integer dot-product kernel).
    fn rounds_x(self) -> bool {
        match self {
            Fast::Dispatched => crate::quant::packed_rounds_x(),
            #[cfg(target_arch = "x86_64")]
            Fast::X86(level) => level == super::x86::Level::Avx512Vnni,
        }
    }
}

/// How far the fast kernels may stray from the scalar ones, relative to sum |w x|: f32 roundings,
/// or (int4 and int2 on the integer dot-product kernel) x rounded to a power-of-two grid of 15-16
/// significant bits of its group's largest |x| (at most 2.8e-5 seen over these tests, on a
/// 16-column row; 1.2e-5 on 64 columns).
fn fast_bound(fast: Fast, m: &Matrix) -> f64 {
    if m.kind.has_mins() && fast.rounds_x() {
        1e-4
    } else {
        2e-6
    }
}

/// Checks every fast path vs scalar and scalar vs f64 on one matrix; returns the worst relative
/// errors.
fn check_kernels(m: &Matrix, x: &[f32]) -> (f64, f64) {
    let mut slow = vec![0.0f32; m.rows];
    m.matvec_rows_scalar(x, 0..m.rows, &mut slow);
    // Per row: the f64 dot product and sum |w x|.
    let exact: Vec<(f64, f64)> = (0..m.rows)
        .map(|r| {
            let (dot, mag) = reference_dot(m, r, x);
            (dot, mag.max(1e-30))
        })
        .collect();
    let mut worst_ref = 0.0f64;
    for (r, (&s, &(dot, mag))) in slow.iter().zip(&exact).enumerate() {
        let er = (s as f64 - dot).abs() / mag;
        assert!(
            er < 2e-6,
            "{:?} g{} [{}x{}] row {r}: scalar {s} vs f64 {dot}",
            m.kind,
            m.group_size,
            m.rows,
            m.cols,
        );
        worst_ref = worst_ref.max(er);
    }
    let mut worst_fast = 0.0f64;
    for path in Fast::all() {
        let mut fast = vec![0.0f32; m.rows];
        path.matvec(m, x, 0..m.rows, &mut fast);
        for (r, ((&f, &s), &(_, mag))) in fast.iter().zip(&slow).zip(&exact).enumerate() {
            let ef = (f as f64 - s as f64).abs() / mag;
            assert!(
                ef < fast_bound(path, m),
                "{path:?} {:?} g{} [{}x{}] row {r}: fast {f} vs scalar {s}",
                m.kind,
                m.group_size,
                m.rows,
                m.cols,
            );
            worst_fast = worst_fast.max(ef);
        }
    }
    (worst_fast, worst_ref)
}

#[test]
fn fast_path_and_scalar_match_f64_reference_for_every_kind() {
    let mut rng = Rng(1);
    // 80 and 208 columns: an odd number of 16-column blocks (5 and 13), so no unrolled loop
    // divides them evenly.
    let shapes: [(usize, usize); 7] = [
        (1, 16),
        (7, 64),
        (5, 80),
        (4, 208),
        (5, 384),
        (3, 4096),
        (9, 1024),
    ];
    for kind in ALL_KINDS {
        for &(rows, cols) in &shapes {
            for g in [16u32, 32, 64, 128] {
                if kind.is_quantized() && cols % g as usize != 0 || !kind.is_quantized() && g != 16
                {
                    continue;
                }
                let src = rng.normals(rows * cols);
                let x = rng.normals(cols);
                let (bytes, vl) = stored(kind, g, rows, cols, &src);
                let m = as_matrix(&bytes, &vl, rows, cols);
                let (ef, er) = check_kernels(&m, &x);
                eprintln!(
                    "{kind:?} g{g} [{rows}x{cols}]: fast-vs-scalar {ef:.1e} scalar-vs-f64 {er:.1e}"
                );
            }
        }
    }
}

#[test]
fn dense_kernels_handle_column_tails() {
    let mut rng = Rng(2);
    for (dtype, kind) in [
        (crate::format::DType::F32, WeightKind::F32),
        (crate::format::DType::F16, WeightKind::F16),
        (crate::format::DType::Bf16, WeightKind::Bf16),
    ] {
        for cols in [1, 3, 7, 8, 9, 31, 33, 37, 100, 1001] {
            let rows = 4;
            let src = rng.normals(rows * cols);
            let bytes: Vec<u8> = match kind {
                WeightKind::F32 => bytemuck::cast_slice(&src).to_vec(),
                WeightKind::F16 => src
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
                _ => src
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
            };
            let m = Matrix::dense(dtype, rows, cols, &bytes);
            check_kernels(&m, &rng.normals(cols));
        }
    }
}

/// x = e_j for every column j: the fast path must return exactly column j of every row, so each
/// SIMD lane is checked on its own (a lane shifted by one, a wrong shift in an unpack or a skipped
/// vector shows up as a wrong column, where a random x might average it away). Codes and float
/// bits are random, f16/bf16 subnormals included.
#[test]
fn one_hot_inputs_read_every_column_from_its_own_lane() {
    let mut rng = Rng(7);
    let finite = |bits: u16, exp_mask: u16| bits & exp_mask != exp_mask;
    for kind in ALL_KINDS {
        // Quantized kinds: groups of 16, and of 64 (the packed kernels' wider steps).
        let shapes: &[(usize, u32)] = if kind.is_quantized() {
            &[(16, 16), (48, 16), (112, 16), (64, 64), (192, 64)]
        } else {
            &[
                (1, 0),
                (3, 0),
                (4, 0),
                (5, 0),
                (15, 0),
                (16, 0),
                (17, 0),
                (35, 0),
                (67, 0),
            ]
        };
        for &(cols, g) in shapes {
            // Nine dense rows: two blocks of the four-row kernels (AVX-512 f16) and one row after.
            let rows = if kind.is_quantized() { 3 } else { 9 };
            let bytes: Vec<u8>;
            let vl;
            match kind {
                WeightKind::F32 => {
                    bytes = bytemuck::cast_slice(&rng.normals(rows * cols)).to_vec();
                    vl = None;
                }
                WeightKind::F16 | WeightKind::Bf16 => {
                    let mask = if kind == WeightKind::F16 {
                        0x7c00
                    } else {
                        0x7f80
                    };
                    bytes = (0..rows * cols)
                        .flat_map(|_| loop {
                            let b = rng.next_u64() as u16;
                            if finite(b, mask) {
                                break b.to_le_bytes();
                            }
                        })
                        .collect();
                    vl = None;
                }
                _ => {
                    let vk = match kind {
                        WeightKind::Int8 => VariantKind::Int8,
                        WeightKind::Int4 => VariantKind::Int4,
                        _ => VariantKind::Int2,
                    };
                    let v = variant(vk, g);
                    let l = v.matrix_layout(rows, cols).unwrap();
                    let mut b = rng.bytes(l.size);
                    for i in 0..rows * cols / g as usize {
                        let sc = f16::from_f32(0.5 + rng.uniform() as f32).to_le_bytes();
                        b[l.scales.start + 2 * i..][..2].copy_from_slice(&sc);
                        if vk.has_mins() {
                            let mn = f16::from_f32(rng.normal()).to_le_bytes();
                            b[l.mins.start + 2 * i..][..2].copy_from_slice(&mn);
                        }
                    }
                    bytes = b;
                    vl = Some((v, l));
                }
            }
            let m = match (&vl, kind) {
                (Some((v, l)), _) => view(*v, l, &bytes),
                (None, WeightKind::F32) => {
                    Matrix::dense(crate::format::DType::F32, rows, cols, &bytes)
                }
                (None, WeightKind::F16) => {
                    Matrix::dense(crate::format::DType::F16, rows, cols, &bytes)
                }
                (None, _) => Matrix::dense(crate::format::DType::Bf16, rows, cols, &bytes),
            };
            let mut w = vec![0.0f32; rows * cols];
            for r in 0..rows {
                m.row_to_f32(r, &mut w[r * cols..(r + 1) * cols]);
            }
            let mut out = vec![0.0f32; rows];
            for path in Fast::all() {
                for j in 0..cols {
                    let mut x = vec![0.0f32; cols];
                    x[j] = 1.0;
                    path.matvec(&m, &x, 0..rows, &mut out);
                    for r in 0..rows {
                        let want = w[r * cols + j];
                        // Exact for float kinds; s * q + m rounds once more for int kinds.
                        let tol = if kind.is_quantized() {
                            1e-5 * (1.0 + want.abs())
                        } else {
                            0.0
                        };
                        assert!(
                            (out[r] - want).abs() <= tol,
                            "{path:?} {kind:?} [{rows}x{cols}] row {r} column {j}: fast path \
                             gave {}, the column holds {want}",
                            out[r]
                        );
                    }
                }
            }
        }
    }
}

/// On aarch64 the dispatch must pick the NEON kernels (so the comparisons above test NEON, not
/// the scalar fallback): `matvec_rows` is bit-identical to calling `neon::matvec_rows` directly,
/// and on long rows NEON's four-lane accumulation order differs from the scalar one in the last
/// bits for some row (so the two are told apart).
#[cfg(target_arch = "aarch64")]
#[test]
fn aarch64_dispatch_selects_neon() {
    assert!(
        std::arch::is_aarch64_feature_detected!("neon"),
        "NEON not reported on aarch64"
    );
    let mut rng = Rng(8);
    let (rows, cols) = (16, 1024);
    for kind in ALL_KINDS {
        let src = rng.normals(rows * cols);
        let (bytes, vl) = stored(kind, 64, rows, cols, &src);
        let m = as_matrix(&bytes, &vl, rows, cols);
        let x = rng.normals(cols);
        let mut dispatched = vec![0.0f32; rows];
        m.matvec_rows(&x, 0..rows, &mut dispatched);
        let mut sums = GroupSums::new();
        let xsums = sums.compute(&m, &x).to_vec();
        let mut direct = vec![0.0f32; rows];
        // SAFETY: NEON is baseline on aarch64 (asserted above); m was built by `view`/`dense`,
        // which ran `check`, and x/direct have cols/rows values.
        unsafe { super::neon::matvec_rows(&m, &x, &xsums, 0..rows, &mut direct) };
        let mut scalar = vec![0.0f32; rows];
        m.matvec_rows_scalar(&x, 0..rows, &mut scalar);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&dispatched),
            bits(&direct),
            "{kind:?}: not the NEON path"
        );
        assert_ne!(
            bits(&direct),
            bits(&scalar),
            "{kind:?}: NEON and scalar agree bit for bit on every row; cannot tell them apart"
        );
    }
}

/// Arbitrary code bytes and scales (every bit pattern of the codes, int8's -128 included).
#[test]
fn kernels_match_on_random_code_bytes() {
    let mut rng = Rng(3);
    for kind in [VariantKind::Int8, VariantKind::Int4, VariantKind::Int2] {
        for g in [16u32, 48, 64, 256] {
            let (rows, cols) = (6, 768);
            let v = variant(kind, g);
            let l = v.matrix_layout(rows, cols).unwrap();
            let mut bytes = rng.bytes(l.size);
            let side = rows * cols / g as usize;
            for i in 0..side {
                let s = f16::from_f32(0.01 + 0.1 * rng.uniform() as f32).to_le_bytes();
                bytes[l.scales.start + 2 * i..][..2].copy_from_slice(&s);
                if kind.has_mins() {
                    let m = f16::from_f32(rng.normal()).to_le_bytes();
                    bytes[l.mins.start + 2 * i..][..2].copy_from_slice(&m);
                }
            }
            check_kernels(&view(v, &l, &bytes), &rng.normals(cols));
        }
    }
}

#[test]
fn splitting_rows_gives_bitwise_identical_results() {
    let mut rng = Rng(4);
    let (rows, cols) = (23, 512);
    for kind in ALL_KINDS {
        let src = rng.normals(rows * cols);
        let (bytes, vl) = stored(kind, 64, rows, cols, &src);
        let m = as_matrix(&bytes, &vl, rows, cols);
        let x = rng.normals(cols);
        for path in Fast::all() {
            let mut whole = vec![0.0f32; rows];
            path.matvec(&m, &x, 0..rows, &mut whole);
            let mut pieces = vec![0.0f32; rows];
            for r in [0..5, 5..6, 6..17, 17..23] {
                path.matvec(&m, &x, r.clone(), &mut pieces[r]);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&pieces), "{path:?} {kind:?}");
        }
    }
}

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
        (VariantKind::Int2, false) => 0.40,
        (VariantKind::Int2, true) => 0.68,
    }
}

#[test]
fn round_trip_error_is_bounded_and_clip_search_beats_min_max() {
    let mut rng = Rng(5);
    let (rows, cols) = (64, 1024);
    for heavy in [false, true] {
        for kind in VariantKind::ALL {
            let groups: &[u32] = if kind.is_float() {
                &[0]
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
                if !kind.is_float() {
                    let plain: f64 = src
                        .chunks_exact(g as usize)
                        .map(|w| plain_group_sse(kind, w))
                        .sum();
                    let plain_rel = (plain / e.ss).sqrt();
                    line += &format!(", plain min/max {plain_rel:.5}");
                    // int8's 255 levels leave little to gain from clipping; 4 and 2 bits gain more.
                    let factor = if kind == VariantKind::Int8 { 1.0 } else { 0.95 };
                    assert!(
                        e.sse < factor * plain,
                        "{line}: clip search not better than min/max"
                    );
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
    for kind in VariantKind::ALL {
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

/// The fast int4 and int2 kernels keep x in a per-thread form between calls (rounded, reordered):
/// a change of x in place must reach the next call, and a NaN or an infinity in x must make the
/// rows that meet it NaN, as the scalar kernel's are.
#[test]
fn the_packed_kernels_follow_x_and_propagate_nan() {
    let mut rng = Rng(31);
    let (rows, cols) = (7, 4096);
    for kind in [WeightKind::Int4, WeightKind::Int2] {
        let src = rng.normals(rows * cols);
        let (bytes, vl) = stored(kind, 64, rows, cols, &src);
        let m = as_matrix(&bytes, &vl, rows, cols);
        let x0 = rng.normals(cols);
        for path in Fast::all() {
            let mut x = x0.clone();
            let mut first = vec![0.0f32; rows];
            path.matvec(&m, &x, 0..rows, &mut first);
            check_kernels(&m, &x);
            x[1000] += 3.0;
            let mut second = vec![0.0f32; rows];
            path.matvec(&m, &x, 0..rows, &mut second);
            assert_ne!(
                first, second,
                "{path:?} {kind:?}: a change of x in place reaches the next call"
            );
            check_kernels(&m, &x);
            // A group of values so small that its factor's inverse would overflow (below ~4e-34
            // throughout) counts as zero where x is rounded: the same results as that group zeroed.
            if path.rounds_x() {
                let mut tiny = x.clone();
                tiny[..64].iter_mut().for_each(|v| *v *= 1e-40);
                let mut zeroed = x.clone();
                zeroed[..64].fill(0.0);
                let (mut a, mut b) = (vec![0.0f32; rows], vec![0.0f32; rows]);
                path.matvec(&m, &tiny, 0..rows, &mut a);
                path.matvec(&m, &zeroed, 0..rows, &mut b);
                assert_eq!(a, b, "{path:?} {kind:?}: a group below f32's normal range");
            }
            for bad in [f32::NAN, f32::INFINITY] {
                let mut y = x.clone();
                y[2049] = bad;
                let mut fast = vec![0.0f32; rows];
                let mut slow = vec![0.0f32; rows];
                path.matvec(&m, &y, 0..rows, &mut fast);
                m.matvec_rows_scalar(&y, 0..rows, &mut slow);
                for (f, s) in fast.iter().zip(&slow) {
                    assert!(
                        f.is_nan() || (f.is_infinite() && s.is_infinite()),
                        "{path:?} {kind:?}, {bad}: fast {f}, scalar {s}"
                    );
                }
            }
        }
    }
}

/// On x86 the dispatch must take the CPU's highest kernel level (so that `Fast::all`'s last path
/// is the one in use): `matvec_rows` is bit-identical to that level's kernels, for every kind. And
/// each level's own kernels (f16 on AVX-512, int4 and int2 on both) differ from the level below's
/// in the last bits, so the comparisons above test different kernels.
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_dispatch_takes_the_detected_level() {
    let Some(top) = super::x86::Level::detected() else {
        eprintln!("no AVX2, FMA and F16C: the scalar kernels are the fast path");
        return;
    };
    eprintln!("x86 kernel level: {top:?}");
    let mut rng = Rng(9);
    let (rows, cols) = (9, 1024);
    for kind in ALL_KINDS {
        let src = rng.normals(rows * cols);
        let (bytes, vl) = stored(kind, 64, rows, cols, &src);
        let m = as_matrix(&bytes, &vl, rows, cols);
        let x = rng.normals(cols);
        let (mut dispatched, mut direct) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        m.matvec_rows(&x, 0..rows, &mut dispatched);
        m.matvec_rows_at(top, &x, 0..rows, &mut direct);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&dispatched),
            bits(&direct),
            "{kind:?}: not the {top:?} kernels"
        );
        let levels = super::x86::Level::ALL
            .into_iter()
            .filter(|level| *level <= top);
        let outs: Vec<_> = levels
            .map(|level| {
                let mut out = vec![0.0f32; rows];
                m.matvec_rows_at(level, &x, 0..rows, &mut out);
                (level, bits(&out))
            })
            .collect();
        for pair in outs.windows(2) {
            let ((below, a), (level, b)) = (&pair[0], &pair[1]);
            let own = match level {
                super::x86::Level::Avx512 => kind == WeightKind::F16 || kind.has_mins(),
                _ => kind.has_mins(),
            };
            if own {
                assert_ne!(a, b, "{kind:?}: {level:?} computes as {below:?}");
            }
        }
    }
}
