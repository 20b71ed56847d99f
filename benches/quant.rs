//! Quantizer throughput and single-thread matvec bandwidth on Mixtral-shaped expert matrices.
//! `cargo bench --bench quant` prints a markdown table. Weight bytes per second are compared with
//! a plain read of the same number of bytes and with memcpy.
//!
//! Times are this thread's CPU time, not wall time: the machines this runs on are often shared,
//! and time spent descheduled would otherwise count against the kernel.

use std::hint::black_box;
use std::time::Duration;

use hob::format::{DType, Variant};
use hob::quant::{quantize_matrix, Matrix};

/// Gate/up shape [ffn, hidden]; the down projection is [hidden, ffn].
const FFN: usize = 14336;
const HIDDEN: usize = 4096;
const REPS: usize = 7;
/// Rows of the cache-resident run (at most 512 KiB of f32 weights), and its repetitions.
const CACHED_ROWS: usize = 32;
const CACHED_REPS: usize = 100;

/// splitmix64 + Box-Muller: deterministic N(0, sigma) weights.
fn normals(n: usize, sigma: f32) -> Vec<f32> {
    let mut state = 42u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (((z ^ (z >> 31)) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            sigma * ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

/// CPU time consumed by the calling thread so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given, which lives on this stack.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time of one run of `f`.
fn timed(f: impl FnOnce()) -> Duration {
    let start = thread_cpu();
    f();
    thread_cpu() - start
}

/// Median CPU time of `REPS` runs of `f`.
fn median(mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..REPS).map(|_| timed(&mut f)).collect();
    t.sort();
    t[REPS / 2]
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    // `cargo bench --bench quant -- int4 f16` runs only the kinds named (cargo adds "--bench").
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.starts_with(f.as_str()));
    let n = FFN * HIDDEN;
    let src = normals(n, 0.02);
    let x_hidden = normals(HIDDEN, 1.0);
    let x_ffn = normals(FFN, 1.0);

    let bytes: &[u8] = bytemuck::cast_slice(&src);
    let read = median(|| {
        let words: &[u64] = bytemuck::cast_slice(bytes);
        let mut acc = [0u64; 4];
        for c in words.chunks_exact(4) {
            for k in 0..4 {
                acc[k] = acc[k].wrapping_add(c[k]);
            }
        }
        black_box(acc);
    });
    let mut copy = vec![0u8; bytes.len()];
    let memcpy = median(|| {
        copy.copy_from_slice(bytes);
        black_box(&copy);
    });
    println!(
        "single thread, {FFN} x {HIDDEN} weights ({:.0} MB as f32)",
        bytes.len() as f64 / 1e6
    );
    println!(
        "read reference: {:.1} GB/s; memcpy: {:.1} GB/s (bytes copied)",
        gbps(bytes.len(), read),
        gbps(bytes.len(), memcpy)
    );
    println!();
    println!("| kind | bits/w | quantize Mw/s | gate [{FFN}x{HIDDEN}] ms | GB/s | down [{HIDDEN}x{FFN}] ms | GB/s | L2-resident GB/s | scalar GB/s |");
    println!("|---|---|---|---|---|---|---|---|---|");

    let mut out = vec![0.0f32; FFN];
    let mut row =
        |name: &str, bpw: f64, qrate: Option<f64>, gate: Matrix, down: Matrix, size: usize| {
            // The first CACHED_ROWS rows of the gate matrix fit in L2: the compute ceiling,
            // repeated.
            let cached_bytes = size / FFN * CACHED_ROWS;
            let tc = median(|| {
                for _ in 0..CACHED_REPS {
                    gate.matvec_rows(&x_hidden, 0..CACHED_ROWS, &mut out[..CACHED_ROWS]);
                }
            });
            let tg = median(|| gate.matvec_rows(&x_hidden, 0..FFN, &mut out[..FFN]));
            let td = median(|| down.matvec_rows(&x_ffn, 0..HIDDEN, &mut out[..HIDDEN]));
            let ts = timed(|| gate.matvec_rows_scalar(&x_hidden, 0..FFN, &mut out[..FFN]));
            let q = qrate.map_or("-".to_string(), |r| format!("{r:.1}"));
            println!(
                "| {name} | {bpw} | {q} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} |",
                tg.as_secs_f64() * 1e3,
                gbps(size, tg),
                td.as_secs_f64() * 1e3,
                gbps(size, td),
                gbps(cached_bytes * CACHED_REPS, tc),
                gbps(size, ts)
            );
        };

    let f32_gate = Matrix::dense(DType::F32, FFN, HIDDEN, bytes);
    let f32_down = Matrix::dense(DType::F32, HIDDEN, FFN, bytes);
    if wanted("f32") {
        row("f32", 32.0, None, f32_gate, f32_down, bytes.len());
    }

    for name in [
        "f16", "bf16", "int8", "int4", "int4/g32", "int4k", "int3", "int2", "int2k", "mxfp4",
    ]
    .into_iter()
    .filter(|n| wanted(n))
    {
        let v = Variant::parse(name, None).expect("known variant");
        let gate_layout = v.matrix_layout(FFN, HIDDEN).expect("layout");
        let down_layout = v.matrix_layout(HIDDEN, FFN).expect("layout");
        let mut stored = Vec::new();
        let tq = timed(|| stored = quantize_matrix(v, &gate_layout, &src));
        let qrate = n as f64 / tq.as_secs_f64() / 1e6;
        // The down matrix reuses the gate's bytes where the layouts agree (the sequence of groups
        // of a [FFN, HIDDEN] matrix is also a valid [HIDDEN, FFN] one); kinds with a pair a row
        // (int4k, int2k) quantize it for its own shape.
        let same = gate_layout
            == hob::format::MatrixLayout {
                rows: FFN,
                cols: HIDDEN,
                ..down_layout.clone()
            };
        let down_stored = if same {
            Vec::new()
        } else {
            quantize_matrix(v, &down_layout, &src)
        };
        let bpw = v.bits_per_weight(FFN, HIDDEN);
        row(
            &v.name(),
            bpw,
            Some(qrate),
            Matrix::from_view(gate_layout.view(v, &stored)),
            Matrix::from_view(down_layout.view(v, if same { &stored } else { &down_stored })),
            gate_layout.size,
        );
    }

    // ap8 stores whole experts: one of three copies of the source (gate, up, and down read as
    // [HIDDEN, FFN]), each width's gate and down parts read from the blob's prefix.
    if wanted("ap8") {
        let mut blob = Vec::new();
        let tq = timed(|| {
            blob = hob::quant::quantize_ap8_expert(HIDDEN, FFN, [&src, &src, &src]);
        });
        let qrate = 3.0 * n as f64 / tq.as_secs_f64() / 1e6;
        let layout = hob::format::ap8::ApLayout::new(HIDDEN, FFN).expect("ap8 layout");
        for width in [2u8, 3, 4, 5, 8] {
            let prefix = layout.prefix(width);
            let part = |part: u8, rows: usize, cols: usize| Matrix {
                kind: hob::quant::WeightKind::Ap8 { width, part },
                group_size: hob::format::ap8::SUB,
                rows,
                cols,
                codes: &blob[..prefix],
                scales: &[],
                mins: &[],
            };
            let bpw = 8.0 * prefix as f64 / (3 * n) as f64;
            row(
                &format!("ap8@{width}"),
                bpw,
                Some(qrate),
                part(0, FFN, HIDDEN),
                part(2, HIDDEN, FFN),
                prefix / 3,
            );
        }
    }
}
