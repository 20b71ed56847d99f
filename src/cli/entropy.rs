//! `hob inspect --entropy`: how far entropy coding could shrink each integer variant's codes, the
//! question to answer before an entropy-coded tier (QMoE codes its ternary experts that way).

use rayon::prelude::*;
use serde_json::{json, Value};

use super::out::outln;
use crate::format::ap8::{self, ApLayout};
use crate::format::{HobFile, MatrixView, VariantKind};

/// Code counts of one variant: each code alone, and each code after the one before it in the
/// same matrix (the context an order-1 coder would use).
struct Counts {
    single: Vec<u64>,
    pairs: Vec<u64>,
}

impl Counts {
    fn new(levels: usize) -> Counts {
        Counts {
            single: vec![0; levels],
            pairs: vec![0; levels * levels],
        }
    }

    fn add(&mut self, m: &MatrixView<'_>, bits: usize) {
        if bits == 3 {
            return self.add_int3(m);
        }
        let levels = self.single.len();
        let per = 8 / bits;
        let mask = (levels - 1) as u8;
        let mut prev: Option<usize> = None;
        for &b in m.codes {
            for j in 0..per {
                let c = ((b >> (j * bits)) & mask) as usize;
                self.single[c] += 1;
                if let Some(p) = prev {
                    self.pairs[p * levels + c] += 1;
                }
                prev = Some(c);
            }
        }
    }

    /// int3's codes, a row's 64-value blocks in order (formats/hob.md).
    fn add_int3(&mut self, m: &MatrixView<'_>) {
        let (rb, lo_len) = (m.cols * 3 / 8, m.cols / 4);
        let mut q = [0u8; 64];
        let mut prev: Option<usize> = None;
        for row in m.codes.chunks_exact(rb).take(m.rows) {
            let (lo, hi) = row.split_at(lo_len);
            for (l, h) in lo.chunks_exact(16).zip(hi.chunks_exact(8)) {
                crate::quant::int3_block(l, h, &mut q);
                for &c in &q {
                    let c = c as usize;
                    self.single[c] += 1;
                    if let Some(p) = prev {
                        self.pairs[p * self.single.len() + c] += 1;
                    }
                    prev = Some(c);
                }
            }
        }
    }

    fn merge(mut self, o: Counts) -> Counts {
        for (a, b) in self.single.iter_mut().zip(o.single) {
            *a += b;
        }
        for (a, b) in self.pairs.iter_mut().zip(o.pairs) {
            *a += b;
        }
        self
    }

    /// Bits per code: (order 0, order 1).
    fn entropies(&self) -> (f64, f64) {
        let h = |counts: &[u64]| {
            let n: u64 = counts.iter().sum();
            let n = n.max(1) as f64;
            counts
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| {
                    let p = c as f64 / n;
                    -p * p.log2()
                })
                .sum::<f64>()
        };
        let levels = self.single.len();
        let total: u64 = self.pairs.iter().sum();
        let h1 = self
            .pairs
            .chunks_exact(levels)
            .map(|row| {
                let n: u64 = row.iter().sum();
                n as f64 / total.max(1) as f64 * h(row)
            })
            .sum();
        (h(&self.single), h1)
    }
}

/// Per integer variant: the order-0 and order-1 entropy of its codes and what a coder reaching
/// them would save of the variant's bytes (scales and mins kept as they are). A stored ap8
/// variant: a row per width (`ap8_widths`).
pub fn report(file: &HobFile) -> Vec<Value> {
    let mut out = Vec::new();
    for (vi, v) in file.variants().iter().enumerate() {
        let bits = v.kind.bits() as usize;
        if v.kind == VariantKind::Ap8 && !v.is_view() {
            out.extend(ap8_widths(file, vi));
            continue;
        }
        if v.kind.is_float() || v.kind == VariantKind::Ap8 || !matches!(bits, 2 | 3 | 4 | 8) {
            continue;
        }
        let levels = 1usize << bits;
        let keys: Vec<(usize, usize)> = (0..file.n_layers())
            .flat_map(|l| (0..file.n_experts()).map(move |e| (l, e)))
            .collect();
        let (counts, code_bytes, other_bytes) = keys
            .par_iter()
            .map(|&(l, e)| {
                let x = file.expert(l, e, vi);
                let mut c = Counts::new(levels);
                let (mut cb, mut ob) = (0u64, 0u64);
                for m in [x.gate(), x.up(), x.down()] {
                    c.add(&m, bits);
                    cb += m.codes.len() as u64;
                    ob += (m.scales.len() + m.mins.len()) as u64;
                }
                (c, cb, ob)
            })
            .reduce(
                || (Counts::new(levels), 0, 0),
                |a, b| (a.0.merge(b.0), a.1 + b.1, a.2 + b.2),
            );
        let (h0, h1) = counts.entropies();
        let total = (code_bytes + other_bytes).max(1) as f64;
        let saves = |h: f64| code_bytes as f64 * (1.0 - h / bits as f64) / total;
        out.push(json!({
            "variant": v.name(),
            "bits": bits,
            "order0_bits": h0,
            "order1_bits": h1,
            "saves_order0": saves(h0),
            "saves_order1": saves(h1),
        }));
    }
    out
}

/// A stored ap8 variant `vi`: the entropy of the codes each width reads (`q8 >> (8 - k)`, the top
/// two bits and k - 2 planes; order 0, from the parent codes' histogram) and what a coder of that
/// view would save of the bytes it reads (its tables kept as they are).
fn ap8_widths(file: &HobFile, vi: usize) -> Vec<Value> {
    let v = file.variants()[vi];
    let gate = &file.expert_layout(vi).gate;
    let n = gate.rows * gate.cols;
    let Ok(layout) = ApLayout::new(gate.cols, gate.rows) else {
        return Vec::new();
    };
    let keys: Vec<(usize, usize)> = (0..file.n_layers())
        .flat_map(|l| (0..file.n_experts()).map(move |e| (l, e)))
        .collect();
    let hist = keys
        .par_iter()
        .map(|&(l, e)| {
            let blob = file.expert(l, e, vi).data;
            let mut h = vec![0u64; 256];
            for p in &layout.parts {
                parent_codes(blob, p, n, &mut h);
            }
            h
        })
        .reduce(
            || vec![0u64; 256],
            |a, b| a.iter().zip(&b).map(|(x, y)| x + y).collect(),
        );
    (ap8::MIN_WIDTH..=ap8::MAX_WIDTH)
        .map(|k| {
            let mut top = vec![0u64; 1 << k];
            for (q, &c) in hist.iter().enumerate() {
                top[q >> (8 - k)] += c;
            }
            let mut c = Counts::new(1 << k);
            c.single = top;
            let h0 = c.entropies().0;
            let code_bytes = (3 * n * usize::from(k) / 8) as f64;
            let saves = code_bytes * (1.0 - h0 / f64::from(k)) / layout.prefix(k) as f64;
            json!({
                "variant": v.at_width(k).name(),
                "bits": k,
                "order0_bits": h0,
                "saves_order0": saves,
            })
        })
        .collect()
}

/// Add the 8-bit parent codes of one matrix (`p`, `n` values) of an ap8 blob to `hist`.
fn parent_codes(blob: &[u8], p: &ap8::PartLayout, n: usize, hist: &mut [u64]) {
    let top = &blob[p.top..p.top + n / 4];
    let planes: Vec<&[u8]> = p.planes.iter().map(|&at| &blob[at..at + n / 8]).collect();
    for (i, &t) in top.iter().enumerate() {
        for j in 0..4 {
            let e = 4 * i + j;
            let mut q = ((t >> (2 * j)) & 3) << 6;
            for (b, plane) in planes.iter().enumerate() {
                q |= ((plane[e / 8] >> (e % 8)) & 1) << (5 - b);
            }
            hist[q as usize] += 1;
        }
    }
}

/// The table `hob inspect --entropy` prints.
pub fn print(rows: &[Value]) {
    outln!(
        "code entropy (bits a code; what a coder reaching it would save of the variant's bytes):"
    );
    for r in rows {
        let order1 = match (r["order1_bits"].as_f64(), r["saves_order1"].as_f64()) {
            (Some(h), Some(s)) => format!(", order 1 {h:.3} (saves {:.1}%)", 100.0 * s),
            _ => String::new(),
        };
        outln!(
            "  {:<10} {} bits: order 0 {:.3} (saves {:.1}%){order1}",
            r["variant"].as_str().unwrap_or(""),
            r["bits"],
            r["order0_bits"].as_f64().unwrap_or(0.0),
            100.0 * r["saves_order0"].as_f64().unwrap_or(0.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ap8 matrix whose element e holds parent code e: every code read back once.
    #[test]
    fn ap8_parent_codes_are_read_from_the_top_bits_and_the_planes() {
        let n = 256;
        let layout = ApLayout::new(64, 64).unwrap();
        let mut blob = vec![0u8; layout.prefix(8)];
        let p = &layout.parts[1];
        for e in 0..n {
            blob[p.top + e / 4] |= ((e >> 6) as u8 & 3) << (2 * (e % 4));
            for b in 0..6 {
                blob[p.planes[b] + e / 8] |= ((e >> (5 - b)) as u8 & 1) << (e % 8);
            }
        }
        let mut hist = vec![0u64; 256];
        parent_codes(&blob, p, n, &mut hist);
        assert_eq!(hist, vec![1u64; 256]);
    }

    #[test]
    fn uniform_codes_have_full_entropy_and_constant_codes_none() {
        let mut c = Counts::new(4);
        c.single = vec![10, 10, 10, 10];
        c.pairs = vec![1; 16];
        let (h0, h1) = c.entropies();
        assert!((h0 - 2.0).abs() < 1e-12 && (h1 - 2.0).abs() < 1e-12);
        let mut z = Counts::new(4);
        z.single = vec![40, 0, 0, 0];
        z.pairs = vec![0; 16];
        z.pairs[0] = 39;
        assert_eq!(z.entropies(), (0.0, 0.0));
    }
}
