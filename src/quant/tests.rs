use half::f16;

use super::*;
use crate::format::{MatrixLayout, Variant, VariantKind};

mod batched;
mod planes;
mod quantizers;

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
    let g = kind.fixed_group_size().unwrap_or(g);
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
        part: 0,
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
        WeightKind::Int4k => VariantKind::Int4k,
        WeightKind::Int3 => VariantKind::Int3,
        WeightKind::Int2 => VariantKind::Int2,
        WeightKind::Int2k => VariantKind::Int2k,
        WeightKind::Mxfp4 => VariantKind::Mxfp4,
        WeightKind::Ap8 { .. } => unreachable!("ap8 stores experts: tests/planes.rs"),
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

const ALL_KINDS: [WeightKind; 10] = [
    WeightKind::F32,
    WeightKind::F16,
    WeightKind::Bf16,
    WeightKind::Int8,
    WeightKind::Int4,
    WeightKind::Int4k,
    WeightKind::Int3,
    WeightKind::Int2,
    WeightKind::Int2k,
    WeightKind::Mxfp4,
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

    /// Whether the quantized kinds round x on this path (the integer dot-product kernel).
    fn rounds_x(self) -> bool {
        match self {
            Fast::Dispatched => crate::quant::packed_rounds_x(),
            #[cfg(target_arch = "x86_64")]
            Fast::X86(level) => level == super::x86::Level::Avx512Vnni,
        }
    }
}

/// How far the fast kernels may stray from the scalar ones, relative to sum |w x|: f32 roundings,
/// or (int8, int4, int2 and MXFP4 on the integer dot-product kernel) x rounded to a power-of-two grid of 15-16
/// significant bits of its group's largest |x| (at most 2.8e-5 seen over these tests, on a
/// 16-column row; 1.2e-5 on 64 columns).
fn fast_bound(fast: Fast, m: &Matrix) -> f64 {
    if m.kind.is_quantized() && fast.rounds_x() {
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
                let mx = matches!(kind, WeightKind::Mxfp4 | WeightKind::Int4k);
                if kind.is_quantized() && cols % g as usize != 0
                    || !kind.is_quantized() && g != 16
                    || mx && g != 32
                    || kind == WeightKind::Int3 && g % 64 != 0
                    || kind == WeightKind::Int2k && g != 16
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
        let shapes: &[(usize, u32)] = if matches!(kind, WeightKind::Mxfp4 | WeightKind::Int4k) {
            &[(32, 32), (96, 32), (256, 32)]
        } else if kind == WeightKind::Int3 {
            &[(64, 64), (192, 64), (256, 128)]
        } else if kind == WeightKind::Int2k {
            &[(16, 16), (48, 16), (112, 16)]
        } else if kind.is_quantized() {
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
                        WeightKind::Int4k => VariantKind::Int4k,
                        WeightKind::Int2k => VariantKind::Int2k,
                        WeightKind::Int3 => VariantKind::Int3,
                        _ => VariantKind::Int2,
                    };
                    let v = variant(vk, g);
                    let l = v.matrix_layout(rows, cols).unwrap();
                    let mut b = rng.bytes(l.size);
                    // int4k, int2k: any (a, b) bytes under a row pair (d, m) of 1/128 and 1/64.
                    let pair = [f16::from_f32(1.0 / 128.0), f16::from_f32(1.0 / 64.0)];
                    for i in (0..rows).filter(|_| vk.is_sub_scaled()) {
                        for (j, h) in pair.iter().enumerate() {
                            b[l.mins.start + 4 * i + 2 * j..][..2]
                                .copy_from_slice(&h.to_le_bytes());
                        }
                    }
                    for i in (0..rows * cols / g as usize).filter(|_| !vk.is_sub_scaled()) {
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
/// bits for some row (so the two are told apart), except MXFP4, which NEON hands to the reference.
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
        // MXFP4 has no NEON kernel yet: NEON dispatch runs the reference kernel for it.
        if kind != WeightKind::Mxfp4 {
            assert_ne!(
                bits(&direct),
                bits(&scalar),
                "{kind:?}: NEON and scalar agree bit for bit on every row; cannot tell them apart"
            );
        }
    }
}

/// Arbitrary code bytes and scales (every bit pattern of the codes, int8's -128 included).
#[test]
fn kernels_match_on_random_code_bytes() {
    let mut rng = Rng(3);
    for kind in [
        VariantKind::Int8,
        VariantKind::Int4,
        VariantKind::Int3,
        VariantKind::Int2,
    ] {
        for g in [16u32, 48, 64, 256] {
            if g % kind.group_multiple() != 0 {
                continue;
            }
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

/// The fast integer kernels keep x in a per-thread form between calls (rounded, reordered):
/// a change of x in place must reach the next call, and a NaN or an infinity in x must make the
/// rows that meet it NaN, as the scalar kernel's are.
#[test]
fn the_packed_kernels_follow_x_and_propagate_nan() {
    let mut rng = Rng(31);
    let (rows, cols) = (7, 4096);
    for kind in [
        WeightKind::Int8,
        WeightKind::Int4,
        WeightKind::Int3,
        WeightKind::Int2,
    ] {
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
/// each level's own kernels (f16 on AVX-512, int4 and int2 on both, int8 on VNNI) differ from the level below's
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
                // (int2k's 16-value groups, as int2/g16's, keep the AVX2 form there.)
                super::x86::Level::Avx512 => {
                    kind == WeightKind::F16
                        || kind.has_mins() && kind != WeightKind::Int2k
                        || kind == WeightKind::Mxfp4
                }
                super::x86::Level::Avx512Vnni => kind.is_quantized(),
                _ => kind.has_mins(),
            };
            if own {
                assert_ne!(a, b, "{kind:?}: {level:?} computes as {below:?}");
            }
        }
    }
}
