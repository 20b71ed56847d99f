//! The kernels of cuda/*.cu, concatenated into one source, compiled by NVRTC once per process for
//! the GPU at hand, the PTX cached on disk (keyed by a hash of the source, the compile options and
//! the GPU architecture), every kernel handle loaded once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::{cuda_err, QShape, QM_QUADS_PER_STEP};
use crate::Error;

/// Every kernel of cuda/*.cu.
pub struct Kernels {
    pub rms_norm: CudaFunction,
    /// LayerNorm with a bias (Phi-3.5-MoE).
    pub layer_norm: CudaFunction,
    /// A bias on each row; a scale; a shared expert's sigmoid-gated SwiGLU (Qwen2-MoE).
    pub add_rows: CudaFunction,
    pub scale: CudaFunction,
    pub shared_gate: CudaFunction,
    /// Per-head QK-norm, RoPE and the KV store in one launch (Qwen3-MoE).
    pub qk_norm_rope_kv: CudaFunction,
    pub rope: CudaFunction,
    pub add_assign: CudaFunction,
    pub add_assign_rows: CudaFunction,
    pub swiglu: CudaFunction,
    /// gpt-oss's clamped SwiGLU with the expert's gate and up biases; the same for a token's
    /// routed experts, and their down biases.
    pub expert_glu: CudaFunction,
    pub expert_glu_routed: CudaFunction,
    pub add_routed_rows: CudaFunction,
    pub to_half: CudaFunction,
    pub gather_rows: CudaFunction,
    pub scatter_axpy: CudaFunction,
    pub gather_rows_half: CudaFunction,
    pub swiglu_half: CudaFunction,
    pub axpy: CudaFunction,
    pub attention: CudaFunction,
    /// The same for heads 257 to 576 wide (attention.cu attention_wide: MLA's latent).
    /// One decode token's q/k/v preparation and attention in one launch (attention.cu
    /// attention_prep).
    pub attention_prep: CudaFunction,
    pub attention_wide: CudaFunction,
    /// Prefill attention over MLA's latent rows, every head's rows of a block sharing each
    /// chunk of them in shared memory (attention.cu attention_prefill_latent); what it may use
    /// in `latent_smem`.
    pub attention_latent: CudaFunction,
    /// MLA's cache rows and query RoPE parts, and each head's own product (mla.cu).
    pub mla_rows: CudaFunction,
    /// By the map's stored kind: f32, f16, bf16, int8 (CudaBackend::mla_map).
    pub mla_matvec: [CudaFunction; 4],
    pub mla_rows_q: [CudaFunction; 4],
    pub mla_dequant: CudaFunction,
    /// Prefill attention (attention.cu attention_prefill_*) for head_dim 32, 64 and 128.
    pub attention_prefill: [CudaFunction; 3],
    /// The float kinds, indexed by kind code: f32, f16, bf16.
    pub matvec: [CudaFunction; 3],
    /// MXFP4 experts (mxfp4.cu): plain, and routed like matvec_q_*_sel, a warp a row with exact
    /// f32 products: where the dp4a forms below do not apply.
    pub matvec_mx: CudaFunction,
    pub matvec_mx_sel: CudaFunction,
    /// ap8 views (ap8.cu): the f32 form, plain and routed (the gpu_matvec bench's comparison for
    /// the dp4a form below), and prefill's f16 row tiles.
    pub matvec_ap8: CudaFunction,
    pub matvec_ap8_sel: CudaFunction,
    pub dequant_ap8_h: CudaFunction,
    /// ap8's decode products (ap8.cu matvec_ap8d, _sel: dp4a on x as 16-bit integers), plain and
    /// routed like matvec_mxfp4_sel (each table entry at its own width).
    pub matvec_ap8d: CudaFunction,
    pub matvec_ap8d_sel: CudaFunction,
    /// int2k's decode products on matvec_c32.cu's loop (matvec_int2k_c32, _sel), where
    /// `Gpu::c32_int2k` takes the layout.
    pub matvec_i2k_c32: CudaFunction,
    pub matvec_i2k_c32_sel: CudaFunction,
    /// MXFP4 through the dp4a loop (matvec_q.cu matvec_qd_mxfp4, _sel): x staged as 16-bit
    /// integers like the integer kinds' matvec_qd_*.
    pub matvec_qd_mx: QKernel,
    pub matvec_qd_mx_sel: QKernel,
    /// int3 through the dp4a loop (matvec_q.cu matvec_qd_int3, _sel, _gu): int2's codes with
    /// each high bit OR'ed in; loads through the ring (QD_RING_INT3), then the same three with
    /// loads in registers (matvec_qd_int3_r*) for layouts the ring does not take (`ring_ok`).
    pub matvec_qd_i3: [QKernel; 6],
    /// int4k through int4's dp4a loop (matvec_q.cu matvec_qd_int4k, _sel, _gu): each chunk's
    /// scale and min from its sub-scale bytes and its row's pair; through int4's ring, then the
    /// same three with loads in registers (matvec_qd_int4k_r*) where `ring_ok` refuses.
    pub matvec_qd_i4k: [QKernel; 6],
    /// int2k through int2's scalar loop (matvec_q.cu matvec_q_int2k, _sel): a 16-value group
    /// a 16-column piece.
    pub matvec_q_i2k: [QKernel; 2],
    /// The integer kinds (matvec_q_*): int8, int4, int2.
    pub matvec_q: [QKernel; 3],
    pub matvec_any: CudaFunction,
    /// Routed integer-kind experts from a device table, several matrices per launch
    /// (matvec_q.cu matvec_q_*_sel).
    pub matvec_q_sel: [QKernel; 3],
    /// The integer kinds on the tensor cores (matvec_qm.cu matvec_qm_*, and matvec_qm_*_sel like
    /// matvec_q_*_sel): sm_80 and later, None before.
    pub matvec_qm: Option<[QKernel; 3]>,
    /// Prefill products of int4 weights (groups of a multiple of 32) on the tensor cores without an f16 tile (dequant.cu
    /// gemm_q4h_64, gemm_q4h_128: 64 or 128 tokens a block): sm_80 and later, None before.
    pub gemm_q4h: Option<[CudaFunction; 2]>,
    /// The same over a layer's prefill experts in one launch (gemm_q4h_grp_64, _128).
    pub gemm_q4h_grp: Option<[CudaFunction; 2]>,
    /// gemm_q4h's form for MXFP4 weights (gemm_mx4h_64, _128).
    pub gemm_mx4h: Option<[CudaFunction; 2]>,
    /// gemm_q4h's and gemm_q4h_grp's forms for int4k weights (gemm_q4k_64, _128, and _grp_).
    pub gemm_q4k: Option<[CudaFunction; 2]>,
    pub gemm_q4k_grp: Option<[CudaFunction; 2]>,
    /// The weighted sums of a layer's prefill expert rows into their tokens (gather_axpy).
    pub gather_axpy: CudaFunction,
    pub sum_splits: CudaFunction,
    pub matvec_qm_sel: Option<[QKernel; 3]>,
    /// The integer kinds through dp4a on x staged as integers (matvec_q.cu matvec_qd_*, and
    /// matvec_qd_*_sel), for groups of whole 16-byte chunks.
    pub matvec_qd: [QKernel; 3],
    pub matvec_qd_sel: [QKernel; 3],
    /// Gate and up of the routed experts with their SwiGLU in one launch (matvec_qd_*_gu).
    pub matvec_qd_gu: [QKernel; 3],
    /// y += W x through matvec_qd_* (matvec_qd_*_add): a decode projection with its residual add.
    pub matvec_qd_add: [QKernel; 3],
    /// int4 and int2 through the dp4a loop with loads in registers (matvec_qd_int4_r, _r_sel,
    /// _r_gu, _r_add; int2 likewise), for layouts whose rows the ring does not take (`ring_ok`).
    pub matvec_qd_r: [[QKernel; 4]; 2],
    /// Three products of one x in one launch, each as matvec_qd_* (matvec_qd_*_3).
    pub matvec_qd3: [QKernel; 3],
    /// Float kinds by kind code: y += W x (matvec_add_*), and three matrices of one x
    /// (matvec3_*).
    pub matvec_add: [CudaFunction; 3],
    /// matvec_add with a whole row held before the wait (matvec_add_deep_*), and its registers
    /// a thread: launched where one wave holds every block (QLimits::wave_blocks).
    pub matvec_add_deep: [(CudaFunction, usize); 3],
    pub matvec3: [CudaFunction; 3],
    /// matvec3 with RoPE and the KV store of one decode token (matvec3_rope_*).
    pub matvec3_rope: [CudaFunction; 3],
    pub rope_kv: CudaFunction,
    /// Decode MoE of float-kind experts from a device table (moe.cu moe_*): routing from the
    /// router's rows, gate+up with SwiGLU, down with the weighted sum and residual add.
    pub moe_route: [CudaFunction; 3],
    /// The MoE block's RMSNorm and moe_route in one launch.
    pub moe_route_norm: [CudaFunction; 3],
    /// The same over many blocks, for routers of many rows (moe.cu moe_route_norm_wide_*).
    pub moe_route_norm_wide: [CudaFunction; 3],
    /// The dynamic shared memory a moe_route_norm launch may take (opted in up to the device's
    /// limit less the kernels' static shared memory): room for the router's rows and the norm's
    /// weights beside x.
    pub route_norm_smem: usize,
    /// Dynamic shared memory the ap8 and matvec_c32.cu kernels may take (x staged:
    /// `Gpu::c32_launch`).
    pub ap8_smem: usize,
    /// Dynamic shared memory attention_prefill_latent may use (opted in at load).
    pub latent_smem: usize,
    pub moe_gate_up: [CudaFunction; 3],
    pub moe_down: [CudaFunction; 3],
    pub route_topk: CudaFunction,
    pub route_grouped: CudaFunction,
    pub moe_combine: CudaFunction,
    /// moe_combine and the next RMSNorm of x in one launch.
    pub moe_combine_norm: CudaFunction,
    /// The routed experts' table and routes of a host-routed decode layer (put_slots).
    pub put_slots: CudaFunction,
    /// A decode token's embedding row, its id read from device memory.
    pub embed_token: CudaFunction,
    pub dequant_rows_h: CudaFunction,
    /// Integer kinds a code word per thread (dequant_words_h), where the layout allows.
    pub dequant_words_h: CudaFunction,
    /// The emulated link's pacing on the copy stream.
    pub link_start: CudaFunction,
    /// Gated decode (gate.cu): a layer's routes to the host, held on a miss; directory changes.
    pub moe_gate: CudaFunction,
    pub moe_gate_apply: CudaFunction,
    pub link_wait: CudaFunction,
    /// Where the PTX came from, for logs: "cache" or "nvrtc (0.21 s)".
    pub origin: String,
    /// Every handle loaded (CUfunction as usize) and its kernel's name.
    pub names: Vec<(usize, String)>,
}

/// An integer matvec kernel (matvec_q.cu matvec_q_<kind>, matvec_qd_<kind>; matvec_qm.cu
/// matvec_qm_<kind>) and its shape for launch plans.
pub struct QKernel {
    pub f: CudaFunction,
    pub shape: QShape,
}

/// Which family a QKernel belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QFamily {
    /// matvec_q_*: f32 products of codes and staged x.
    Scalar,
    /// matvec_qm_*: tensor cores.
    Mma,
    /// matvec_qd_*: dp4a with x in this many byte planes (matvec_q_stage.cu QD_PARTS).
    Dp(usize),
}

impl QKernel {
    pub fn new(
        ctx: &Arc<CudaContext>,
        f: CudaFunction,
        kind: i32,
        family: QFamily,
        ring: usize,
    ) -> crate::Result<QKernel> {
        // Mixtral's 14336 columns stage 61 KB of x: above the 48 KB a launch gets without asking.
        let optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(cuda_err)?;
        // The plans (q_smem) give a block all of it dynamically: a static __shared__ in these
        // kernels would make the attribute below an invalid value.
        let fixed = f
            .get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_err(cuda_err)?;
        if fixed > 0 {
            return Err(Error::Invalid(format!(
                "CUDA: an integer matvec kernel ({family:?}, kind {kind}) has {fixed} bytes of static shared memory; its plans take only dynamic shared memory (cuda/matvec_q.cu)"
            )));
        }
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            optin,
        )
        .map_err(cuda_err)?;
        let regs = f.num_regs().map_err(cuda_err)?.max(1) as usize;
        Ok(QKernel {
            f,
            // R = 4 rows per warp (matvec_q.cu matvec_q_*, matvec_qd_*), or an mma's 16
            // (matvec_qm_*).
            shape: QShape {
                kind,
                rows: if family == QFamily::Mma { 16 } else { 4 },
                regs,
                quads: if family == QFamily::Mma {
                    QM_QUADS_PER_STEP
                } else {
                    0
                },
                dp_parts: match family {
                    QFamily::Dp(p) => p,
                    _ => 0,
                },
                ring: match family {
                    QFamily::Dp(_) => ring,
                    _ => 0,
                },
            },
        })
    }
}

/// x's byte planes in the dp4a kernels (matvec_q_stage.cu QD_PARTS): 16-bit x
/// (benches/results/2026-11-24-h100-dp4a.md).
const QD_PARTS: usize = 2;

/// The dp4a kernels' shared-memory ring steps per kind [int8, int4, int2, int3]
/// (matvec_q_stage.cu QD_RING_*; 0: loads held in registers), by compute capability: sm_90 and
/// later int4 4, int2 3 (benches/results/2026-11-25-h100-qd-ring.md), int3 as int2
/// (2026-12-04-h200-issue54-int3.md); below sm_90, 0: cp.async needs sm_80, and the smaller
/// shared memory of Orin or the RTX 4090 would cut a block's warps (not measured there).
fn qd_ring(major: i32) -> [usize; 4] {
    if major >= 9 {
        [0, 4, 3, 3]
    } else {
        [0; 4]
    }
}

/// The on-disk cache directory: $HOB_CACHE_DIR, else $XDG_CACHE_HOME/hob, else ~/.cache/hob.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HOB_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("hob"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("hob"))
}

impl Kernels {
    /// The kernels' source as NVRTC compiles it: the helpers, then each family (a file may use
    /// what the files before it define).
    pub const SOURCE: &'static str = concat!(
        include_str!("../../../cuda/common.cu"),
        include_str!("../../../cuda/elementwise.cu"),
        include_str!("../../../cuda/attention.cu"),
        include_str!("../../../cuda/matvec_float.cu"),
        include_str!("../../../cuda/mla.cu"),
        include_str!("../../../cuda/route.cu"),
        include_str!("../../../cuda/moe.cu"),
        include_str!("../../../cuda/mxfp4.cu"),
        include_str!("../../../cuda/matvec_q_stage.cu"),
        include_str!("../../../cuda/matvec_q.cu"),
        include_str!("../../../cuda/matvec_c32.cu"),
        include_str!("../../../cuda/ap8.cu"),
        include_str!("../../../cuda/matvec_qm.cu"),
        include_str!("../../../cuda/dequant.cu"),
        include_str!("../../../cuda/link.cu"),
        include_str!("../../../cuda/gate.cu"),
    );

    /// NVRTC's options for a GPU of compute capability major.minor: its architecture and the
    /// values the launch plans share with the kernels (QD_PARTS, QD_RING_*).
    pub fn nvrtc_options(major: i32, minor: i32) -> Vec<String> {
        let ring = qd_ring(major);
        vec![
            format!("--gpu-architecture=compute_{major}{minor}"),
            "-std=c++17".into(),
            format!("-DQD_PARTS={QD_PARTS}"),
            format!("-DQD_RING_INT8={}", ring[0]),
            format!("-DQD_RING_INT4={}", ring[1]),
            format!("-DQD_RING_INT2={}", ring[2]),
            format!("-DQD_RING_INT3={}", ring[3]),
        ]
    }

    pub fn load(ctx: &Arc<CudaContext>) -> crate::Result<Kernels> {
        let (major, minor) = ctx.compute_capability().map_err(cuda_err)?;
        let qd_ring = qd_ring(major);
        let (ptx, origin) = Kernels::ptx(major, minor)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| Error::Invalid(format!("loading the compiled kernels: {e}")))?;
        let names = std::cell::RefCell::new(Vec::new());
        let f = |name: &str| {
            let k = module
                .load_function(name)
                .map_err(|e| Error::Invalid(format!("kernel {name}: {e}")))?;
            names
                .borrow_mut()
                .push((k.cu_function() as usize, name.to_string()));
            Ok::<_, Error>(k)
        };
        // The three integer kinds of one kernel family.
        let qkernels = |stem: &str, suffix: &str, family: QFamily| -> crate::Result<[QKernel; 3]> {
            let k = |kind: i32, name: &str| {
                QKernel::new(
                    ctx,
                    f(&format!("{stem}_{name}{suffix}"))?,
                    kind,
                    family,
                    qd_ring[(kind - 3) as usize],
                )
            };
            Ok([k(3, "int8")?, k(4, "int4")?, k(5, "int2")?])
        };
        // The float kinds of one kernel, by kind code: STEM_f32, STEM_f16, STEM_bf16.
        let floats = |stem: &str| -> crate::Result<[CudaFunction; 3]> {
            Ok([
                f(&format!("{stem}_f32"))?,
                f(&format!("{stem}_f16"))?,
                f(&format!("{stem}_bf16"))?,
            ])
        };
        // mma.sync m16n8k16 with f16 inputs: sm_80 and later.
        let mma = major >= 8;
        // A kind's plain, routed and gate-up dp4a kernels through its ring, then the same three
        // with loads in registers (matvec_q.cu RING_KIND_KERNELS: NAME and NAME_r).
        let ring_set = |name: &str, kind: i32, ring: usize| -> crate::Result<[QKernel; 6]> {
            let k = |suffix: &str, ring| {
                QKernel::new(
                    ctx,
                    f(&format!("{name}{suffix}"))?,
                    kind,
                    QFamily::Dp(QD_PARTS),
                    ring,
                )
            };
            Ok([
                k("", ring)?,
                k("_sel", ring)?,
                k("_gu", ring)?,
                k("_r", 0)?,
                k("_r_sel", 0)?,
                k("_r_gu", 0)?,
            ])
        };
        // A kind's plain, routed and gate-up dp4a kernels with loads in registers (NAME_r).
        let reg_set = |name: &str, kind: i32| -> crate::Result<[QKernel; 4]> {
            let k = |suffix: &str| {
                QKernel::new(
                    ctx,
                    f(&format!("{name}{suffix}"))?,
                    kind,
                    QFamily::Dp(QD_PARTS),
                    0,
                )
            };
            Ok([k("")?, k("_sel")?, k("_gu")?, k("_add")?])
        };
        let mut kernels = Kernels {
            rms_norm: f("rms_norm")?,
            layer_norm: f("layer_norm")?,
            add_rows: f("add_rows")?,
            scale: f("scale")?,
            shared_gate: f("shared_gate")?,
            qk_norm_rope_kv: f("qk_norm_rope_kv")?,
            rope: f("rope")?,
            add_assign: f("add_assign")?,
            add_assign_rows: f("add_assign_rows")?,
            swiglu: f("swiglu")?,
            expert_glu: f("expert_glu")?,
            expert_glu_routed: f("expert_glu_routed")?,
            add_routed_rows: f("add_routed_rows")?,
            to_half: f("to_half")?,
            gather_rows: f("gather_rows")?,
            scatter_axpy: f("scatter_axpy")?,
            gather_rows_half: f("gather_rows_half")?,
            swiglu_half: f("swiglu_half")?,
            axpy: f("axpy")?,
            attention: f("attention")?,
            mla_rows: f("mla_rows")?,
            mla_matvec: {
                let [a, b, c] = floats("mla_matvec")?;
                [a, b, c, f("mla_matvec_int8")?]
            },
            mla_rows_q: {
                let [a, b, c] = floats("mla_rows_q")?;
                [a, b, c, f("mla_rows_q_int8")?]
            },
            mla_dequant: f("mla_dequant")?,
            attention_wide: f("attention_wide")?,
            attention_latent: f("attention_prefill_latent")?,
            attention_prep: f("attention_prep")?,
            attention_prefill: [
                f("attention_prefill_1")?,
                f("attention_prefill_2")?,
                f("attention_prefill_4")?,
            ],
            matvec: floats("matvec")?,
            matvec_mx: f("matvec_mxfp4")?,
            matvec_mx_sel: f("matvec_mxfp4_sel")?,
            matvec_ap8: f("matvec_ap8")?,
            matvec_ap8_sel: f("matvec_ap8_sel")?,
            dequant_ap8_h: f("dequant_ap8_h")?,
            matvec_ap8d: f("matvec_ap8d")?,
            matvec_ap8d_sel: f("matvec_ap8d_sel")?,
            matvec_i2k_c32: f("matvec_int2k_c32")?,
            matvec_i2k_c32_sel: f("matvec_int2k_c32_sel")?,
            matvec_qd_mx: QKernel::new(ctx, f("matvec_qd_mxfp4")?, 6, QFamily::Dp(QD_PARTS), 0)?,
            matvec_qd_mx_sel: QKernel::new(
                ctx,
                f("matvec_qd_mxfp4_sel")?,
                6,
                QFamily::Dp(QD_PARTS),
                0,
            )?,
            matvec_qd_i3: ring_set("matvec_qd_int3", 7, qd_ring[3])?,
            matvec_qd_i4k: ring_set("matvec_qd_int4k", 8, qd_ring[1])?,
            matvec_q_i2k: [
                QKernel::new(ctx, f("matvec_q_int2k")?, 9, QFamily::Scalar, 0)?,
                QKernel::new(ctx, f("matvec_q_int2k_sel")?, 9, QFamily::Scalar, 0)?,
            ],
            matvec_q: qkernels("matvec_q", "", QFamily::Scalar)?,
            matvec_any: f("matvec_any")?,
            matvec_q_sel: qkernels("matvec_q", "_sel", QFamily::Scalar)?,
            matvec_qm: mma
                .then(|| qkernels("matvec_qm", "", QFamily::Mma))
                .transpose()?,
            sum_splits: f("sum_splits")?,
            gemm_q4h: mma
                .then(|| Ok::<_, Error>([f("gemm_q4h_64")?, f("gemm_q4h_128")?]))
                .transpose()?,
            gemm_mx4h: mma
                .then(|| Ok::<_, Error>([f("gemm_mx4h_64")?, f("gemm_mx4h_128")?]))
                .transpose()?,
            gemm_q4k: mma
                .then(|| Ok::<_, Error>([f("gemm_q4k_64")?, f("gemm_q4k_128")?]))
                .transpose()?,
            gemm_q4k_grp: mma
                .then(|| Ok::<_, Error>([f("gemm_q4k_grp_64")?, f("gemm_q4k_grp_128")?]))
                .transpose()?,
            gemm_q4h_grp: mma
                .then(|| Ok::<_, Error>([f("gemm_q4h_grp_64")?, f("gemm_q4h_grp_128")?]))
                .transpose()?,
            gather_axpy: f("gather_axpy")?,
            matvec_qm_sel: mma
                .then(|| qkernels("matvec_qm", "_sel", QFamily::Mma))
                .transpose()?,
            matvec_qd: qkernels("matvec_qd", "", QFamily::Dp(QD_PARTS))?,
            matvec_qd_sel: qkernels("matvec_qd", "_sel", QFamily::Dp(QD_PARTS))?,
            matvec_qd_gu: qkernels("matvec_qd", "_gu", QFamily::Dp(QD_PARTS))?,
            matvec_qd3: qkernels("matvec_qd", "_3", QFamily::Dp(QD_PARTS))?,
            matvec_qd_add: qkernels("matvec_qd", "_add", QFamily::Dp(QD_PARTS))?,
            matvec_qd_r: [
                reg_set("matvec_qd_int4_r", 4)?,
                reg_set("matvec_qd_int2_r", 5)?,
            ],
            matvec_add: floats("matvec_add")?,
            matvec_add_deep: {
                let [a, b, c] = floats("matvec_add_deep")?;
                let regs = |f: CudaFunction| -> crate::Result<(CudaFunction, usize)> {
                    let n = f.num_regs().map_err(cuda_err)?.max(1) as usize;
                    Ok((f, n))
                };
                [regs(a)?, regs(b)?, regs(c)?]
            },
            matvec3: floats("matvec3")?,
            matvec3_rope: floats("matvec3_rope")?,
            rope_kv: f("rope_kv")?,
            moe_route: floats("moe_route")?,
            moe_route_norm: floats("moe_route_norm")?,
            moe_route_norm_wide: floats("moe_route_norm_wide")?,
            route_norm_smem: 0,
            ap8_smem: 0,
            latent_smem: 0,
            moe_gate_up: floats("moe_gate_up")?,
            moe_down: floats("moe_down")?,
            route_topk: f("route_topk")?,
            route_grouped: f("route_grouped")?,
            moe_combine: f("moe_combine")?,
            moe_combine_norm: f("moe_combine_norm")?,
            put_slots: f("put_slots")?,
            embed_token: f("embed_token")?,
            dequant_rows_h: f("dequant_rows_h")?,
            dequant_words_h: f("dequant_words_h")?,
            link_start: f("link_start")?,
            moe_gate: f("moe_gate")?,
            moe_gate_apply: f("moe_gate_apply")?,
            link_wait: f("link_wait")?,
            origin,
            names: Vec::new(),
        };
        kernels.names = names.take();
        kernels.route_norm_smem = kernels.opt_in_route_norm(ctx)?;
        kernels.ap8_smem = kernels.opt_in_ap8(ctx)?;
        kernels.latent_smem = opt_in(ctx, &[&kernels.attention_latent])?;
        Ok(kernels)
    }

    /// The ap8 and matvec_c32.cu kernels stage x in shared memory: opt in to what the device
    /// allows beside each kernel's own (c32_rows' team sums); returns what every one got.
    fn opt_in_ap8(&self, ctx: &Arc<CudaContext>) -> crate::Result<usize> {
        opt_in(
            ctx,
            &[
                &self.matvec_ap8,
                &self.matvec_ap8_sel,
                &self.matvec_ap8d,
                &self.matvec_ap8d_sel,
                &self.matvec_i2k_c32,
                &self.matvec_i2k_c32_sel,
            ],
        )
    }

    /// moe_route_norm may copy the router's rows into shared memory (moe.cu
    /// moe_route_norm_body): opt in to what the device allows; returns what every kind got.
    fn opt_in_route_norm(&self, ctx: &Arc<CudaContext>) -> crate::Result<usize> {
        opt_in(ctx, &self.moe_route_norm.iter().collect::<Vec<_>>())
    }

    /// The kernels' PTX for compute capability major.minor: from the on-disk cache, or compiled
    /// by NVRTC and cached; and where it came from.
    fn ptx(major: i32, minor: i32) -> crate::Result<(Ptx, String)> {
        let arch = format!("compute_{major}{minor}");
        let options = Kernels::nvrtc_options(major, minor);
        let source = Kernels::SOURCE;
        let key = {
            let mut h = crc32c::crc32c(source.as_bytes());
            for o in &options {
                h = crc32c::crc32c_append(h, o.as_bytes());
            }
            format!("kernels-{h:08x}-{}-{arch}.ptx", source.len())
        };
        let cached = cache_dir().map(|d| d.join(&key));
        let found = match cached
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        {
            Some(src) => (Ptx::from_src(src), "cache".to_string()),
            None => {
                let started = Instant::now();
                let ptx = cudarc::nvrtc::compile_ptx_with_opts(
                    source,
                    CompileOptions {
                        options,
                        ..Default::default()
                    },
                )
                .map_err(|e| Error::Invalid(format!("NVRTC failed on cuda/*.cu: {e}")))?;
                if let Some(path) = &cached {
                    // A cache that cannot be written only costs the next process a compile.
                    let write = path
                        .parent()
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|_| {
                            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                            std::fs::write(&tmp, ptx.to_src())?;
                            std::fs::rename(&tmp, path)
                        });
                    if let Err(e) = write {
                        log::warn!("cannot cache compiled kernels at {}: {e}", path.display());
                    }
                }
                let origin = format!("nvrtc ({:.2} s)", started.elapsed().as_secs_f64());
                (ptx, origin)
            }
        };
        Ok(found)
    }
}

/// Opt each kernel in to the most dynamic shared memory the device allows a block beside the
/// kernel's own static shared memory; returns the least any of them got.
fn opt_in(ctx: &Arc<CudaContext>, fs: &[&CudaFunction]) -> crate::Result<usize> {
    let optin = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(cuda_err)?
        .max(0) as usize;
    let mut smem = optin;
    for f in fs {
        let fixed = f
            .get_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_err(cuda_err)?
            .max(0) as usize;
        let dynamic = optin.saturating_sub(fixed);
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            dynamic as i32,
        )
        .map_err(cuda_err)?;
        smem = smem.min(dynamic);
    }
    Ok(smem)
}

#[cfg(test)]
mod tests {
    use super::{qd_ring, Kernels};

    const SOURCE: &str = Kernels::SOURCE;

    /// The text of the block that opens at the first `{` at or after `from` (braces balanced).
    fn block(src: &str, from: usize) -> &str {
        let open = from + src[from..].find('{').expect("a body");
        let mut depth = 0usize;
        for (i, ch) in src[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return &src[open..open + i + 1];
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced braces after byte {from}");
    }

    /// Every `__global__` function of the source: (name, body).
    fn kernels(src: &str) -> Vec<(String, &str)> {
        let key = "__global__ void ";
        src.match_indices(key)
            .map(|(at, _)| {
                let rest = &src[at + key.len()..];
                let rest = rest
                    .trim_start_matches("ATTR ")
                    .trim_start_matches("SEL_ATTR ");
                let name = rest[..rest.find('(').expect("a parameter list")]
                    .trim()
                    .to_string();
                (name, block(src, at))
            })
            .collect()
    }

    #[test]
    fn ring_depths_follow_the_architecture() {
        assert_eq!(qd_ring(9), [0, 4, 3, 3]);
        assert_eq!(qd_ring(10), [0, 4, 3, 3]);
        assert_eq!(qd_ring(8), [0; 4]);
        assert_eq!(qd_ring(7), [0; 4]);
    }

    /// The source refuses to compile without the macros it shares with Rust (`#error`): the
    /// options pass every one of them.
    #[test]
    fn the_options_define_every_macro_the_source_requires() {
        let options = Kernels::nvrtc_options(9, 0);
        let mut required = 0;
        for line in SOURCE.lines() {
            let line = line.trim();
            let names: Vec<&str> = if let Some(name) = line.strip_prefix("#ifndef ") {
                vec![name]
            } else if let Some(rest) = line.strip_prefix("#if !defined(") {
                rest.split("defined(")
                    .map(|n| n.trim_start_matches('(').split(')').next().unwrap_or(""))
                    .collect()
            } else {
                continue;
            };
            for name in names {
                let name = name.trim();
                required += 1;
                assert!(
                    options.iter().any(|o| o.starts_with(&format!("-D{name}="))),
                    "{name} is required by the source but not passed"
                );
            }
        }
        assert!(required >= 4, "{required} required macros found");
    }

    /// Whether `body` calls row_dot with its WAIT (the third template argument) set.
    fn waits_in_row_dot(body: &str) -> bool {
        body.match_indices("row_dot<").any(|(i, m)| {
            let args = &body[i + m.len()..];
            let args = &args[..args.find('>').unwrap_or(args.len())];
            args.split(',').nth(2).map(str::trim) == Some("true")
        })
    }

    /// Under programmatic dependent launch (Gpu::launch_raw) a kernel may start while the one
    /// before it still runs, so every kernel must wait (common.cu pdl_wait) before it touches
    /// memory an earlier kernel writes or reads: in its own body, or in the device function that
    /// does its work. A kernel that forgot would race only on sm_90 and only sometimes.
    #[test]
    fn every_kernel_waits_for_the_one_before() {
        // Device functions that wait themselves (after their first weight loads).
        let waiting = [
            "moe_route_norm_body",
            "moe_route_norm_wide_body",
            "moe_gate_up_body",
            "matvec_body",
            "matvec3_rope_body",
            "matvec_q_body",
            "matvec_qd_body",
            "matvec_qm_body",
            "gather_rows_body",
            "attention_body",
            "c32_plain",
            "c32_routed",
            "mla_matvec_body",
            "mla_rows_q_body",
        ];
        for f in waiting {
            let at = SOURCE
                .find(&format!("void {f}("))
                .unwrap_or_else(|| panic!("{f} not found"));
            let body = block(SOURCE, at);
            // (Or through another of these: matvec_qd_body is matvec_q_body's dp4a form.)
            assert!(
                body.contains("pdl_wait()")
                    || body.contains("PDL_ENTRY()")
                    || waits_in_row_dot(body)
                    || waiting
                        .iter()
                        .any(|g| *g != f && body.contains(&format!("{g}<"))),
                "{f} does not wait"
            );
        }
        let all = kernels(SOURCE);
        assert!(all.len() >= 30, "{} kernels found", all.len());
        for (name, body) in all {
            // The emulated link's clock runs on the copy stream, and the expert directory's
            // changes on the gates' stream, launched without the attribute.
            if name.starts_with("link_") || name == "moe_gate_apply" {
                continue;
            }
            let waits = body.contains("PDL_ENTRY()")
                || body.contains("pdl_wait()")
                || body.contains("BODY<")
                || waiting
                    .iter()
                    .any(|f| body.contains(&format!("{f}<")) || body.contains(&format!("{f}(")));
            assert!(waits, "kernel {name} never waits for the kernel before it");
        }
    }
}
