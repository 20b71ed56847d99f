//! How fast the CPU helpers run whole decode layers of Mixtral-shaped experts
//! (`HelperPool::ffn_decode`, what `--cpu-experts` runs per layer) beside the plain f16 matvec
//! stream and the host's read rate: whether cooperative decoding loses bandwidth between the
//! kernel's rate and a layer's (two parallel passes per layer, mixed variants).
//!
//! `cargo bench --bench cpu_ffn [-- THREADS]` prints a markdown table: weight GB/s per layer mix
//! (16 layers a pass, each on experts no cache holds, best of 3; the compute time only), with and
//! without a pause between layers (the GPU's part of a layer, when the helper threads sleep).
//! Figures: benches/results/2026-11-23-h100-cpu-expert-layers.md.

mod common;

use std::time::{Duration, Instant};

use hob::backend::cpu::CpuBackend;
use hob::experts::engine::{FfnJob, HelperPool};
use hob::format::{DType, Variant};
use hob::quant::Matrix;

const FFN: usize = 14336;
const HIDDEN: usize = 4096;
/// Experts per kind: 8 f16 experts are 2.8 GB, far more than any cache.
const EXPERTS: usize = 8;
const LAYERS: usize = 16;

/// One kind's experts in anonymous memory: (gate, up, down) byte ranges per expert.
struct Store {
    variant: Option<Variant>,
    bytes: Vec<u8>,
    /// bytes per matrix
    per: usize,
}

impl Store {
    fn f16() -> Store {
        let per = FFN * HIDDEN * 2;
        let bytes = common::f16_weights(EXPERTS * 3 * per);
        Store {
            variant: None,
            bytes,
            per,
        }
    }

    fn quant(name: &str) -> Store {
        let v = Variant::parse(name, Some(64)).expect("known variant");
        let per = v.matrix_layout(FFN, HIDDEN).expect("layout").size;
        Store {
            variant: Some(v),
            // Every byte 0x21: codes, and f16 scales/mins of ~0.0106.
            bytes: vec![0x21; EXPERTS * 3 * per],
            per,
        }
    }

    /// Matrix m (0 gate, 1 up, 2 down) of expert e.
    fn matrix(&self, e: usize, m: usize) -> Matrix<'_> {
        let (rows, cols) = if m == 2 { (HIDDEN, FFN) } else { (FFN, HIDDEN) };
        let b = &self.bytes[(3 * e + m) * self.per..(3 * e + m + 1) * self.per];
        match self.variant {
            None => Matrix::dense(DType::F16, rows, cols, b),
            Some(v) => {
                let l = v.matrix_layout(rows, cols).expect("layout");
                Matrix::from_view(l.view(v, b))
            }
        }
    }

    fn job(&self, e: usize) -> FfnJob<'_> {
        FfnJob {
            mats: [self.matrix(e, 0), self.matrix(e, 1), self.matrix(e, 2)],
            weight: 0.5,
            act: hob::model::ExpertAct::SiluGlu,
            biases: None,
        }
    }
}

/// Weight bytes one job reads.
fn job_bytes(j: &FfnJob<'_>) -> usize {
    j.mats
        .iter()
        .map(|m| m.codes.len() + m.scales.len() + m.mins.len())
        .sum()
}

/// Best of 3 passes of LAYERS layers, weight GB/s of compute time.
fn layers_gbs<'a>(
    cpu: &HelperPool,
    layer: &dyn Fn(usize) -> Vec<FfnJob<'a>>,
    gap: Duration,
) -> f64 {
    let x = vec![0.01f32; HIDDEN];
    let mut best = 0.0f64;
    for _ in 0..3 {
        let (mut busy, mut bytes) = (Duration::ZERO, 0usize);
        for l in 0..LAYERS {
            let jobs = layer(l);
            bytes += jobs.iter().map(job_bytes).sum::<usize>();
            std::thread::sleep(gap);
            let started = Instant::now();
            std::hint::black_box(cpu.ffn_decode(&jobs, &x));
            busy += started.elapsed();
        }
        best = best.max(bytes as f64 / busy.as_secs_f64() / 1e9);
    }
    best
}

fn main() {
    let threads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(0);
    let f16 = Store::f16();
    let int4 = Store::quant("int4");
    let cpu = CpuBackend::new(threads).expect("CPU threads");
    let helpers = HelperPool::new(threads).expect("CPU helper threads");
    let read = cpu.read_bandwidth_gbs(1 << 30);
    // The kernel's own rate: gate matrices one after another, one parallel pass each.
    let x = vec![0.01f32; HIDDEN];
    let mut out = vec![0.0f32; FFN];
    let mut stream = 0.0f64;
    for _ in 0..3 {
        let started = Instant::now();
        for e in 0..EXPERTS {
            cpu.matmul_f32(&f16.matrix(e, 0), &x, 1, &mut out);
        }
        stream = stream.max((EXPERTS * f16.per) as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    println!(
        "{} threads: host read {read:.1} GB/s, f16 matvec stream {stream:.1} GB/s",
        cpu.threads()
    );
    // Layer l uses experts 2l and 2l + 1 (mod EXPERTS): never the previous layer's.
    type Mix<'a> = (&'a str, Box<dyn Fn(usize) -> Vec<FfnJob<'a>> + 'a>);
    let mixes: Vec<Mix<'_>> = vec![
        ("1 f16", Box::new(|l| vec![f16.job(l % EXPERTS)])),
        (
            "2 f16",
            Box::new(|l| vec![f16.job(2 * l % EXPERTS), f16.job((2 * l + 1) % EXPERTS)]),
        ),
        (
            "f16 + int4",
            Box::new(|l| vec![f16.job(2 * l % EXPERTS), int4.job((2 * l + 1) % EXPERTS)]),
        ),
        (
            "2 int4",
            Box::new(|l| vec![int4.job(2 * l % EXPERTS), int4.job((2 * l + 1) % EXPERTS)]),
        ),
    ];
    println!("\n| layer | GB/s | GB/s with 300 µs pauses |");
    println!("|---|---:|---:|");
    for (name, layer) in &mixes {
        let [a, b] = [Duration::ZERO, Duration::from_micros(300)]
            .map(|gap| layers_gbs(&helpers, layer.as_ref(), gap));
        println!("| {name} | {a:.1} | {b:.1} |");
    }
}
