//! Dequantize-matvec bandwidth on the GPU, per stored kind, on Mixtral's expert shapes
//! (14336x4096 gate/up and 4096x14336 down), beside the device-to-device copy bandwidth of the
//! same GPU. Bytes counted: codes + scales + mins read once (x and y are negligible).
//!
//! Timing: CUDA events around 100 back-to-back launches queued behind a 3 ms spin kernel (so the
//! CPU's launch rate never shows), each launch reading the next of several copies of the matrix
//! (256 MB or more in all, five times the H100's 50 MB L2: "cold", as an expert streamed in for
//! one token is); "warm" reads one copy over and over (an int4 or int2 matrix then sits partly in
//! L2). Every kernel's result is checked against the CPU backend.
//!
//! Run on the device machine: `cargo bench --bench gpu_matvec` (skips without a GPU): the table,
//! then checks of other layouts and inputs. The built executable also takes `explore` (the same,
//! then a sweep of the integer kernels' block size and split, and the ceilings: an empty launch
//! and a kernel that only reads, launched plainly and as hob launches its kernels, with dependent
//! launch) or `explore-only` (the sweep and ceilings alone).

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::CompileOptions;
use hob::backend::cpu::CpuBackend;
use hob::backend::cuda::{
    self, q_smem, ring_ok, DevMat, Gpu, QFamily, QKernel, SlotArgs, SLOTS_MAX_K,
};
use hob::format::{ap8, DType, Variant};
use hob::quant::{Matrix, WeightKind};

const SHAPES: [(usize, usize); 2] = [(14336, 4096), (4096, 14336)];
const ITERS: usize = 100;
/// Bytes of matrix copies a cold timing rotates through.
const ROTATE_BYTES: usize = 256 << 20;

const SPIN: &str = r#"
extern "C" __global__ void bench_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
// A read of n 16-byte words and nothing else: the ceiling a kernel reading that much meets.
extern "C" __global__ void bench_read(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    const unsigned long long st = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * st < n; i += 4 * st) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + st), c = __ldg(p + i + 2 * st), d = __ldg(p + i + 3 * st);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += st) { const uint4 a = __ldg(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void bench_empty() {}
// bench_read as hob's kernels start under dependent launch (common.cu pdl_trigger / pdl_wait):
// the next launch may be scheduled at once, the first U words a thread are issued, then the
// kernel waits for the one before it, then reads the rest U words a thread at a time.
template <int U>
__device__ void read_pdl_body(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
    pdl_trigger();
    unsigned acc = 0;
    const unsigned long long st = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool waited = false;
    for (; i + (U - 1) * st < n; i += U * st) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldg(p + i + u * st);
        if (!waited) {
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (!waited) pdl_wait();
    for (; i < n; i += st) { const uint4 a = __ldg(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void bench_read_pdl_4(const uint4* p, unsigned long long n, unsigned* out) { read_pdl_body<4>(p, n, out); }
extern "C" __global__ void bench_read_pdl_8(const uint4* p, unsigned long long n, unsigned* out) { read_pdl_body<8>(p, n, out); }
extern "C" __global__ void bench_read_pdl_16(const uint4* p, unsigned long long n, unsigned* out) { read_pdl_body<16>(p, n, out); }
// Reading a matrix's codes in the integer kernels' access patterns and nothing else, one step
// ahead in registers as they load: a warp takes tiles of RR * 32 / LPR rows; LPR lanes share a row
// (lane % LPR: its 16-byte column within a run of LPR), each lane RR rows, U runs per step; split
// warps take a tile's steps in turn. mma kernel: LPR 4, RR 2, U 2. Scalar kernel: LPR 32, RR 4, U 1.
template <int LPR, int RR, int U>
__device__ void read_rows_body(const uint4* __restrict__ p, int rows, int n, int split, unsigned* out) {
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
    constexpr int RPI = 32 / LPR, TR = RR * RPI, RUN = LPR * U;
    const int tiles = (rows + TR - 1) / TR, items = tiles * split, nsteps = (n + RUN - 1) / RUN;
    auto load = [&](uint4 (&b)[RR][U], int it, int st) {
        const int tile = it / split;
#pragma unroll
        for (int i = 0; i < RR; i++) {
            const int r = min(tile * TR + lane / LPR + i * RPI, rows - 1);
#pragma unroll
            for (int v = 0; v < U; v++) {
                const int c = st * RUN + v * LPR + lane % LPR;
                b[i][v] = c < n ? __ldg(p + (size_t)r * n + c) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    unsigned acc = 0;
    int it = gw, st = gw % split;
    if (it >= items || st >= nsteps) return;
    uint4 cur[RR][U], nxt[RR][U];
    load(cur, it, st);
    for (;;) {
        int nit = it, nst = st + split;
        if (nst >= nsteps) {
            nit += nw;
            nst = nit % split;
        }
        const bool more = nit < items && nst < nsteps;
        if (more) load(nxt, nit, nst);
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int v = 0; v < U; v++) acc ^= cur[i][v].x ^ cur[i][v].y ^ cur[i][v].z ^ cur[i][v].w;
        if (!more) break;
#pragma unroll
        for (int i = 0; i < RR; i++)
#pragma unroll
            for (int v = 0; v < U; v++) cur[i][v] = nxt[i][v];
        it = nit;
        st = nst;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void bench_read_rows_mma(const uint4* p, int rows, int n, int split, unsigned* out) {
    read_rows_body<4, 2, 2>(p, rows, n, split, out);
}
extern "C" __global__ void bench_read_rows_scalar(const uint4* p, int rows, int n, int split, unsigned* out) {
    read_rows_body<32, 4, 1>(p, rows, n, split, out);
}
// matvec_qm_* with parts of its work skipped (timing only: matvec_qm.cu matvec_qm_body's SKIP).
#define QM_VARIANT(NAME, KIND, SKIP) \
    extern "C" __global__ void __launch_bounds__(512) NAME(const Mat w, const float* x, float* y, int split, int tchunks) { \
        matvec_qm_body<KIND, 2, SKIP>(w, x, nullptr, y, split, tchunks); \
    }
QM_VARIANT(qm_int4_no_staging, KIND_INT4, 1)
QM_VARIANT(qm_int4_no_scales, KIND_INT4, 2)
QM_VARIANT(qm_int4_no_mma, KIND_INT4, 4)
QM_VARIANT(qm_int4_no_staging_scales, KIND_INT4, 3)
QM_VARIANT(qm_int4_loads_only, KIND_INT4, 7)
QM_VARIANT(qm_int2_no_staging, KIND_INT2, 1)
QM_VARIANT(qm_int2_no_staging_scales, KIND_INT2, 3)
QM_VARIANT(qm_int2_loads_only, KIND_INT2, 7)
"#;

fn main() {
    if let Err(why) = cuda::probe() {
        println!("gpu_matvec: skipped ({why})");
        return;
    }
    let explore = std::env::args().any(|a| a == "explore");
    let explore_only = std::env::args().any(|a| a == "explore-only");
    let gpu_arc = Gpu::open(0).expect("GPU");
    let gpu: &Gpu = &gpu_arc;
    let bench = BenchKernels::load(gpu);
    let cpu = CpuBackend::new(0).expect("CPU backend");
    let copy = gpu.copy_gbs(1 << 30).expect("device copy") * 1e9;
    if explore_only {
        let failed = explore_candidates(gpu, &bench, &cpu, copy);
        println!("explore: {failed} candidate result(s) outside their NMSE bounds");
        return;
    }
    println!(
        "device: {} ; {} SMs ; device-to-device copy {:.0} GB/s (read + write)",
        gpu.name,
        gpu.q_limits.sm_count,
        copy / 1e9
    );
    println!();
    println!("| kind | shape | bytes | kernel | cold µs | cold GB/s | cold share | warm µs | warm share | NMSE vs CPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = 0;
    // GPU_MATVEC_KINDS=int2,int4: only those kinds (a quicker A/B of one kernel).
    let only = std::env::var("GPU_MATVEC_KINDS").ok();
    for kind in [
        "f16", "bf16", "int8", "int4", "int4k", "int3", "int2", "int2k", "mxfp4", "ap8@2", "ap8@3",
        "ap8@4", "ap8@8",
    ] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|k| k == kind))
        {
            continue;
        }
        for (rows, cols) in SHAPES {
            // GPU_MATVEC_SHAPES=4096x14336: only those shapes (e.g. for a profiler's launch count).
            if std::env::var("GPU_MATVEC_SHAPES")
                .is_ok_and(|o| !o.split(',').any(|s| s == format!("{rows}x{cols}")))
            {
                continue;
            }
            let t = TestMat::new(gpu, kind, rows, cols, false, ROTATE_BYTES);
            let x = random(cols, 7);
            let want = t.reference(&cpu, &x);
            let xd = upload(gpu, &x);
            let y = gpu.alloc::<f32>(rows, "y").expect("alloc");
            let (xp, yp) = (cuda::ptr(&xd, &gpu.stream), cuda::ptr(&y, &gpu.stream));
            let hob_bound = if kind.starts_with("ap8") || kind == "int2k" {
                // x as 16-bit integers (matvec_c32.cu's loop).
                1e-8
            } else if kind.starts_with("int") || kind == "mxfp4" {
                gpu.q_kernels(&t.mats[0]).0.shape.nmse_bound()
            } else {
                1e-10
            };
            let mut variants: Vec<(String, f64, Run)> = vec![(
                "hob".into(),
                hob_bound,
                Box::new(|m: &DevMat| gpu.matvec(m, xp, yp).expect("matvec")),
            )];
            if kind.starts_with("int") && !["int3", "int4k", "int2k"].contains(&kind) {
                // The integer kernels production does not take here: the scalar one (what runs
                // before sm_80, or for other groups), the tensor-core one, the dp4a one.
                let i = (name_kind(kind) - 3) as usize;
                let prod = gpu.q_kernels(&t.mats[0]).0.f.cu_function();
                let mut others = vec![("scalar", &gpu.kernels.matvec_q[i])];
                // The ring's form only where it takes the layout.
                if gpu.kernels.matvec_qd[i].shape.ring == 0 || ring_ok(&t.mats[0]) {
                    others.push(("dp4a", &gpu.kernels.matvec_qd[i]));
                }
                if i > 0 {
                    others.push(("registers", &gpu.kernels.matvec_qd_r[i - 1][0]));
                }
                if let Some(q) = &gpu.kernels.matvec_qm {
                    others.push(("mma", &q[i]));
                }
                for (name, q) in others {
                    if q.f.cu_function() == prod {
                        continue;
                    }
                    variants.push((
                        name.into(),
                        q.shape.nmse_bound(),
                        Box::new(move |m: &DevMat| {
                            assert!(gpu.matvec_int(m, q, xp, yp).expect("matvec"));
                        }),
                    ));
                }
            }
            if kind == "int2k" {
                // int2's scalar loop: the form matvec_int2k_c32 replaced.
                let q = &gpu.kernels.matvec_q_i2k[0];
                variants.push((
                    "scalar".into(),
                    q.shape.nmse_bound(),
                    Box::new(move |m: &DevMat| {
                        assert!(gpu.matvec_int(m, q, xp, yp).expect("matvec"));
                    }),
                ));
            }
            if kind == "int3" || kind == "int4k" {
                // Loads in registers: the form the ring replaced where it takes the layout.
                let q = match kind {
                    "int3" => &gpu.kernels.matvec_qd_i3[3],
                    _ => &gpu.kernels.matvec_qd_i4k[3],
                };
                if q.f.cu_function() != gpu.q_kernels(&t.mats[0]).0.f.cu_function() {
                    variants.push((
                        "registers".into(),
                        q.shape.nmse_bound(),
                        Box::new(move |m: &DevMat| {
                            assert!(gpu.matvec_int(m, q, xp, yp).expect("matvec"));
                        }),
                    ));
                }
            }
            if kind.starts_with("ap8") {
                // The f32 form the dp4a one replaced: x staged as floats, a warp a row, about two
                // blocks an SM.
                let f = &gpu.kernels.matvec_ap8;
                let sms = gpu.q_limits.sm_count as u32;
                variants.push((
                    "f32 rows".into(),
                    1e-10,
                    Box::new(move |m: &DevMat| {
                        let c = LaunchConfig {
                            grid_dim: ((m.rows as u32).div_ceil(8).min(2 * sms), 1, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: (m.cols as u32).div_ceil(512) * 2048,
                        };
                        launch(gpu, f, c, m, xp, yp, (1, 0));
                    }),
                ));
            }
            if kind == "mxfp4" {
                // The exact warp-a-row kernel the dp4a one replaced where it has a plan.
                variants.push((
                    "exact rows".into(),
                    1e-10,
                    Box::new(|m: &DevMat| gpu.matvec_mxfp4_rows(m, xp, yp).expect("matvec")),
                ));
            }
            let floor = match kind {
                k if k.starts_with("int") => cpu_floor(name_kind(kind)),
                k if k.starts_with("ap8") => cpu_floor(10),
                _ => 0.0,
            };
            for (name, bound, run) in &variants {
                let bound = bound.max(floor);
                let cold = time(gpu, &bench.spin, |i| run(&t.mats[i % t.mats.len()]));
                let warm = time(gpu, &bench.spin, |_| run(&t.mats[0]));
                run(&t.mats[0]);
                let e = nmse(&download(gpu, &y, rows), &want);
                if e > bound {
                    failed += 1;
                }
                let line = format!(
                    "| {kind} | {rows}x{cols} | {:.1} MB | {name} | {:.1} | {:.0} | {:.0}% | {:.1} | {:.0}% | {e:.1e} |",
                    t.bytes as f64 / 1e6,
                    cold * 1e6,
                    t.bytes as f64 / cold / 1e9,
                    100.0 * t.bytes as f64 / cold / copy,
                    warm * 1e6,
                    100.0 * t.bytes as f64 / warm / copy,
                );
                println!("{line}");
            }
            if let Some(p) = kind
                .starts_with("int")
                .then(|| gpu.q_plan(&t.mats[0]))
                .flatten()
            {
                println!(
                    "|   | plan: grid {} x {} threads, {} B shared, split {}, {} chunks per column tile |||||||||",
                    p.grid, p.block, p.smem, p.split, p.tchunks
                );
            }
        }
    }
    println!();
    failed += routed(gpu, &bench, copy, only.as_deref());
    println!();
    failed += checks(gpu, &cpu);
    if explore {
        println!();
        failed += explore_candidates(gpu, &bench, &cpu, copy);
    }
    println!();
    if failed > 0 {
        println!(
            "FAILED: {failed} result(s) outside their kernel's NMSE bound (1e-10; 1e-8 for dp4a on 16-bit x or where the CPU rounds x, 1e-3 on 8-bit x) against the CPU backend"
        );
        std::process::exit(1);
    }
    println!("every result within its kernel's NMSE bound (1e-10; 1e-8 for dp4a on 16-bit x or where the CPU rounds x, 1e-3 on 8-bit x) of the CPU backend");
}

/// A timed launch of its `i`th matrix set.
type RunAt<'a> = dyn Fn(usize) + 'a;

/// One way to run a matvec on a matrix copy.
type Run<'a> = Box<dyn Fn(&DevMat) + 'a>;

/// The bench's own build of hob's kernels plus its spin, read and matvec_qm timing kernels.
struct BenchKernels {
    spin: CudaFunction,
    read: CudaFunction,
    /// bench_read_pdl_{4,8,16}: (words in flight a thread, kernel).
    read_pdl: [(u32, CudaFunction); 3],
    empty: CudaFunction,
    read_rows: [CudaFunction; 2],
    /// matvec_qm_* timing variants: (name, kernel, whether its result is checked).
    qm: Vec<(String, QKernel, bool)>,
}

impl BenchKernels {
    fn load(gpu: &Gpu) -> BenchKernels {
        let src = format!("{}\n{SPIN}", cuda::Kernels::SOURCE);
        let (major, minor) = gpu.compute_capability;
        let options = cuda::Kernels::nvrtc_options(major, minor);
        // Cached beside hob's own kernels ($HOB_CACHE_DIR), keyed by the source and options.
        let cached = std::env::var_os("HOB_CACHE_DIR").map(|d| {
            let h = options.iter().fold(crc32c::crc32c(src.as_bytes()), |h, o| {
                crc32c::crc32c_append(h, o.as_bytes())
            });
            std::path::PathBuf::from(d).join(format!("bench-{h:08x}-{major}{minor}.ptx"))
        });
        let ptx = match cached
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        {
            Some(text) => cudarc::nvrtc::Ptx::from_src(text),
            None => {
                let ptx = cudarc::nvrtc::compile_ptx_with_opts(
                    src,
                    CompileOptions {
                        options,
                        ..Default::default()
                    },
                )
                .expect("NVRTC");
                if let Some(p) = &cached {
                    let _ = std::fs::create_dir_all(p.parent().expect("a directory"));
                    let _ = std::fs::write(p, ptx.to_src());
                }
                ptx
            }
        };
        let module = gpu.ctx.load_module(ptx).expect("module");
        let f = |n: &str| module.load_function(n).expect(n);
        BenchKernels {
            spin: f("bench_spin"),
            read: f("bench_read"),
            read_pdl: [
                (4, f("bench_read_pdl_4")),
                (8, f("bench_read_pdl_8")),
                (16, f("bench_read_pdl_16")),
            ],
            empty: f("bench_empty"),
            read_rows: [f("bench_read_rows_mma"), f("bench_read_rows_scalar")],
            qm: if gpu.kernels.matvec_qm.is_some() {
                [
                    ("qm_int4_no_staging", 4),
                    ("qm_int4_no_scales", 4),
                    ("qm_int4_no_mma", 4),
                    ("qm_int4_no_staging_scales", 4),
                    ("qm_int4_loads_only", 4),
                    ("qm_int2_no_staging", 5),
                    ("qm_int2_no_staging_scales", 5),
                    ("qm_int2_loads_only", 5),
                ]
                .iter()
                .map(|&(n, kind)| {
                    let q = QKernel::new(&gpu.ctx, f(n), kind, QFamily::Mma, 0).expect("kernel");
                    (n.to_string(), q, false)
                })
                .collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// Launch an integer kernel of the bench's module: (w, x, y, split, tchunks).
fn launch(
    gpu: &Gpu,
    f: &CudaFunction,
    c: LaunchConfig,
    m: &DevMat,
    x: u64,
    y: u64,
    (split, tchunks): (i32, i32),
) {
    let mut params = [
        m as *const DevMat as *mut std::ffi::c_void,
        (&x) as *const u64 as *mut std::ffi::c_void,
        (&y) as *const u64 as *mut std::ffi::c_void,
        (&split) as *const i32 as *mut std::ffi::c_void,
        (&tchunks) as *const i32 as *mut std::ffi::c_void,
    ];
    // SAFETY: the arguments match the kernel's signature (matvec_q_*, matvec_qm_*; matvec_ap8
    // reads the first four, split its `staged`); m describes
    // a live device matrix, x holds m.cols floats and y m.rows, and the configuration is one the
    // kernel supports (block a multiple of 32 * split, shared memory as qsmem computes it).
    // Launched as hob launches (dependent launch where the GPU has it): the kernels wait before
    // they touch x or y.
    unsafe { gpu.launch_raw(f, c, &mut params) }.expect("launch");
}

/// Seconds per launch of `run(i)` for i in 0..ITERS, queued behind a spin kernel.
fn time(gpu: &Gpu, spin: &CudaFunction, run: impl Fn(usize)) -> f64 {
    for i in 0..3 {
        run(i);
    }
    gpu.sync().expect("sync");
    let ns: u64 = 3_000_000;
    let mut b = gpu.stream.launch_builder(spin);
    b.arg(&ns);
    // SAFETY: bench_spin takes one u64 and touches no memory.
    unsafe { b.launch(LaunchConfig::for_num_elems(1)) }.expect("spin");
    let ev = || {
        gpu.stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .expect("event")
    };
    let start = ev();
    for i in 0..ITERS {
        run(i);
    }
    let end = ev();
    let ms = start.elapsed_ms(&end).expect("elapsed");
    ms as f64 / 1e3 / ITERS as f64
}

/// A matrix in `kind` with random stored bytes, uploaded as several copies (together at least
/// `rotate` bytes), and the host bytes for the CPU reference.
struct TestMat {
    host: Vec<u8>,
    viewer: Viewer,
    _dev: CudaSlice<u8>,
    mats: Vec<DevMat>,
    bytes: usize,
}

impl TestMat {
    fn new(
        gpu: &Gpu,
        kind: &str,
        rows: usize,
        cols: usize,
        random_scales: bool,
        rotate: usize,
    ) -> TestMat {
        let (host, viewer) = layout(kind, rows, cols, random_scales);
        let stride = host.len().div_ceil(256) * 256;
        let copies = rotate.div_ceil(stride).max(1);
        let mut dev = gpu.alloc::<u8>(stride * copies, "matrices").expect("alloc");
        for i in 0..copies {
            let mut view = dev.slice_mut(i * stride..i * stride + host.len());
            gpu.stream.memcpy_htod(&host, &mut view).expect("upload");
        }
        let base = cuda::ptr(&dev, &gpu.stream);
        let m = viewer(&host);
        let bytes = match m.kind {
            // One matrix of an ap8 expert's prefix: a third of it, less the header.
            WeightKind::Ap8 { .. } => (m.codes.len() - ap8::HEADER) / 3,
            _ => m.codes.len() + m.scales.len() + m.mins.len(),
        };
        let off = |s: &[u8]| {
            if s.is_empty() {
                0
            } else {
                (s.as_ptr() as usize - host.as_ptr() as usize) as u64
            }
        };
        let (oc, os, om) = (off(m.codes), off(m.scales), off(m.mins));
        let mats = (0..copies)
            .map(|i| {
                let b = base + (i * stride) as u64;
                DevMat::new(&m, b + oc, b + os, b + om)
            })
            .collect();
        TestMat {
            host,
            viewer,
            _dev: dev,
            mats,
            bytes,
        }
    }

    /// cpu_floor for this matrix's kind.
    fn cpu_floor(&self) -> f64 {
        if (self.viewer)(&self.host).kind.has_mins() {
            cpu_floor(4)
        } else {
            0.0
        }
    }

    fn reference(&self, cpu: &CpuBackend, x: &[f32]) -> Vec<f32> {
        let m = (self.viewer)(&self.host);
        let mut out = vec![0.0; m.rows];
        cpu.matmul_f32(&m, x, 1, &mut out);
        out
    }
}

/// Views stored bytes as a matrix.
type Viewer = Box<dyn Fn(&[u8]) -> Matrix<'_>>;

/// Random stored bytes of a [rows, cols] matrix in `kind` ("int4/g32" style) and a function
/// viewing them. Scales and mins are 2^-7, or random f16 of either sign in [2^-10, 2^-3).
fn layout(kind: &str, rows: usize, cols: usize, random_scales: bool) -> (Vec<u8>, Viewer) {
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ (rows * 31 + cols) as u64;
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
    if let Some(w) = kind.strip_prefix("ap8@") {
        // The gate of an expert of rows x cols matrices (both multiples of 64): random planes
        // under parent scales of 2^-7 and mins of -2^-7 (row pairs 2^-7, every 16's a = b = 1),
        // random corrections.
        let width: u8 = w.parse().expect("ap8 width");
        let l = ap8::ApLayout::new(cols, rows).expect("ap8 layout");
        let mut bytes: Vec<u8> = (0..l.prefix(8)).map(|_| rnd() as u8).collect();
        for p in &l.parts {
            for c in bytes[p.pairs..p.pairs + 4 * p.rows].chunks_exact_mut(2) {
                c.copy_from_slice(&0x2000u16.to_le_bytes());
            }
            bytes[p.subs..p.subs + p.rows * p.cols / ap8::SUB].fill(0x11);
        }
        let end = l.prefix(width);
        return (
            bytes,
            Box::new(move |b| Matrix {
                kind: WeightKind::Ap8 { width, part: 0 },
                group_size: ap8::SUB,
                rows,
                cols,
                codes: &b[..end],
                scales: &[],
                mins: &[],
            }),
        );
    }
    let v = Variant::parse(kind, None).expect("variant");
    let l = v.matrix_layout(rows, cols).expect("layout");
    let mut bytes: Vec<u8> = (0..l.size).map(|_| rnd() as u8).collect();
    if v.kind == hob::format::VariantKind::Mxfp4 {
        // E8M0 exponents of 2^-7 .. 2^0.
        for e in &mut bytes[l.scales.clone()] {
            *e = 120 + (rnd() % 8) as u8;
        }
        return (bytes, Box::new(move |b| Matrix::from_view(l.view(v, b))));
    }
    for r in [l.scales.clone(), l.mins.clone()] {
        for c in bytes[r].chunks_exact_mut(2) {
            let h = if random_scales {
                let e = 5 + (rnd() % 7) as u16; // f16 exponent field: 2^-10 .. 2^-4
                ((rnd() as u16) & 0x8000) | (e << 10) | (rnd() as u16 & 0x3ff)
            } else {
                0x2000
            };
            c.copy_from_slice(&h.to_le_bytes());
        }
    }
    (bytes, Box::new(move |b| Matrix::from_view(l.view(v, b))))
}

#[path = "../tests/common/random.rs"]
mod random;
use random::random;

#[path = "gpu_matvec/checks.rs"]
mod checks;
#[path = "gpu_matvec/explore.rs"]
mod explore;
#[path = "gpu_matvec/routed.rs"]
mod routed;
use checks::checks;
use explore::explore_candidates;
use routed::routed;

fn upload(gpu: &Gpu, v: &[f32]) -> CudaSlice<f32> {
    let mut d = gpu.alloc::<f32>(v.len(), "vector").expect("alloc");
    gpu.stream.memcpy_htod(v, &mut d).expect("upload");
    d
}

fn download(gpu: &Gpu, d: &CudaSlice<f32>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    gpu.stream
        .memcpy_dtoh(&d.slice(0..n), &mut v)
        .expect("download");
    gpu.sync().expect("sync");
    v
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}

/// The NMSE the CPU reference itself may add for a kind (code 3 int8, 4 int4, 5 int2, 10 ap8):
/// where its kernels round x to 16 bits per group (AVX-512 VNNI, hob::quant::packed_rounds_x),
/// an exact GPU kernel meets the bound of a 16-bit x, 1e-8, as tests/gpu_backend.rs takes it.
fn cpu_floor(code: i32) -> f64 {
    if matches!(code, 3 | 4 | 5 | 7 | 8 | 9 | 10) && hob::quant::packed_rounds_x() {
        1e-8
    } else {
        0.0
    }
}

fn name_kind(name: &str) -> i32 {
    if name.starts_with("int8") {
        3
    } else if name.starts_with("int4k") {
        8
    } else if name.starts_with("int4") {
        4
    } else if name.starts_with("int2k") {
        9
    } else if name.starts_with("int3") {
        7
    } else {
        5
    }
}
