//! `CudaBackend`: the forward pass's ops on the device (model::ops::Backend), decode steps
//! recorded as CUDA graphs and replayed, and what it reports (model::ops::Telemetry).

use super::*;
use crate::model::routing::Routing;

/// Dense weights resident on the device, found by the host address of their mmap bytes.
pub struct CudaBackend {
    pub(super) gpu: Arc<Gpu>,
    pub(super) mats: HashMap<usize, (DevMat, CudaSlice<u8>)>,
    pub(super) vectors: HashMap<usize, CudaSlice<f32>>,
    /// MLA's per-head maps not read in their stored kind, as f32 (mla.rs), by the host address
    /// of their stored codes.
    pub(super) mla: HashMap<usize, (DevMat, CudaSlice<f32>)>,
    /// Room for one MLA map's f32 rows (a prefill's GEMM of a map stored in another kind).
    pub(super) mla_rows: Option<CudaSlice<f32>>,
    pub(super) scratch: CudaSlice<f32>,
    pub(super) scratch_len: usize,
    pub(super) resident_bytes: usize,
    /// A decode step's position and (stage_token) its token's id, in device memory (read by its
    /// attention, RoPE and embedding launches, so that one recording serves every token), and
    /// the position last written there.
    pub(super) step: CudaSlice<i32>,
    pub(super) pos_now: Mutex<Option<usize>>,
    /// The recorded decode step (a CUDA graph) and its key; None: that key's steps run direct.
    pub(super) graph: Mutex<Option<(u64, Option<DecodeGraph>)>>,
    /// A launch since the recording began took the decode position as an argument.
    pub(super) baked: AtomicBool,
    /// Decode steps run from the recording.
    pub(super) replays: AtomicU64,
    /// Nanoseconds spent submitting them (for --stats).
    pub(super) launch_ns: AtomicU64,
    /// The last q/k/v launch was matvec3_rope, which lets later kernels start only after its
    /// own wait: the o projection that follows may read the residual before it waits
    /// (matvec_float.cu matvec_body `early`). Taken by that projection (matmul_add).
    pub(super) qkv_settled: AtomicBool,
}

/// A CUDA graph of one decode step.
pub(super) struct DecodeGraph(pub(super) cudarc::driver::CudaGraph);

// SAFETY: a CUgraph/CUgraphExec may be used from any thread as long as calls on it are
// serialized; DecodeGraph is only reached through CudaBackend's Mutex.
unsafe impl Send for DecodeGraph {}

/// Rows of an integer matrix dequantized per prefill tile when `fit` rows fit the scratch: all
/// of them if they fit, else a multiple of 256: cuBLAS gives other tile heights older, slower
/// kernels, 256-row multiples the ones whole matrices get
/// (benches/results/2026-11-24-h100-prefill.md).
pub(super) fn prefill_tile_rows(fit: usize, rows: usize) -> usize {
    // A launch's grid takes at most 65535 row tiles (dequant.cu dequant_*_h: one row a y block).
    if fit >= rows && rows <= 65535 {
        return rows.max(1);
    }
    let fit = fit.min(65535);
    if fit >= 256 {
        fit - fit % 256
    } else {
        fit.max(1)
    }
}

/// Floats of the dequantization tile used by prefill products (64 MiB).
pub(super) const SCRATCH_FLOATS: usize = 16 << 20;

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Host = PinnedFloats;
    type Kv = CudaKv;

    fn alloc(&self, n: usize) -> crate::Result<CudaSlice<f32>> {
        self.gpu.alloc(n, "activations")
    }

    fn alloc_kv(
        &self,
        layers: usize,
        ctx: usize,
        kv_dim: usize,
        values_are_keys: bool,
    ) -> crate::Result<CudaKv> {
        let n = layers * ctx * kv_dim;
        Ok(CudaKv {
            ctx,
            kv_dim,
            k: self.gpu.alloc(n, "the KV cache")?,
            v: self
                .gpu
                .alloc(if values_are_keys { 1 } else { n }, "the KV cache")?,
            values_are_keys,
        })
    }

    fn upload(&self, src: &[f32], dst: &mut CudaSlice<f32>) -> crate::Result<()> {
        check_len("upload destination", dst.len(), src.len())?;
        self.gpu.upload_f32_queued(src, self.p(dst))
    }

    fn embed(
        &self,
        table: &Matrix<'_>,
        tokens: &[u32],
        dst: &mut CudaSlice<f32>,
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let n = tokens.len() * table.cols;
        check_len("embedding destination", dst.len(), n)?;
        if tokens.len() < STAGED_EMBED_MIN {
            // (upload: a queued pageable copy)
            return embed_via_host(self, table, tokens, dst, host);
        }
        self.gpu
            .upload_staged(n, self.p(dst), |out| embed_rows(table, tokens, out))
    }

    fn stage_token(&self, table: &Matrix<'_>, token: u32, pos: usize) -> crate::Result<bool> {
        if self.mat(table).is_err() {
            return Ok(false);
        }
        if token as usize >= table.rows {
            return Err(Error::Invalid(format!(
                "embedding: token {token} past the table's {} rows",
                table.rows
            )));
        }
        let p = step_pos(pos)?;
        let at = ptr(&self.step, &self.gpu.stream);
        let s = self.gpu.stream.cu_stream();
        let mut now = self.pos_now.lock().unwrap_or_else(|e| e.into_inner());
        // (A 64-bit cuStreamWriteValue64_v2 of both was refused on the H100 under CUDA 13:
        // CUDA_ERROR_INVALID_VALUE.)
        for (i, v) in [p, token].into_iter().enumerate() {
            if i == 0 && *now == Some(pos) {
                continue;
            }
            // SAFETY: `step` holds two i32, each set by a memset queued on the stream (no host
            // buffer), ordered before the launches that read them.
            unsafe { cudarc::driver::sys::cuMemsetD32Async(at + 4 * i as u64, v, 1, s) }
                .result()
                .map_err(cuda_err)?;
        }
        *now = Some(pos);
        Ok(true)
    }

    fn embed_staged(&self, table: &Matrix<'_>, dst: &mut CudaSlice<f32>) -> crate::Result<()> {
        check_len("embedding destination", dst.len(), table.cols)?;
        let w = *self.mat(table)?;
        let tp = ptr(&self.step, &self.gpu.stream) + 4;
        let (kind, dp) = (w.kind, self.p(dst));
        let c = cfg(blocks(table.cols, 256), 256);
        launch!(self.gpu, self.gpu.kernels.embed_token, c; w, kind, tp, dp)
    }

    fn alloc_host(&self, n: usize) -> crate::Result<PinnedFloats> {
        self.gpu.alloc_floats(n)
    }

    fn download_host(
        &self,
        src: &CudaSlice<f32>,
        dst: &mut PinnedFloats,
        n: usize,
    ) -> crate::Result<()> {
        check_len("download source", src.len(), n)?;
        check_len("download destination", dst.len(), n)?;
        // (Page-locked: the copy lands by DMA, nothing to copy out after.)
        self.gpu.read_direct(self.p(src), &mut dst[..n])
    }

    fn download(&self, src: &CudaSlice<f32>, dst: &mut [f32]) -> crate::Result<()> {
        check_len("download source", src.len(), dst.len())?;
        self.gpu.download_f32(self.p(src), dst)
    }

    fn matmul(
        &self,
        w: &Matrix<'_>,
        x: &CudaSlice<f32>,
        t: usize,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        check_len("matmul input", x.len(), t * w.cols)?;
        check_len("matmul output", out.len(), t * w.rows)?;
        let dm = *self.mat(w)?;
        self.matmul_dev(&dm, self.p(x), t, self.p(out))
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        rows: Range<usize>,
        w: &[f32],
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let n = w.len();
        check_len("rms_norm input", x.len(), rows.end * n)?;
        check_len("rms_norm output", out.len(), rows.len() * n)?;
        let (xp, wp, op) = (self.p(x), self.vector(w)?, self.p(out));
        let (ni, r0) = (n as i32, rows.start as i32);
        launch!(self.gpu, self.gpu.kernels.rms_norm, cfg(rows.len() as u32, rms_block(n)); xp, wp, op, ni, r0, eps)
    }

    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        t: usize,
        width: usize,
        start_pos: usize,
        inv_freq: &[f32],
    ) -> crate::Result<()> {
        // The position is an argument here: a recorded decode step cannot replay this.
        self.baked.store(true, Ordering::Relaxed);
        check_len("rope input", x.len(), t * width)?;
        let half = inv_freq.len();
        let (xp, fp) = (self.p(x), self.vector(inv_freq)?);
        let (ti, wi, hi, si) = (t as i32, width as i32, half as i32, start_pos as i32);
        let n = t * width / 2;
        launch!(self.gpu, self.gpu.kernels.rope, cfg(blocks(n, 256), 256); xp, fp, ti, wi, hi, si)
    }

    fn add_assign(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> crate::Result<()> {
        check_len("add input", x.len().min(y.len()), n)?;
        let (xp, yp, ni) = (self.p(x), self.p(y), n as i32);
        launch!(self.gpu, self.gpu.kernels.add_assign, cfg(blocks(n, 256), 256); xp, yp, ni)
    }

    fn layer_norm(
        &self,
        x: &CudaSlice<f32>,
        rows: Range<usize>,
        (w, b): (&[f32], &[f32]),
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let n = w.len();
        check_len("layer_norm input", x.len(), rows.end * n)?;
        check_len("layer_norm output", out.len(), rows.len() * n)?;
        check_len("layer_norm bias", b.len(), n)?;
        let (xp, wp, bp, op) = (self.p(x), self.vector(w)?, self.vector(b)?, self.p(out));
        let (ni, r0) = (n as i32, rows.start as i32);
        let c = cfg(rows.len() as u32, rms_block(n));
        launch!(self.gpu, self.gpu.kernels.layer_norm, c; xp, wp, bp, op, ni, r0, eps)
    }

    fn scale(&self, x: &mut CudaSlice<f32>, n: usize, factor: f32) -> crate::Result<()> {
        check_len("scale input", x.len(), n)?;
        let (xp, ni) = (self.p(x), n as i32);
        launch!(self.gpu, self.gpu.kernels.scale, cfg(blocks(n, 256), 256); xp, factor, ni)
    }

    fn add_rows(&self, x: &mut CudaSlice<f32>, t: usize, bias: &[f32]) -> crate::Result<()> {
        let n = t * bias.len();
        check_len("add_rows input", x.len(), n)?;
        let (xp, bp) = (self.p(x), self.vector(bias)?);
        let (wi, ni) = (bias.len() as i32, n as i32);
        launch!(self.gpu, self.gpu.kernels.add_rows, cfg(blocks(n, 256), 256); xp, bp, wi, ni)
    }

    fn shared_gate(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        s: Option<&CudaSlice<f32>>,
        (t, width): (usize, usize),
    ) -> crate::Result<()> {
        let n = t * width;
        check_len("shared_gate input", gate.len().min(up.len()), n)?;
        if let Some(s) = s {
            check_len("shared_gate logits", s.len(), t)?;
        }
        let sp = s.map_or(0, |s| self.p(s));
        self.shared_gate_launch((self.p(gate), self.p(up), sp), (t, width))
    }

    fn kv_write(
        &self,
        kv: &mut CudaKv,
        (layer, start): (usize, usize),
        t: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> crate::Result<()> {
        // The position is an argument here: a recorded decode step cannot replay this.
        self.baked.store(true, Ordering::Relaxed);
        let n = t * kv.kv_dim;
        check_len("kv_write input", k.len().min(v.len()), n)?;
        let (kd, vd) = kv.rows(layer, start, t, &self.gpu.stream)?;
        let (kp, vp, ni) = (self.p(k), self.p(v), n as i32);
        // to_half: four values a thread.
        let c = cfg(blocks(n.div_ceil(4), 256), 256);
        launch!(self.gpu, self.gpu.kernels.to_half, c; kp, kd, ni)?;
        if kv.values_are_keys {
            return Ok(());
        }
        launch!(self.gpu, self.gpu.kernels.to_half, c; vp, vd, ni)
    }

    fn mla_inputs(
        &self,
        qc: (&CudaSlice<f32>, &CudaSlice<f32>),
        w: &MlaInputs<'_>,
        step: &QkvStep<'_>,
        out: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        self.mla_inputs_dev(qc, w, step, out, kv)
    }

    fn mla_values(
        &self,
        att: &CudaSlice<f32>,
        v_b: (&Matrix<'_>, &MlaShape),
        th: (usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        self.mla_values_dev(att, v_b, th, out)
    }

    fn attention(
        &self,
        shape: AttentionShape<'_>,
        q: &CudaSlice<f32>,
        kv: &CudaKv,
        layer: usize,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        if shape.head_dim > 576 {
            return Err(Error::Invalid(format!(
                "CUDA backend: head_dim {} is above the attention kernels' 576",
                shape.head_dim
            )));
        }
        let qd = shape.n_heads * shape.head_dim;
        check_len("attention input", q.len(), shape.t * qd)?;
        check_len("attention output", out.len(), shape.t * qd)?;
        let base = (layer * kv.ctx * kv.kv_dim * 2) as u64;
        let s = &self.gpu.stream;
        let (kp, vp) = (ptr(&kv.k, s) + base, kv.values(s) + base);
        let (qp, op) = (self.p(q), self.p(out));
        let (nh, nkv, hd, sp) = (
            shape.n_heads as i32,
            shape.n_kv_heads as i32,
            shape.head_dim as i32,
            shape.start_pos as i32,
        );
        let window = shape.window.map_or(0, |w| w as i32);
        let sinks = self.sinks_ptr(&shape)?;
        // Prefill over MLA's latent rows (keys and values alike, one KV head): a block per
        // ATL_ROWS (query, head) rows, each chunk of rows in shared memory once for all of them
        // (cuda/attention.cu attention_prefill_latent).
        let latent = shape.t > 1
            && kv.values_are_keys
            && shape.n_kv_heads == 1
            && shape.window.is_none()
            && sinks == 0
            && shape.head_dim.is_multiple_of(8)
            && self.gpu.kernels.latent_smem >= ATL_SMEM;
        if latent {
            let (t, rows) = (shape.t as i32, shape.t * shape.n_heads);
            let c = LaunchConfig {
                grid_dim: (rows.div_ceil(ATL_ROWS) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: ATL_SMEM as u32,
            };
            let f = &self.gpu.kernels.attention_latent;
            return launch!(self.gpu, f, c; qp, kp, op, nh, hd, t, sp);
        }
        // Prefill: a block per ATP_ROWS (query, head) rows of one KV head (cuda/attention.cu
        // attention_prefill_*), for head_dim 32, 64 or 128 and groups that divide ATP_ROWS.
        let group = shape.n_heads / shape.n_kv_heads.max(1);
        let dpl = match shape.head_dim {
            32 => Some(0),
            64 => Some(1),
            128 => Some(2),
            _ => None,
        };
        if let Some(i) = dpl.filter(|_| {
            shape.t > 1
                && shape.n_kv_heads > 0
                && shape.n_heads.is_multiple_of(shape.n_kv_heads)
                && ATP_ROWS.is_multiple_of(group)
        }) {
            let (t, qpb) = (shape.t as i32, ATP_ROWS / group);
            let c = LaunchConfig {
                grid_dim: (shape.n_kv_heads as u32, shape.t.div_ceil(qpb) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let f = &self.gpu.kernels.attention_prefill[i];
            return launch!(self.gpu, f, c; qp, kp, vp, op, nh, nkv, t, sp, window, sinks);
        }
        // Decode: 16 warps share a head's positions (latency-bound; 8 for the wide heads, whose
        // registers do not fit 16 warps a block); prefill: 4 per query.
        let wide = shape.head_dim > 256;
        let c = LaunchConfig {
            grid_dim: (shape.n_heads as u32, shape.t as u32, 1),
            block_dim: (
                match (shape.t, wide) {
                    (1, false) => 512,
                    (1, true) => 256,
                    _ => 128,
                },
                1,
                1,
            ),
            shared_mem_bytes: 0,
        };
        let posp = if shape.t == 1 {
            self.pos_ptr(shape.start_pos)?
        } else {
            0u64
        };
        let f = match wide {
            true => &self.gpu.kernels.attention_wide,
            false => &self.gpu.kernels.attention,
        };
        launch!(self.gpu, f, c; qp, kp, vp, op, nh, nkv, hd, sp, window, posp, sinks)
    }

    /// One token: the three products in one launch (k and v first: their few blocks start
    /// before q's).
    fn matmul_qkv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        t: usize,
        out: [&mut CudaSlice<f32>; 3],
    ) -> crate::Result<()> {
        let [q, k, v] = out;
        let (kvq, outs) = ([w[1], w[2], w[0]], [&*k, &*v, &*q]);
        if t == 1 && self.products_in_one_launch(kvq, x, outs, 3)? {
            return Ok(());
        }
        self.matmul(w[0], x, t, q)?;
        self.matmul(w[1], x, t, k)?;
        self.matmul(w[2], x, t, v)
    }

    /// One token: the two products in one launch (the three-product kernels, two rows of the
    /// grid).
    fn matmul_pair(
        &self,
        w: [&Matrix<'_>; 2],
        x: &CudaSlice<f32>,
        t: usize,
        [a, b]: [&mut CudaSlice<f32>; 2],
    ) -> crate::Result<()> {
        let (w3, outs) = ([w[0], w[1], w[0]], [&*a, &*b, &*a]);
        if t == 1 && self.products_in_one_launch(w3, x, outs, 2)? {
            return Ok(());
        }
        self.matmul(w[0], x, t, a)?;
        self.matmul(w[1], x, t, b)
    }

    /// One token: gate, up and SwiGLU in one launch where Gpu::mlp_gate_up takes the matrices
    /// (then a gate logit's factor in its own), else the two products and shared_gate.
    fn mlp_hidden(
        &self,
        w: [&Matrix<'_>; 2],
        x: &CudaSlice<f32>,
        t: usize,
        [gate, up]: [&mut CudaSlice<f32>; 2],
        s: Option<&CudaSlice<f32>>,
    ) -> crate::Result<()> {
        if t == 1 && self.mlp_hidden_in_one_launch(w, x, gate, s)? {
            return Ok(());
        }
        self.matmul(w[0], x, t, gate)?;
        self.matmul(w[1], x, t, up)?;
        self.shared_gate(gate, up, s, (t, w[0].rows))
    }

    /// One token with float weights: the three products, RoPE and the KV store in one launch
    /// (matvec3_rope_*); otherwise matmul_qkv and rope_kv_write.
    fn qkv_rope_kv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        [q, k, v]: [&mut CudaSlice<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (t, q_width, kv_width) = (step.t, step.q_width, step.kv_width);
        let (start, inv_freq, layer) = (step.start, step.inv_freq, step.layer);
        self.qkv_settled.store(false, Ordering::Relaxed);
        let half = inv_freq.len();
        let m = self
            .one_token_floats(w, x, t, [&*q, &*k, &*v])?
            .filter(|m| {
                half > 0
                    && m[0].rows as usize == q_width
                    && m[1].rows as usize == kv_width
                    && m[2].rows as usize == kv_width
                    && q_width % (2 * half) == 0
                    && kv_width % (2 * half) == 0
                    && kv_width == kv.kv_dim
            });
        let Some(m) = m else {
            self.matmul_qkv(w, x, t, [&mut *q, &mut *k, &mut *v])?;
            return self.rope_kv_write([q, k, v], step, kv);
        };
        let xp = self.p(x);
        // The layer's cache rows from position 0: the kernel adds the position it reads.
        kv.rows(layer, start, 1, &self.gpu.stream)?;
        let (kd, vd) = kv.rows(layer, 0, 1, &self.gpu.stream)?;
        let posp = self.pos_ptr(start)?;
        let (yq, yk, yv, fp) = (self.p(q), self.p(k), self.p(v), self.vector(inv_freq)?);
        // q and k: 4 rotation pairs per block of 8 warps; v: 8 rows.
        let grid = blocks(q_width / 2, 4)
            .max(blocks(kv_width / 2, 4))
            .max(blocks(kv_width, 8));
        let c = LaunchConfig {
            grid_dim: (grid, 3, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.gpu.kernels.matvec3_rope[m[0].kind as usize];
        let [a, b, d] = m;
        let hi = half as i32;
        launch!(self.gpu, f, c; a, b, d, xp, yq, yk, yv, fp, hi, posp, kd, vd)?;
        self.qkv_settled.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// RoPE and the KV store in one launch (rope_kv); one token reads its position from the
    /// device (a recorded decode step replays with each token's).
    fn rope_kv_write(
        &self,
        qkv: [&mut CudaSlice<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        self.rope_kv_launch(qkv, None, step, kv)
    }

    /// The biases in rope_kv's launch (not three add_rows launches before it).
    fn bias_rope_kv_write(
        &self,
        qkv: [&mut CudaSlice<f32>; 3],
        bias: &[Vec<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        self.rope_kv_launch(qkv, Some(bias), step, kv)
    }

    /// Per-head QK-norm (norms of 2 * half values), RoPE and the KV store in one launch
    /// (qk_norm_rope_kv); a whole-row norm as separate launches.
    fn qk_norm_rope_kv(
        &self,
        qk: (&CudaSlice<f32>, &CudaSlice<f32>),
        out: [&mut CudaSlice<f32>; 3],
        norms: (&[f32], &[f32], f32),
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        self.qk_norm_launch(qk, out, norms, step, kv)
    }

    /// One decode token where the q, k and v launch is not matvec3_rope's (which has RoPE
    /// in it): attention_prep (CudaBackend::attention_prep_applies).
    fn fuses_attention(
        &self,
        w: [&Matrix<'_>; 3],
        prep: &AttnPrep<'_>,
        step: &QkvStep<'_>,
        shape: &AttentionShape<'_>,
    ) -> bool {
        self.attention_prep_applies(w, prep, step, shape)
    }

    fn fused_attention(
        &self,
        qkv: [&CudaSlice<f32>; 3],
        prep: &AttnPrep<'_>,
        step: &QkvStep<'_>,
        shape: AttentionShape<'_>,
        kv: &mut CudaKv,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        self.attention_prep(qkv, prep, step, shape, kv, out)
    }

    /// One token: the residual add inside the product (float kinds matvec_add_*, integer ones
    /// matvec_qd_*_add where x is one column tile).
    fn matmul_add(
        &self,
        w: &Matrix<'_>,
        x: &CudaSlice<f32>,
        t: usize,
        tmp: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let early = i32::from(self.qkv_settled.swap(false, Ordering::Relaxed));
        let d = *self.mat(w)?;
        let (xp, yp) = (self.p(x), self.p(out));
        let one = t == 1 && x.len() >= w.cols && out.len() >= w.rows;
        if one && d.kind >= 3 && self.gpu.matvec_add_int(&d, xp, yp)? {
            return Ok(());
        }
        if t != 1 || d.kind >= 3 || !d.vectorizable() || !xp.is_multiple_of(16) {
            self.matmul(w, x, t, tmp)?;
            return self.add_assign(out, tmp, t * w.rows);
        }
        check_len("matmul input", x.len(), w.cols)?;
        check_len("matmul output", out.len(), w.rows)?;
        let n = blocks(w.rows, 8);
        let c = cfg(n, 256);
        // The deep form only where one wave holds every block: where it needed two (Mixtral's
        // 4096 rows) it lost (benches/results/2026-12-06-h100-l2-prefetch.md).
        let (deep, regs) = &self.gpu.kernels.matvec_add_deep[d.kind as usize];
        let f = if n as usize <= self.gpu.q_limits.wave_blocks(*regs, 256) {
            deep
        } else {
            &self.gpu.kernels.matvec_add[d.kind as usize]
        };
        launch!(self.gpu, f, c; d, xp, yp, early)
    }

    /// With a bias where the product is not fused with its add: the add and the bias in one
    /// launch (add_assign_rows: the same sums as add_assign then add_rows).
    fn matmul_add_bias(
        &self,
        w: &Matrix<'_>,
        x: &CudaSlice<f32>,
        t: usize,
        (tmp, out): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        bias: Option<&[f32]>,
    ) -> crate::Result<()> {
        let Some(b) = bias else {
            return self.matmul_add(w, x, t, tmp, out);
        };
        let d = *self.mat(w)?;
        if t == 1 && d.kind < 3 && d.vectorizable() && self.p(x).is_multiple_of(16) {
            self.matmul_add(w, x, t, tmp, out)?;
            return self.add_rows(out, t, b);
        }
        // (As matmul_add: the next q, k, v launch is not the one before this.)
        self.qkv_settled.store(false, Ordering::Relaxed);
        self.matmul(w, x, t, tmp)?;
        let n = t * w.rows;
        check_len("bias", b.len(), w.rows)?;
        check_len("add input", out.len().min(tmp.len()), n)?;
        let (xp, yp, bp) = (self.p(out), self.p(tmp), self.vector(b)?);
        let (wi, ni) = (w.rows as i32, n as i32);
        let c = cfg(blocks(n, 256), 256);
        launch!(self.gpu, self.gpu.kernels.add_assign_rows, c; xp, yp, bp, wi, ni)
    }

    fn route(
        &self,
        logits: &CudaSlice<f32>,
        trr: (usize, usize, Routing),
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        self.route_dev(logits, trr, routes, host)
    }

    fn norm_route(
        &self,
        x: &CudaSlice<f32>,
        t: usize,
        block: &MoeBlock<'_>,
        out: RouteOut<'_, Self>,
    ) -> crate::Result<()> {
        self.norm_route_dev(x, t, block, out)
    }

    fn decode_step(&self, key: u64, pos: usize) -> crate::Result<DecodeStep> {
        self.pos_ptr(pos)?;
        // Kernel timing records events around each launch: those steps run direct.
        if self.gpu.clock.on() {
            return Ok(DecodeStep::Direct);
        }
        let mut graph = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        match graph.as_ref() {
            Some((k, Some(g))) if *k == key => {
                let t = Instant::now();
                g.0.launch().map_err(cuda_err)?;
                self.launch_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                self.replays.fetch_add(1, Ordering::Relaxed);
                return Ok(DecodeStep::Replayed);
            }
            Some((k, None)) if *k == key => return Ok(DecodeStep::Direct),
            _ => {}
        }
        *graph = None;
        self.baked.store(false, Ordering::Relaxed);
        self.gpu
            .stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cuda_err)?;
        Ok(DecodeStep::Recording)
    }

    fn record_end(&self, key: u64, recorded: crate::Result<()>) -> crate::Result<bool> {
        let g = self
            .gpu
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags_enum(0));
        let mut graph = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        // Until a new key: the steps of this one run direct unless recorded below.
        *graph = Some((key, None));
        let why = match (recorded, g) {
            (Err(e), _) => format!("a launch failed while recording: {e}"),
            (Ok(()), Err(e)) => format!("{e}"),
            (Ok(()), Ok(None)) => "nothing was recorded".into(),
            // A launch took this token's position as an argument: replays would repeat it.
            (Ok(()), Ok(Some(_))) if self.baked.load(Ordering::Relaxed) => {
                "an op of this model takes the position as an argument".into()
            }
            (Ok(()), Ok(Some(g))) => {
                g.launch().map_err(cuda_err)?;
                self.replays.fetch_add(1, Ordering::Relaxed);
                *graph = Some((key, Some(DecodeGraph(g))));
                return Ok(true);
            }
        };
        log::info!("decode steps run without a CUDA graph: {why}");
        Ok(false)
    }
}

impl Telemetry for CudaBackend {
    fn decode_replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }

    fn host_times(&self) -> (f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        (s(&self.launch_ns), s(&self.gpu.read_ns))
    }

    fn reset_host_times(&self) {
        self.launch_ns.store(0, Ordering::Relaxed);
        self.gpu.read_ns.store(0, Ordering::Relaxed);
    }

    fn kernel_clock(&self, on: bool) -> bool {
        self.gpu.clock.set(on);
        true
    }

    fn kernel_times(&self) -> crate::Result<Vec<KernelTime>> {
        self.gpu.clock.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill tiles: the whole matrix when it fits, else a multiple of 256 rows (Mixtral's shapes
    /// in the 64 MiB scratch), never zero rows.
    #[test]
    fn prefill_tiles_are_whole_matrices_or_256_row_multiples() {
        assert_eq!(prefill_tile_rows(20000, 14336), 14336);
        assert_eq!(prefill_tile_rows(8064, 14336), 7936);
        assert_eq!(prefill_tile_rows(2212, 4096), 2048);
        assert_eq!(prefill_tile_rows(300, 4096), 256);
        assert_eq!(prefill_tile_rows(100, 4096), 100);
        assert_eq!(prefill_tile_rows(0, 4096), 1);
        assert_eq!(prefill_tile_rows(70000, 100000), 65280);
        assert_eq!(prefill_tile_rows(65535, 65535), 65535);
    }
}
