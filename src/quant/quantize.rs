//! Convert-time quantizers. Each group of `group_size` consecutive columns of a row gets the
//! (scale, min) with the least squared error among a small set of candidates: clipped ranges on a
//! grid, each also refitted by least squares on the codes it produces. Scale and min are rounded
//! to f16 before codes and errors are computed, so the error measured is the one a reader sees.

use half::{bf16, f16};
use rayon::prelude::*;

use super::scalar::dequant;
use super::{ErrorStats, Matrix, WeightKind};
use crate::format::{MatrixLayout, Variant, VariantKind};

/// Clip grid for int8: scale candidates `(1 - k * INT8_STEP) * absmax / 127`, k < INT8_STEPS.
const INT8_STEPS: usize = 16;
const INT8_STEP: f32 = 0.02;
/// Range shrink grids for the asymmetric kinds: widths `(1 - k * step) * (max - min)`, centred.
const INT4_STEPS: usize = 16;
const INT4_STEP: f32 = 0.02;
const INT3_STEPS: usize = 16;
const INT3_STEP: f32 = 0.025;
const INT2_STEPS: usize = 16;
const INT2_STEP: f32 = 0.035;

/// Adding then subtracting 1.5 * 2^23 rounds an f32 of magnitude below 2^22 to the nearest
/// integer, ties to even, in plain arithmetic that vectorizes (f32::round_ties_even does not
/// without SSE4.1).
const ROUND_MAGIC: f32 = 12_582_912.0;

#[inline]
fn round_ne(v: f32) -> f32 {
    (v + ROUND_MAGIC) - ROUND_MAGIC
}

/// `v` limited to [lo, hi], written as two selects so it becomes vector max/min instructions
/// (`f32::clamp` keeps NaN semantics that defeat vectorization; sources are finite).
#[inline]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v > lo { v } else { lo };
    if v < hi {
        v
    } else {
        hi
    }
}

/// Nearest f16, saturating at the largest finite f16 (65504) instead of overflowing to infinity.
fn to_f16(v: f32) -> f16 {
    f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
}

/// `to_f16(v).to_f32()` for finite v in plain arithmetic: `half`'s conversions pick F16C at run
/// time behind a call each, and the (scale, min) searches make billions of them in a convert.
#[inline]
pub(super) fn f16_round(v: f32) -> f32 {
    let a = v.abs().min(65504.0);
    let r = if a < 1.0 / 16384.0 {
        // Subnormal f16: multiples of 2^-24 (the scaling by powers of two is exact).
        round_ne(a * 16_777_216.0) / 16_777_216.0
    } else {
        // 10 of f32's 23 mantissa bits, to nearest, ties to even (a carry into the exponent is
        // the correctly rounded next binade).
        let b = a.to_bits();
        f32::from_bits((b + 0x0fff + ((b >> 13) & 1)) & !0x1fff)
    };
    r.copysign(v)
}

/// Groups quantized per parallel task: each group depends on its own values only, so the result
/// does not depend on the split (a dense embedding is ~10^6 groups; an expert matrix ~10^4).
const BLOCK_GROUPS: usize = 1024;

/// Quantize (or convert) a row-major f32 [rows, cols] matrix into `variant`'s stored bytes,
/// laid out as `layout` says (length `layout.size`, padding zeroed). Deterministic.
///
/// `src` must be finite (the convert worker checks before calling); magnitudes beyond f16's range
/// saturate in scales and mins.
pub fn quantize_matrix(variant: Variant, layout: &MatrixLayout, src: &[f32]) -> Vec<u8> {
    assert_eq!(
        src.len(),
        layout.rows * layout.cols,
        "source length vs layout shape"
    );
    debug_assert!(src.iter().all(|v| v.is_finite()), "non-finite source value");
    let mut out = vec![0u8; layout.size];
    let (head, mins) = out.split_at_mut(layout.mins.start);
    let mins = &mut mins[..layout.mins.len()];
    let (codes, scales) = head.split_at_mut(layout.scales.start);
    let scales = &mut scales[..layout.scales.len()];
    let codes = &mut codes[layout.codes.clone()];
    match variant.kind {
        VariantKind::F16 => {
            for (c, &v) in codes.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        VariantKind::Bf16 => {
            for (c, &v) in codes.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
            }
        }
        VariantKind::Int8 => {
            let g = variant.group_size as usize;
            let n = BLOCK_GROUPS;
            src.par_chunks(g * n)
                .zip(codes.par_chunks_mut(g * n))
                .zip(scales.par_chunks_mut(2 * n))
                .for_each(|((src, codes), scales)| {
                    let mut sc = Scratch::new(g);
                    for ((w, c), s) in src
                        .chunks_exact(g)
                        .zip(codes.chunks_exact_mut(g))
                        .zip(scales.chunks_exact_mut(2))
                    {
                        let scale = quantize_group_int8(w, &mut sc, c);
                        s.copy_from_slice(&scale.to_le_bytes());
                    }
                });
        }
        VariantKind::Mxfp4 => {
            let n = BLOCK_GROUPS;
            src.par_chunks(super::mxfp4::BLOCK * n)
                .zip(codes.par_chunks_mut(16 * n))
                .zip(scales.par_chunks_mut(n))
                .for_each(|((src, codes), scales)| {
                    for ((w, c), e) in src
                        .chunks_exact(super::mxfp4::BLOCK)
                        .zip(codes.chunks_exact_mut(16))
                        .zip(scales.iter_mut())
                    {
                        *e = super::mxfp4::quantize_block(w, c);
                    }
                });
        }
        VariantKind::Int4k | VariantKind::Int2k => {
            subscaled_rows(variant.kind, layout.cols, src, codes, (scales, mins))
        }
        VariantKind::Ap8 => unreachable!("ap8 quantizes whole experts: quant::planes"),
        VariantKind::Int4 | VariantKind::Int3 | VariantKind::Int2 => {
            let g = variant.group_size as usize;
            let bits = variant.kind.bits() as usize;
            let (steps, step) = match variant.kind {
                VariantKind::Int4 => (INT4_STEPS, INT4_STEP),
                VariantKind::Int3 => (INT3_STEPS, INT3_STEP),
                _ => (INT2_STEPS, INT2_STEP),
            };
            let (n, gb) = (BLOCK_GROUPS, g * bits / 8);
            src.par_chunks(g * n)
                .zip(codes.par_chunks_mut(gb * n))
                .zip(scales.par_chunks_mut(2 * n).zip(mins.par_chunks_mut(2 * n)))
                .for_each(|((src, codes), (scales, mins))| {
                    let mut sc = Scratch::new(g);
                    let groups = src
                        .chunks_exact(g)
                        .zip(codes.chunks_exact_mut(gb))
                        .zip(scales.chunks_exact_mut(2).zip(mins.chunks_exact_mut(2)));
                    for ((w, c), (s, m)) in groups {
                        let p = search_asym(w, ((1 << bits) - 1) as f32, steps, step, &mut sc);
                        s.copy_from_slice(&f16::from_f32(p.scale).to_le_bytes());
                        m.copy_from_slice(&f16::from_f32(p.min).to_le_bytes());
                        pack(&sc.q, bits, c);
                    }
                });
            if bits == 3 {
                int3_rows(codes, layout.cols);
            }
        }
    }
    out
}

/// int4k and int2k rows: each group's (scale, min) by int4's (int2's) search, the row's pair
/// (d, dm) from the largest of them, then per group the 8-bit (4-bit) multiples (a, b) within 2
/// of the nearest with the least weighted error, codes recomputed under f16(d a), f16(dm b) as a
/// reader dequantizes them (int4k: within 1 or 3 measured worse,
/// benches/results/2026-12-04-h200-issue54-int4k.md).
fn subscaled_rows(
    kind: VariantKind,
    cols: usize,
    src: &[f32],
    codes: &mut [u8],
    (scales, mins): (&mut [u8], &mut [u8]),
) {
    let int2 = kind == VariantKind::Int2k;
    let (g, bits) = if int2 { (16, 2) } else { (32, 4) };
    let (nmax, steps, step) = match int2 {
        true => (3.0, INT2_STEPS, INT2_STEP),
        false => (15.0, INT4_STEPS, INT4_STEP),
    };
    // a in [0, amax], b in [-bmax - 1, bmax]: u8 and i8, or a byte's two nibbles.
    let (amax, bmax) = if int2 { (15.0, 7.0) } else { (255.0, 127.0) };
    let (gpr, sb) = (cols / g, if int2 { 1 } else { 2 });
    src.par_chunks(cols)
        .zip(codes.par_chunks_mut(cols * bits / 8))
        .zip(scales.par_chunks_mut(sb * gpr).zip(mins.par_chunks_mut(4)))
        .for_each(|((row, codes), (scales, pair))| {
            let mut sc = Scratch::new(g);
            let found: Vec<AsymParams> = row
                .chunks_exact(g)
                .map(|w| search_asym(w, nmax, steps, step, &mut sc))
                .collect();
            let top = |f: fn(&AsymParams) -> f32| found.iter().map(f).fold(0.0f32, f32::max);
            let d = f16_round(top(|p| p.scale) / amax);
            let m = f16_round(top(|p| p.min.abs()) / bmax);
            pair[..2].copy_from_slice(&to_f16(d).to_le_bytes());
            pair[2..].copy_from_slice(&to_f16(m).to_le_bytes());
            let near = |v: f32, step: f32, lo: f32, hi: f32| match step > 0.0 {
                true => clamp(round_ne(v / step), lo, hi),
                false => 0.0,
            };
            let groups = row.chunks_exact(g).zip(&found).zip(
                codes
                    .chunks_exact_mut(g * bits / 8)
                    .zip(scales.chunks_exact_mut(sb)),
            );
            for ((w, p), (c, ab)) in groups {
                weigh(w, !int2, &mut sc);
                let a0 = near(p.scale, d, 0.0, amax);
                let b0 = near(p.min, m, -bmax - 1.0, bmax);
                let mut best = (f32::INFINITY, 0.0, 0.0);
                for (da, db) in (-2..=2).flat_map(|i| (-2..=2).map(move |j| (i as f32, j as f32))) {
                    let (a, b) = (clamp(a0 + da, 0.0, amax), clamp(b0 + db, -bmax - 1.0, bmax));
                    let (s, mn) = (f16_round(d * a), f16_round(m * b));
                    codes_into(w, s, mn, 0.0, nmax, &mut sc.q);
                    let e = sse(w, s, mn, &mut sc);
                    if e < best.0 {
                        best = (e, a, b);
                    }
                }
                let (_, a, b) = best;
                codes_into(w, f16_round(d * a), f16_round(m * b), 0.0, nmax, &mut sc.q);
                pack(&sc.q, bits, c);
                if int2 {
                    ab[0] = a as u8 | ((b as i8 as u8) << 4);
                } else {
                    ab[0] = a as u8;
                    ab[1] = b as i8 as u8;
                }
            }
        });
}

/// int3 rows from `pack`'s 24-byte blocks (16 low bytes, 8 high) to the stored form: a row's low
/// bytes, then its high bytes.
fn int3_rows(codes: &mut [u8], cols: usize) {
    let rb = cols * 3 / 8;
    let mut row = vec![0u8; rb];
    for r in codes.chunks_exact_mut(rb) {
        let (lo, hi) = row.split_at_mut(cols / 4);
        for ((b, l), h) in r
            .chunks_exact(24)
            .zip(lo.chunks_exact_mut(16))
            .zip(hi.chunks_exact_mut(8))
        {
            l.copy_from_slice(&b[..16]);
            h.copy_from_slice(&b[16..]);
        }
        r.copy_from_slice(&row);
    }
}

/// Pack codes of `bits` bits little-endian: code i in bits (i * bits) % 8 of byte i * bits / 8;
/// 3-bit codes in blocks of 64: 16 bytes of low bits as int2's, 8 of high bits (formats'
/// `int3_hi_bit`), which `int3_rows` then splits into a row's two parts.
fn pack(q: &[f32], bits: usize, out: &mut [u8]) {
    if bits == 3 {
        for (o, qs) in out.chunks_exact_mut(24).zip(q.chunks_exact(64)) {
            o.fill(0);
            for (e, &v) in qs.iter().enumerate() {
                let (c, hb) = (v as u8, crate::format::int3_hi_bit(e));
                o[e / 4] |= (c & 3) << (2 * (e % 4));
                o[16 + hb / 8] |= (c >> 2) << (hb % 8);
            }
        }
        return;
    }
    let per = 8 / bits;
    for (o, qs) in out.iter_mut().zip(q.chunks_exact(per)) {
        *o = qs
            .iter()
            .enumerate()
            .fold(0u8, |b, (j, &v)| b | ((v as u8) << (j * bits)));
    }
}

/// Sums over a group in eight interleaved lanes, added up lane by lane at the end: a fixed order
/// (so the result is the same on every machine) that the compiler turns into vector adds.
#[derive(Clone, Copy)]
struct Lanes([f32; 8]);

impl Lanes {
    fn new() -> Lanes {
        Lanes([0.0; 8])
    }
    #[inline(always)]
    fn add(&mut self, v: &[f32]) {
        for (a, &b) in self.0.iter_mut().zip(v) {
            *a += b;
        }
    }
    #[inline(always)]
    fn total(&self) -> f32 {
        self.0.iter().sum()
    }
}

/// Scratch for the per-element passes of one group. Each pass is a plain map over the group (which
/// the compiler vectorizes); the sums over them follow in `Lanes`.
pub(super) struct Scratch {
    pub(super) q: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    /// Each value's weight in the asymmetric search's error (all 1 for int8's).
    pub(super) wt: Vec<f32>,
}

impl Scratch {
    pub(super) fn new(g: usize) -> Scratch {
        Scratch {
            q: vec![0.0; g],
            a: vec![0.0; g],
            b: vec![0.0; g],
            wt: vec![1.0; g],
        }
    }
}

/// Codes of a group for scale `s` and min `m` (both f16-exact): round((w - m) / s) limited to
/// [lo, hi]; all 0 when s is 0 (a constant or too-small group).
#[inline(always)]
fn codes_into(w: &[f32], s: f32, m: f32, lo: f32, hi: f32, q: &mut [f32]) {
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(w) {
        *q = round_ne(clamp((v - m) * inv, lo, hi));
    }
}

/// Squared error of the codes in `sc.q` under (s, m), as a reader dequantizes them, each value's
/// weighted by `sc.wt`.
#[inline(always)]
fn sse(w: &[f32], s: f32, m: f32, sc: &mut Scratch) -> f32 {
    for (((e, &q), &v), &k) in sc.a.iter_mut().zip(&sc.q).zip(w).zip(&sc.wt) {
        let d = dequant(s, q, m) - v;
        *e = k * d * d;
    }
    let mut acc = Lanes::new();
    sc.a.chunks_exact(8).for_each(|c| acc.add(c));
    acc.total()
}

/// Returns the group's scale; writes its codes.
fn quantize_group_int8(w: &[f32], sc: &mut Scratch, codes: &mut [u8]) -> f16 {
    let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let consider = |best: (f32, f16), s: f16, sc: &mut Scratch| {
        codes_into(w, s.to_f32(), 0.0, -127.0, 127.0, &mut sc.q);
        let e = sse(w, s.to_f32(), 0.0, sc);
        if e < best.0 {
            (e, s)
        } else {
            best
        }
    };
    let mut best = (f32::INFINITY, f16::ZERO);
    // A group already on a symmetric grid (a GGUF's Q4_0 or Q5_0 block, w = d * (q - 8 or 16))
    // keeps it: the shrink grid below would round its values a second time.
    if let Some(s) = int8_grid_step(w) {
        best = consider(best, to_f16(s), sc);
    }
    for k in 0..INT8_STEPS {
        best = consider(
            best,
            to_f16((1.0 - k as f32 * INT8_STEP) * amax / 127.0),
            sc,
        );
    }
    // Least-squares scale for the best grid point's codes: sum(q w) / sum(q q).
    codes_into(w, best.1.to_f32(), 0.0, -127.0, 127.0, &mut sc.q);
    let (mut qw, mut qq) = (Lanes::new(), Lanes::new());
    for ((a, b), (&q, &v)) in sc.a.iter_mut().zip(sc.b.iter_mut()).zip(sc.q.iter().zip(w)) {
        *a = q * v;
        *b = q * q;
    }
    sc.a.chunks_exact(8)
        .zip(sc.b.chunks_exact(8))
        .for_each(|(a, b)| {
            qw.add(a);
            qq.add(b);
        });
    let (qw, qq) = (qw.total(), qq.total());
    if qq > 0.0 && qw > 0.0 {
        best = consider(best, to_f16(qw / qq), sc);
    }
    codes_into(w, best.1.to_f32(), 0.0, -127.0, 127.0, &mut sc.q);
    for (c, &q) in codes.iter_mut().zip(&sc.q) {
        *c = q as i8 as u8;
    }
    best.1
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AsymParams {
    /// f16-exact (`f16_round`), as stored.
    pub(super) scale: f32,
    pub(super) min: f32,
}

/// `search_asym_inline` compiled for AVX2 where the CPU has it: its passes over a group run 8
/// lanes wide instead of SSE2's 4 (benches/results/2026-12-05-cpu-issue51-convert-on-grid.md).
/// Rust contracts no float arithmetic, so both give the same bits (test
/// `the_avx2_search_is_the_baseline_search`).
pub(super) fn search_asym(
    w: &[f32],
    nmax: f32,
    steps: usize,
    step: f32,
    sc: &mut Scratch,
) -> AsymParams {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(
            w: &[f32],
            nmax: f32,
            steps: usize,
            step: f32,
            sc: &mut Scratch,
        ) -> AsymParams {
            search_asym_inline(w, nmax, steps, step, sc)
        }
        // SAFETY: the CPU has AVX2 (detected above); the function is otherwise safe.
        return unsafe { avx2(w, nmax, steps, step, sc) };
    }
    search_asym_inline(w, nmax, steps, step, sc)
}

/// The (scale, min) with the least squared error over the shrink grid and each grid point's
/// least-squares refit; leaves the winner's codes in `sc.q`. The first candidate is plain
/// [min, max]; ties keep the earlier one.
#[inline(always)]
pub(super) fn search_asym_inline(
    w: &[f32],
    nmax: f32,
    steps: usize,
    step: f32,
    sc: &mut Scratch,
) -> AsymParams {
    let (lo, hi) = w
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let squared = nmax >= 15.0;
    weigh(w, squared, sc);
    let (mut sk, mut skw) = (Lanes::new(), Lanes::new());
    for (a, (&k, &v)) in sc.a.iter_mut().zip(sc.wt.iter().zip(w)) {
        *a = k * v;
    }
    sc.wt.chunks_exact(8).for_each(|c| sk.add(c));
    sc.a.chunks_exact(8).for_each(|c| skw.add(c));
    let (sk, skw) = (sk.total(), skw.total());
    let range = hi - lo;
    let eval = |p: AsymParams, sc: &mut Scratch| {
        codes_into(w, p.scale, p.min, 0.0, nmax, &mut sc.q);
        sse(w, p.scale, p.min, sc)
    };
    let mut best = (
        f32::INFINITY,
        AsymParams {
            scale: 0.0,
            min: f16_round(lo),
        },
    );
    // A group already on a grid of at most nmax + 1 levels (a llama.cpp Q4_K sub-block read
    // from a GGUF) keeps its grid: the shrink grid below would round its values a second time.
    for p in grid_candidates(w, (lo, hi), nmax) {
        let e = eval(p, sc);
        if e < best.0 {
            best = (e, p);
        }
    }
    // On its grid within 1% of a step (f16 rounding of scale and min): the search below cannot
    // do better by more than that rounding, and it was half of a Q4_K GGUF's convert time.
    let near_step = 0.01 * range / nmax;
    if best.0 <= sk * near_step * near_step {
        eval(best.1, sc);
        return best.1;
    }
    for k in 0..steps {
        let width = (1.0 - k as f32 * step) * range;
        let p = AsymParams {
            scale: f16_round(width / nmax),
            min: f16_round(lo + 0.5 * (range - width)),
        };
        let e = eval(p, sc);
        if e < best.0 {
            best = (e, p);
        }
        // Weighted least squares for (scale, min) on these codes: minimise
        // sum wt (s q + m - w)^2.
        if let Some(r) = refit(w, sk, skw, sc) {
            let e = eval(r, sc);
            if e < best.0 {
                best = (e, r);
            }
        }
        if range == 0.0 {
            break;
        }
    }
    // Below 4 bits, alternate codes and the least-squares (scale, min) from the best point while
    // it improves: KL -4% to -6% for int3 and int2 on shakespeare-moe; int4 gained nothing there
    // and lost 3% on the demo (benches/results/2026-12-04-cpu-issue54-kquants-shakespeare.md).
    let rounds = if squared { 0 } else { REFINE_ROUNDS };
    for _ in 0..rounds {
        eval(best.1, sc);
        let Some(r) = refit(w, sk, skw, sc) else {
            break;
        };
        let e = eval(r, sc);
        if e < best.0 {
            best = (e, r);
        } else {
            break;
        }
    }
    eval(best.1, sc);
    best.1
}

/// Each value's error weight into `sc.wt`: av + |w| (av the group's RMS; squared for int4): the
/// larger weights matter more, as llama.cpp's k-quants weigh them without an importance matrix.
/// The demo model's perplexity chose the forms (benches/results/2026-12-02-cpu-weighted-quant.md).
#[inline(always)]
pub(super) fn weigh(w: &[f32], squared: bool, sc: &mut Scratch) {
    let mut sq = Lanes::new();
    for (a, &v) in sc.a.iter_mut().zip(w) {
        *a = v * v;
    }
    sc.a.chunks_exact(8).for_each(|c| sq.add(c));
    let av = (sq.total() / w.len() as f32).sqrt();
    for (k, &v) in sc.wt.iter_mut().zip(w) {
        let a = av + v.abs();
        *k = if squared { a * a } else { a };
    }
}

/// Rounds of codes-then-refit after int3's and int2's grid search (`search_asym`).
const REFINE_ROUNDS: usize = 4;

/// The (scale, min) minimising sum wt (s q + m - w)^2 for the codes in `sc.q` (sk: sum wt,
/// skw: sum wt w); None where the codes do not determine a positive scale.
#[inline(always)]
pub(super) fn refit(w: &[f32], sk: f32, skw: f32, sc: &mut Scratch) -> Option<AsymParams> {
    for ((a, b), (&q, &k)) in
        sc.a.iter_mut()
            .zip(sc.b.iter_mut())
            .zip(sc.q.iter().zip(&sc.wt))
    {
        *a = k * q;
        *b = k * q * q;
    }
    let (mut skq, mut skqq, mut skqw) = (Lanes::new(), Lanes::new(), Lanes::new());
    sc.a.chunks_exact(8)
        .zip(sc.b.chunks_exact(8))
        .for_each(|(a, b)| {
            skq.add(a);
            skqq.add(b);
        });
    for (a, &v) in sc.a.iter_mut().zip(w) {
        *a *= v;
    }
    sc.a.chunks_exact(8).for_each(|c| skqw.add(c));
    let (skq, skqq, skqw) = (skq.total(), skqq.total(), skqw.total());
    let det = sk * skqq - skq * skq;
    if det <= 0.0 {
        return None;
    }
    let s = (sk * skqw - skq * skw) / det;
    (s > 0.0).then(|| AsymParams {
        scale: f16_round(s),
        min: f16_round((skw - s * skq) / sk),
    })
}

/// The step of the symmetric grid the group's values sit on (every value k * step, |k| <= 127),
/// tried at the smallest nonzero magnitude and its halves to quarters; None for values off such a
/// grid (the first values reject continuous weights).
fn int8_grid_step(w: &[f32]) -> Option<f32> {
    let small = w
        .iter()
        .map(|v| v.abs())
        .filter(|&a| a > 0.0)
        .fold(f32::INFINITY, f32::min);
    if !small.is_finite() {
        return None;
    }
    (1..=4).map(|j| small / j as f32).find(|&step| {
        let fits = |&v: &f32| {
            let k = v / step;
            k.abs() <= 127.0 && (k - k.round()).abs() <= 1e-3
        };
        w.iter().take(5).all(fits) && w.iter().all(fits)
    })
}

/// Where the group's values sit on evenly spaced levels, at most nmax + 1 of them (nmax < 16):
/// that step as the scale, with each placement of the lowest level among the codes as the min
/// (the values are exact under any; f16 rounding of scale and min decides). Nothing for values
/// off any such grid (checked on five values first: sorting every group cost convert 35% more
/// time).
#[inline(always)]
fn grid_candidates(w: &[f32], (lo, hi): (f32, f32), nmax: f32) -> impl Iterator<Item = AsymParams> {
    let (step, placements) = grid_step(w, (lo, hi), nmax).unwrap_or((0.0, 0));
    (0..placements).map(move |j| AsymParams {
        scale: f16_round(step),
        min: f16_round(lo - j as f32 * step),
    })
}

/// `grid_candidates`' grid: its step and how many placements of its lowest level the codes allow.
#[inline(always)]
pub(super) fn grid_step(w: &[f32], (lo, hi): (f32, f32), nmax: f32) -> Option<(f32, usize)> {
    let range = hi - lo;
    if range.is_nan() || range <= 0.0 || nmax >= 16.0 {
        return None;
    }
    // On such a grid, (x - lo) / range is k / L with L <= 15, so times lcm(1..=15) an integer:
    // five values that are not almost surely reject continuous weights for a few multiplies.
    let per = 360_360.0 / f64::from(range);
    let off_grid = |x: f32| {
        let f = f64::from(x - lo) * per;
        (f - f.round_ties_even()).abs() > 0.1
    };
    if w.iter().take(5).any(|&x| off_grid(x)) {
        return None;
    }
    // One level's values are the same bits (scale * q - min of one q). Each value is compared
    // with all 16 slots without an early exit; empty slots hold NaN bits (the input is finite).
    let mut seen = [u32::MAX; 16];
    let mut n = 0;
    for &x in w {
        let b = x.to_bits();
        if !seen.iter().fold(false, |hit, &y| hit | (y == b)) {
            if n as f32 > nmax {
                return None;
            }
            seen[n] = b;
            n += 1;
        }
    }
    let seen = seen.map(f32::from_bits);
    let seen = &seen[..n];
    // The least gap between two levels: the least |a - b| over all pairs is an adjacent pair's in
    // sorted order, and rounding keeps that order, so this is the sorted scan's value.
    let mut gap = f32::INFINITY;
    for (i, &a) in seen.iter().enumerate() {
        for &b in &seen[..i] {
            gap = gap.min((a - b).abs());
        }
    }
    let levels = (range / gap).round();
    if !gap.is_finite() || levels > nmax {
        return None;
    }
    let step = range / levels;
    let on_grid = seen.iter().all(|&x| {
        let k = (x - lo) / step;
        (k - k.round()).abs() <= 1e-3
    });
    on_grid.then_some((step, (nmax - levels) as usize + 1))
}

/// Measure the error of stored bytes against the f32 source.
pub fn measure_error(
    variant: Variant,
    layout: &MatrixLayout,
    stored: &[u8],
    src: &[f32],
) -> ErrorStats {
    assert_eq!(
        src.len(),
        layout.rows * layout.cols,
        "source length vs layout shape"
    );
    let m = Matrix {
        kind: WeightKind::from_variant(variant.kind),
        group_size: variant.group_size as usize,
        rows: layout.rows,
        cols: layout.cols,
        codes: &stored[layout.codes.clone()],
        scales: &stored[layout.scales.clone()],
        mins: &stored[layout.mins.clone()],
    };
    m.check();
    measure_view(m, src)
}

/// Measure the error of a stored matrix against the f32 source (`rows * cols` values).
pub fn measure_view(m: Matrix, src: &[f32]) -> ErrorStats {
    assert_eq!(src.len(), m.rows * m.cols, "source length vs matrix shape");
    // Pieces of rows on the pool (convert measures each variant after its parallel quantization),
    // each summed alone and the pieces added in order: the same sums on any number of threads.
    const ROWS: usize = 64;
    let cols = m.cols.max(1);
    let pieces: Vec<(f64, f64)> = src
        .par_chunks(cols * ROWS)
        .enumerate()
        .map(|(i, piece)| {
            let (mut sse, mut ss) = (0.0, 0.0);
            let mut row = vec![0.0f32; m.cols];
            for (j, s) in piece.chunks_exact(cols).enumerate() {
                m.row_to_f32(i * ROWS + j, &mut row);
                for (&a, &b) in row.iter().zip(s) {
                    let d = a as f64 - b as f64;
                    sse += d * d;
                    ss += b as f64 * b as f64;
                }
            }
            (sse, ss)
        })
        .collect();
    let mut stats = ErrorStats::default();
    for (sse, ss) in pieces {
        stats.sse += sse;
        stats.ss += ss;
    }
    stats.count = src.len() as u64;
    stats
}
