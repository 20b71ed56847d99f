//! Dequantize-matvec bandwidth on the GPU, per stored kind, on Mixtral's expert shapes
//! (14336x4096 gate/up and 4096x14336 down), beside the device-to-device copy bandwidth of the
//! same GPU. Bytes counted: codes + scales + mins read once (x and y are negligible).
//! Run on the device machine: `cargo bench --bench gpu_matvec` (skips without a GPU).

use std::time::Instant;

use hob::backend::cuda::{self, DevMat, Gpu};
use hob::format::{DType, MatrixView, Variant};
use hob::quant::Matrix;

fn main() {
    if let Err(why) = cuda::probe() {
        println!("gpu_matvec: skipped ({why})");
        return;
    }
    let gpu = Gpu::open(0).expect("GPU");
    let copy = copy_bandwidth(&gpu);
    println!(
        "device: {} ; device-to-device copy {:.0} GB/s (read + write)",
        gpu.name,
        copy / 1e9
    );
    println!("| kind | shape | bytes | µs | GB/s | share of copy |");
    println!("|---|---|---|---|---|---|");
    for kind in ["f16", "bf16", "int8", "int4", "int2"] {
        for (rows, cols) in [(14336usize, 4096usize), (4096, 14336)] {
            let (m_bytes, layout_of) = layout(kind, rows, cols);
            let dev = gpu.alloc::<u8>(m_bytes.len(), "matrix").expect("alloc");
            let base = cuda::ptr(&dev, &gpu.stream);
            let m = layout_of(&m_bytes);
            let at = |s: &[u8]| {
                if s.is_empty() {
                    base
                } else {
                    base + (s.as_ptr() as usize - m_bytes.as_ptr() as usize) as u64
                }
            };
            let dm = DevMat::new(&m, base, at(m.scales), at(m.mins));
            let x = gpu.alloc::<f32>(cols, "x").expect("alloc");
            let y = gpu.alloc::<f32>(rows, "y").expect("alloc");
            let (xp, yp) = (cuda::ptr(&x, &gpu.stream), cuda::ptr(&y, &gpu.stream));
            let bytes = m.codes.len() + m.scales.len() + m.mins.len();
            for _ in 0..10 {
                gpu.matvec(&dm, xp, yp).expect("matvec");
            }
            gpu.sync().expect("sync");
            let iters = 200;
            let started = Instant::now();
            for _ in 0..iters {
                gpu.matvec(&dm, xp, yp).expect("matvec");
            }
            gpu.sync().expect("sync");
            let secs = started.elapsed().as_secs_f64() / iters as f64;
            let bw = bytes as f64 / secs;
            println!(
                "| {kind} | {rows}x{cols} | {:.1} MB | {:.1} | {:.0} | {:.0}% |",
                bytes as f64 / 1e6,
                secs * 1e6,
                bw / 1e9,
                100.0 * bw / copy
            );
        }
    }
}

/// Views stored bytes as a matrix.
type Viewer = Box<dyn Fn(&[u8]) -> Matrix<'_>>;

/// Random stored bytes of a [rows, cols] matrix in `kind` and a function viewing them.
fn layout(kind: &str, rows: usize, cols: usize) -> (Vec<u8>, Viewer) {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    if let Some(dt) = DType::parse(kind) {
        // Small finite values: 0x2000-0x23ff as f16/bf16 bit patterns.
        let bytes: Vec<u8> = (0..rows * cols)
            .flat_map(|_| (0x2000u16 | (rnd() as u16 & 0x3ff)).to_le_bytes())
            .collect();
        return (bytes, Box::new(move |b| Matrix::dense(dt, rows, cols, b)));
    }
    let v = Variant::parse(kind, None).expect("variant");
    let l = v.matrix_layout(rows, cols).expect("layout");
    let mut bytes: Vec<u8> = (0..l.size).map(|_| rnd() as u8).collect();
    for r in [l.scales.clone(), l.mins.clone()] {
        for c in bytes[r].chunks_exact_mut(2) {
            c.copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    (
        bytes,
        Box::new(move |b| {
            Matrix::from_view(MatrixView {
                variant: v,
                rows,
                cols,
                codes: &b[l.codes.clone()],
                scales: &b[l.scales.clone()],
                mins: &b[l.mins.clone()],
            })
        }),
    )
}

/// Bytes read + written per second by a device-to-device copy of 1 GiB.
fn copy_bandwidth(gpu: &Gpu) -> f64 {
    let n = 1usize << 30;
    let a = gpu.alloc::<u8>(n, "copy source").expect("alloc");
    let mut b = gpu.alloc::<u8>(n, "copy target").expect("alloc");
    let run = |b: &mut cudarc::driver::CudaSlice<u8>| {
        gpu.stream.memcpy_dtod(&a, b).expect("copy");
    };
    run(&mut b);
    gpu.sync().expect("sync");
    let iters = 20;
    let started = Instant::now();
    for _ in 0..iters {
        run(&mut b);
    }
    gpu.sync().expect("sync");
    2.0 * n as f64 * iters as f64 / started.elapsed().as_secs_f64()
}
