//! How fast CPU experts can stream weights: multi-threaded f16 matvec over Mixtral-shaped gate
//! matrices (14336 x 4096) from anonymous memory and from a memory-mapped file (the page cache,
//! as `--cpu-experts` reads them), beside a plain parallel read of the host's memory.
//! `cargo bench --bench cpu_stream [-- THREADS...]` prints a markdown table (wall time, best of 3).
//! It answers where cooperative decoding loses bandwidth: in the kernel, or in file-backed pages.
//! The last columns run the int8/int4/int2 (groups of 64) kernels the same way from anonymous
//! memory: weight bytes (codes, scales and mins) per second.

mod common;

use std::io::Write;
use std::time::Instant;

use hob::backend::cpu::CpuBackend;
use hob::format::{DType, MatrixLayout, Variant};
use hob::quant::Matrix;

const FFN: usize = 14336;
const HIDDEN: usize = 4096;
/// Matrices per pass: 8 x 117 MB, more than any cache.
const MATS: usize = 8;

fn pass_gbs(cpu: &CpuBackend, bytes: &[u8], x: &[f32], out: &mut [f32]) -> f64 {
    let per = FFN * HIDDEN * 2;
    pass_with(cpu, bytes, per, x, out, |b| {
        Matrix::dense(DType::F16, FFN, HIDDEN, b)
    })
}

/// Best of 3 passes over MATS matrices of `per` bytes each, `matrix` viewing one.
fn pass_with<'a>(
    cpu: &CpuBackend,
    bytes: &'a [u8],
    per: usize,
    x: &[f32],
    out: &mut [f32],
    matrix: impl Fn(&'a [u8]) -> Matrix<'a>,
) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let started = Instant::now();
        for m in 0..MATS {
            let w = matrix(&bytes[m * per..(m + 1) * per]);
            cpu.matmul_f32(&w, x, 1, out);
        }
        best = best.max((MATS * per) as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = if threads.is_empty() { vec![0] } else { threads };
    let per = FFN * HIDDEN * 2;
    let anon = common::f16_weights(MATS * per);
    let dir = std::env::temp_dir().join(format!("hob-cpu-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("weights.bin");
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&anon))
        .expect("write the weights file");
    let file = std::fs::File::open(&path).expect("open the weights file");
    // SAFETY: the file is private to this process and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("map the weights file");
    let x = vec![0.5f32; HIDDEN];
    let mut out = vec![0.0f32; FFN];
    // The quantized variants: every byte 0x21 (codes, and f16 scales/mins of ~0.0106); the
    // values do not matter for speed.
    let quant: Vec<(Variant, MatrixLayout, Vec<u8>)> = ["int8", "int4", "int2"]
        .iter()
        .map(|name| {
            let v = Variant::parse(name, Some(64)).expect("known variant");
            let l = v.matrix_layout(FFN, HIDDEN).expect("layout");
            let bytes = vec![0x21u8; MATS * l.size];
            (v, l, bytes)
        })
        .collect();
    // The down shape (4096 x 14336): its 57 KB x does not fit a core's L1.
    let x_down = vec![0.5f32; FFN];
    println!("| threads | host read GB/s | f16 matvec, anonymous memory GB/s | f16 down shape (4096 x 14336), anonymous GB/s | f16 matvec, mapped file GB/s | mapped file after MADV_POPULATE_READ GB/s | int8/g64 GB/s | int4/g64 GB/s | int2/g64 GB/s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &t in &threads {
        let cpu = CpuBackend::new(t).expect("CPU threads");
        let read = cpu.read_bandwidth_gbs(1 << 30);
        let a = pass_gbs(&cpu, &anon, &x, &mut out);
        let d = pass_with(&cpu, &anon, per, &x_down, &mut out[..HIDDEN], |b| {
            Matrix::dense(DType::F16, HIDDEN, FFN, b)
        });
        // A fresh mapping each time so the first pass pays the page faults again.
        // SAFETY: as above.
        let fresh = unsafe { memmap2::Mmap::map(&file) }.expect("map the weights file");
        let m = pass_gbs(&cpu, &fresh, &x, &mut out);
        let populated = map
            .advise(memmap2::Advice::PopulateRead)
            .map(|_| pass_gbs(&cpu, &map, &x, &mut out));
        let q: Vec<String> = quant
            .iter()
            .map(|(v, l, bytes)| {
                let g = pass_with(&cpu, bytes, l.size, &x, &mut out, |b| {
                    Matrix::from_view(l.view(*v, b))
                });
                format!("{g:.1}")
            })
            .collect();
        println!(
            "| {} | {read:.1} | {a:.1} | {d:.1} | {m:.1} | {} | {} |",
            cpu.threads(),
            populated.map_or_else(|e| format!("n/a ({e})"), |p| format!("{p:.1}")),
            q.join(" | ")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
