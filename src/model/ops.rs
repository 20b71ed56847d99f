//! What the forward pass asks of a backend ([`Backend`]), and what a backend reports of its own
//! work ([`Telemetry`]).
//!
//! The forward pass (model/forward.rs) is written once against [`Backend`]: activations live in
//! the backend's buffers (host vectors for the CPU, device memory for CUDA), and every op works on
//! the first rows of its buffers. Weights are passed as host [`Matrix`] views of the mmap; a
//! device backend keeps resident copies of them (uploaded once) and finds them by that view.

use super::experts::MoeBlock;
use super::routing::Routing;
use crate::quant::Matrix;

/// One routed expert of one token: which expert and its (renormalized) gate weight.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// Rows `tokens` of `table` as f32 into `out` ([tokens.len(), table.cols]); a prompt's rows are
/// converted on rayon's global pool (a 512-token prompt of a 4096-wide f16 table is a
/// millisecond on one core).
pub fn embed_rows(table: &Matrix<'_>, tokens: &[u32], out: &mut [f32]) {
    use rayon::prelude::*;
    let h = table.cols;
    if h == 0 {
        return;
    }
    let out = &mut out[..tokens.len() * h];
    if tokens.len() <= PAR_EMBED_ROWS {
        // (One task: on the caller's thread; rayon would hand it to its pool and wait for it,
        // a wake-up that costs a decode token more than its row's conversion.)
        for (row, &id) in out.chunks_mut(h).zip(tokens) {
            table.row_to_f32(id as usize, row);
        }
        return;
    }
    let rows = out.par_chunks_mut(h).zip(tokens);
    rows.with_min_len(PAR_EMBED_ROWS)
        .for_each(|(row, &id)| table.row_to_f32(id as usize, row));
}

/// Backend::embed's default: the rows converted into `host`, then uploaded.
pub fn embed_via_host<B: Backend + ?Sized>(
    backend: &B,
    table: &Matrix<'_>,
    tokens: &[u32],
    dst: &mut B::Buf,
    host: &mut Vec<f32>,
) -> crate::Result<()> {
    host.resize(tokens.len() * table.cols, 0.0);
    embed_rows(table, tokens, host);
    backend.upload(host, dst)
}

/// Rows of a prompt's embedding one rayon task converts.
const PAR_EMBED_ROWS: usize = 32;

/// Shape of one attention call: `t` new tokens at positions `start_pos..start_pos + t`, attending
/// causally to every cached position up to their own.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub start_pos: usize,
    pub t: usize,
    /// Sliding-window attention: a query at position p sees positions p + 1 - w ..= p.
    pub window: Option<usize>,
    /// Each head's sink logit ([n_heads], gpt-oss): a score beside the positions' in the softmax,
    /// with no value.
    pub sinks: Option<&'a [f32]>,
}

/// One attention block's q/k/v step: `t` tokens at positions start.., q rows of `q_width` and k/v
/// rows of `kv_width`, RoPE with `inv_freq`, keys and values into `layer`'s cache.
#[derive(Clone, Copy, Debug)]
pub struct QkvStep<'a> {
    pub t: usize,
    pub q_width: usize,
    pub kv_width: usize,
    pub start: usize,
    pub layer: usize,
    pub inv_freq: &'a [f32],
}

/// What a decode token's raw q, k and v get before attention, for `Backend::fused_attention`:
/// biases (q's, k's, v's), per-head QK-norm (q's and k's weights, a head wide, and eps), and q's
/// scale after RoPE.
#[derive(Clone, Copy, Debug)]
pub struct AttnPrep<'a> {
    pub bias: Option<&'a [Vec<f32>; 3]>,
    pub norms: Option<(&'a [f32], &'a [f32], f32)>,
    pub q_scale: f32,
}

/// Where `Backend::norm_route` writes: the normalized input xn, the router logits ([t,
/// n_experts]), the routes on the host ([t, k]) and room the default uses for the logits; and
/// what a decode token's expert executor wants read back with its routes.
pub struct RouteOut<'a, B: Backend + ?Sized> {
    pub xn: &'a mut B::Buf,
    pub logits: &'a mut B::Buf,
    pub routes: &'a mut [Route],
    pub host: &'a mut Vec<f32>,
    pub reads: RouteReads<'a, B>,
}

/// Results of one decode token's xn read back with its routes, in the same wait (the engine's
/// stacked-gate prediction and its CPU experts' input; each read alone is a round trip).
pub struct RouteReads<'a, B: Backend + ?Sized> {
    /// A product of xn: the matrix, its device output ([rows]) and the host copy ([rows]).
    pub product: Option<(Matrix<'a>, &'a mut B::Buf, &'a mut [f32])>,
    /// The host copy of xn ([hidden]).
    pub xn: Option<&'a mut [f32]>,
}

impl<B: Backend + ?Sized> RouteReads<'_, B> {
    pub const NONE: Self = RouteReads {
        product: None,
        xn: None,
    };

    /// Whether anything is asked.
    pub fn any(&self) -> bool {
        self.product.is_some() || self.xn.is_some()
    }

    /// The reads one after another, each its own wait (a backend that cannot queue them with the
    /// routes' read).
    pub fn read_each(self, backend: &B, xn: &B::Buf) -> crate::Result<()> {
        if let Some((m, dev, host)) = self.product {
            backend.matmul(&m, xn, 1, dev)?;
            backend.download(dev, host)?;
        }
        if let Some(host) = self.xn {
            backend.download(xn, host)?;
        }
        Ok(())
    }
}

/// MLA's shapes (`config::Mla`).
pub type MlaShape = super::config::Mla;

/// One layer's MLA weights for `Backend::mla_inputs`.
pub struct MlaInputs<'a> {
    pub shape: MlaShape,
    pub heads: usize,
    /// The latent's RMSNorm weight ([kv_lora]) and eps.
    pub kv_norm: &'a [f32],
    pub eps: f32,
    /// Each head's q_nope -> latent map, [heads * kv_lora, nope].
    pub k_b: &'a Matrix<'a>,
    /// The factor q_out is scaled by (the attention's q scale), after the products and RoPE.
    pub q_scale: f32,
}

/// How a decode step's launches are made (`Backend::decode_step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeStep {
    /// One by one, as the forward pass calls the ops.
    Direct,
    /// One by one and recorded for replay, until `record_end`.
    Recording,
    /// Replayed from a recording: the step's ops are launched already.
    Replayed,
}

/// The dense compute a backend provides. Results must not depend on the thread count.
/// Buffers hold f32 values; an op reads and writes the first `rows * width` of them.
pub trait Backend {
    /// An activation buffer.
    type Buf;
    /// The KV cache of a sequence: (layer, position, kv_dim) for keys and for values.
    type Kv;
    /// Host memory results are read back into (`download_host`): memory the backend's copies
    /// may land in directly (the CPU's: a Vec).
    type Host: std::ops::Deref<Target = [f32]> + std::ops::DerefMut;

    /// A zeroed buffer of `n` values.
    fn alloc(&self, n: usize) -> crate::Result<Self::Buf>;
    /// A KV cache of `layers` x `ctx` positions x `kv_dim`. `values_are_keys`: attention reads
    /// each cached row as both key and value (MLA's latent rows), so one copy is stored and
    /// `kv_write` keeps its keys only.
    fn alloc_kv(
        &self,
        layers: usize,
        ctx: usize,
        kv_dim: usize,
        values_are_keys: bool,
    ) -> crate::Result<Self::Kv>;
    /// dst[..src.len()] = src.
    fn upload(&self, src: &[f32], dst: &mut Self::Buf) -> crate::Result<()>;
    /// dst = rows `tokens` of `table` as f32 ([tokens.len(), table.cols]); `host` is scratch
    /// the default (convert on the host, then upload) keeps between calls.
    fn embed(
        &self,
        table: &Matrix<'_>,
        tokens: &[u32],
        dst: &mut Self::Buf,
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        embed_via_host(self, table, tokens, dst, host)
    }
    /// A decode token's id and position handed over ahead of its step's launches (which may be
    /// replayed from a recording): true when `embed_staged` then embeds it where the launches
    /// run.
    fn stage_token(&self, _table: &Matrix<'_>, _token: u32, _pos: usize) -> crate::Result<bool> {
        Ok(false)
    }
    /// dst = the row of `table` of the token `stage_token` took (only once it returned true).
    fn embed_staged(&self, _table: &Matrix<'_>, _dst: &mut Self::Buf) -> crate::Result<()> {
        Err(crate::Error::Invalid(
            "embed_staged: this backend stages no token".into(),
        ))
    }
    /// Host memory for `n` values, for download_host.
    fn alloc_host(&self, n: usize) -> crate::Result<Self::Host>;
    /// dst[..n] = src[..n] (waits for the backend's pending work).
    fn download_host(&self, src: &Self::Buf, dst: &mut Self::Host, n: usize) -> crate::Result<()>;
    /// dst = src[..dst.len()] (waits for the backend's pending work).
    fn download(&self, src: &Self::Buf, dst: &mut [f32]) -> crate::Result<()>;

    /// out[t, w.rows] = x[t, w.cols] · wᵀ.
    fn matmul(
        &self,
        w: &Matrix<'_>,
        x: &Self::Buf,
        t: usize,
        out: &mut Self::Buf,
    ) -> crate::Result<()>;

    /// RMSNorm of x's rows `rows` (each w.len() wide) into out's rows 0..rows.len():
    /// w * x / sqrt(mean(x²) + eps).
    fn rms_norm(
        &self,
        x: &Self::Buf,
        rows: std::ops::Range<usize>,
        w: &[f32],
        eps: f32,
        out: &mut Self::Buf,
    ) -> crate::Result<()>;

    /// Rotate-half RoPE in place on `t` rows of `width` values (heads of `inv_freq.len() * 2`),
    /// row i at position start_pos + i; angles pos * inv_freq[j] in f32.
    fn rope(
        &self,
        x: &mut Self::Buf,
        t: usize,
        width: usize,
        start_pos: usize,
        inv_freq: &[f32],
    ) -> crate::Result<()>;

    /// x[..n] += y[..n].
    fn add_assign(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> crate::Result<()>;

    /// LayerNorm of x's rows `rows` (each w.len() wide) into out's rows 0..rows.len():
    /// (x - mean) / sqrt(var + eps) * w + b (Phi-3.5-MoE). The default works through host
    /// copies.
    fn layer_norm(
        &self,
        x: &Self::Buf,
        rows: std::ops::Range<usize>,
        (w, b): (&[f32], &[f32]),
        eps: f32,
        out: &mut Self::Buf,
    ) -> crate::Result<()> {
        let n = w.len();
        let mut host = vec![0.0; rows.end * n];
        self.download(x, &mut host)?;
        let mut normed = host.split_off(rows.start * n);
        for row in normed.chunks_exact_mut(n.max(1)) {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, g), c) in row.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * inv * g + c;
            }
        }
        self.upload(&normed, out)
    }

    /// x[..n] *= factor. The default works through host copies.
    fn scale(&self, x: &mut Self::Buf, n: usize, factor: f32) -> crate::Result<()> {
        let mut host = vec![0.0; n];
        self.download(x, &mut host)?;
        host.iter_mut().for_each(|v| *v *= factor);
        self.upload(&host, x)
    }

    /// Each of x's `t` rows += `bias` (attention biases). The default works through host
    /// copies; a backend may do it in place.
    fn add_rows(&self, x: &mut Self::Buf, t: usize, bias: &[f32]) -> crate::Result<()> {
        let mut host = vec![0.0; t * bias.len()];
        self.download(x, &mut host)?;
        for row in host.chunks_exact_mut(bias.len().max(1)) {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
        self.upload(&host, x)
    }

    /// An MLP's hidden activations of `t` rows of `width`: gate[r] = sigmoid(s[r]) *
    /// silu(gate[r]) * up[r], where s ([t]) is a shared expert's gate logit (Qwen2-MoE), or
    /// silu(gate[r]) * up[r] without one. The default works through host copies.
    fn shared_gate(
        &self,
        gate: &mut Self::Buf,
        up: &Self::Buf,
        s: Option<&Self::Buf>,
        (t, width): (usize, usize),
    ) -> crate::Result<()> {
        let (mut g, mut u) = (vec![0.0; t * width], vec![0.0; t * width]);
        // Without a gate logit, sigmoid(inf) = 1 exactly.
        let mut sh = vec![f32::INFINITY; t];
        self.download(gate, &mut g)?;
        self.download(up, &mut u)?;
        if let Some(s) = s {
            self.download(s, &mut sh)?;
        }
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        for ((gr, ur), &sr) in g
            .chunks_exact_mut(width)
            .zip(u.chunks_exact(width))
            .zip(&sh)
        {
            let scale = sigmoid(sr);
            for (gv, &uv) in gr.iter_mut().zip(ur) {
                *gv = scale * (*gv * sigmoid(*gv)) * uv;
            }
        }
        self.upload(&g, gate)
    }

    /// Multi-head latent attention's inputs (DeepSeek-V2, absorbed form) for `step`'s t tokens:
    /// from q ([t, heads * (nope + rope)]) and ckv ([t, kv_lora + rope]), the cache row
    /// [RMSNorm(ckv latent) * norm, RoPE(ckv rope)], read as key and value, into `row` (room for
    /// [t, kv_lora + rope]) and the cache; q_out [t, heads * (kv_lora + rope)] each head's
    /// [k_b_h · q_nope_h, RoPE(q_rope_h)] · q_scale, k_b [heads * kv_lora, nope]. The default
    /// works through host copies.
    fn mla_inputs(
        &self,
        (q, ckv): (&Self::Buf, &Self::Buf),
        w: &MlaInputs<'_>,
        step: &QkvStep<'_>,
        (row, q_out): (&mut Self::Buf, &mut Self::Buf),
        kv: &mut Self::Kv,
    ) -> crate::Result<()> {
        let m = w.shape;
        let (t, heads) = (step.t, w.heads);
        let (qw, lw) = (m.nope + m.rope, m.kv_lora + m.rope);
        let (mut qh, mut ch) = (vec![0.0; t * heads * qw], vec![0.0; t * lw]);
        self.download(q, &mut qh)?;
        self.download(ckv, &mut ch)?;
        let freqs = &step.inv_freq[..m.rope / 2];
        let mut out = vec![0.0; t * heads * lw];
        for (i, (c, o)) in ch
            .chunks_exact_mut(lw)
            .zip(out.chunks_exact_mut(heads * lw))
            .enumerate()
        {
            let pos = step.start + i;
            let latent = c[..m.kv_lora].to_vec();
            crate::model::forward::rms_norm(&latent, w.kv_norm, w.eps, &mut c[..m.kv_lora]);
            crate::model::forward::rope_row(&mut c[m.kv_lora..], pos, freqs);
            let qt = &mut qh[i * heads * qw..(i + 1) * heads * qw];
            for (h, (qh, oh)) in qt
                .chunks_exact_mut(qw)
                .zip(o.chunks_exact_mut(lw))
                .enumerate()
            {
                let rows = h * m.kv_lora..(h + 1) * m.kv_lora;
                w.k_b.matvec_rows(&qh[..m.nope], rows, &mut oh[..m.kv_lora]);
                crate::model::forward::rope_row(&mut qh[m.nope..], pos, freqs);
                oh[m.kv_lora..].copy_from_slice(&qh[m.nope..]);
            }
        }
        if w.q_scale != 1.0 {
            out.iter_mut().for_each(|v| *v *= w.q_scale);
        }
        self.upload(&ch, row)?;
        self.upload(&out, q_out)?;
        self.kv_write(kv, (step.layer, step.start), t, row, row)
    }

    /// MLA's values out of the latent: out[t, heads * v] = each head's v_b_h · att_h[..kv_lora],
    /// att [t, heads * (kv_lora + rope)], v_b [heads * v, kv_lora]. The default works through
    /// host copies.
    fn mla_values(
        &self,
        att: &Self::Buf,
        (v_b, shape): (&Matrix<'_>, &MlaShape),
        (t, heads): (usize, usize),
        out: &mut Self::Buf,
    ) -> crate::Result<()> {
        let lw = shape.kv_lora + shape.rope;
        let mut a = vec![0.0; t * heads * lw];
        self.download(att, &mut a)?;
        let mut o = vec![0.0; t * heads * shape.v];
        for (i, (a, o)) in a
            .chunks_exact(lw)
            .zip(o.chunks_exact_mut(shape.v))
            .enumerate()
        {
            let h = i % heads;
            v_b.matvec_rows(&a[..shape.kv_lora], h * shape.v..(h + 1) * shape.v, o);
        }
        self.upload(&o, out)
    }

    /// Write the new tokens' keys and values (`t` rows each) at positions start..start + t of
    /// `layer` (`at` = (layer, start)).
    fn kv_write(
        &self,
        kv: &mut Self::Kv,
        at: (usize, usize),
        t: usize,
        k: &Self::Buf,
        v: &Self::Buf,
    ) -> crate::Result<()>;

    /// Causal grouped-query attention of q ([t, n_heads * head_dim]) over `layer`'s cache
    /// positions 0..start_pos + t (the new tokens already written); out: [t, n_heads * head_dim].
    fn attention(
        &self,
        shape: AttentionShape<'_>,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        out: &mut Self::Buf,
    ) -> crate::Result<()>;

    /// Whether `fused_attention` takes this step with q, k and v from `w` (never by default).
    fn fuses_attention(
        &self,
        _w: [&Matrix<'_>; 3],
        _prep: &AttnPrep<'_>,
        _step: &QkvStep<'_>,
        _shape: &AttentionShape<'_>,
    ) -> bool {
        false
    }

    /// One decode token's attention from its raw q, k and v (as `matmul_qkv` wrote them) in one
    /// step, where `fuses_attention` says so: `prep`, RoPE, k and v into the cache, then
    /// `attention` into out, with the results of those ops one by one.
    fn fused_attention(
        &self,
        _qkv: [&Self::Buf; 3],
        _prep: &AttnPrep<'_>,
        _step: &QkvStep<'_>,
        _shape: AttentionShape<'_>,
        _kv: &mut Self::Kv,
        _out: &mut Self::Buf,
    ) -> crate::Result<()> {
        Err(crate::Error::Invalid(
            "fused_attention on a backend that does not fuse it".into(),
        ))
    }

    /// q, k and v of the same input: `matmul` three times (a backend may fuse them).
    fn matmul_qkv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &Self::Buf,
        t: usize,
        out: [&mut Self::Buf; 3],
    ) -> crate::Result<()> {
        for (w, out) in w.into_iter().zip(out) {
            self.matmul(w, x, t, out)?;
        }
        Ok(())
    }

    /// Two products of the same input (MLA's kv_a and q): `matmul`
    /// twice (a backend may fuse them).
    fn matmul_pair(
        &self,
        w: [&Matrix<'_>; 2],
        x: &Self::Buf,
        t: usize,
        out: [&mut Self::Buf; 2],
    ) -> crate::Result<()> {
        for (w, out) in w.into_iter().zip(out) {
            self.matmul(w, x, t, out)?;
        }
        Ok(())
    }

    /// An MLP's hidden activations from x (`shared_gate`'s): gate ([t, w[0].rows]) =
    /// silu(w[0] x) * (w[1] x), times sigmoid(s[r]) where a gate logit s ([t]) is given; up is
    /// scratch of that size. `matmul` twice and `shared_gate` (a backend may fuse them).
    fn mlp_hidden(
        &self,
        w: [&Matrix<'_>; 2],
        x: &Self::Buf,
        t: usize,
        [gate, up]: [&mut Self::Buf; 2],
        s: Option<&Self::Buf>,
    ) -> crate::Result<()> {
        self.matmul(w[0], x, t, gate)?;
        self.matmul(w[1], x, t, up)?;
        self.shared_gate(gate, up, s, (t, w[0].rows))
    }

    /// RoPE on q and k at the step's positions, then k and v into its layer's cache: `rope`
    /// twice and `kv_write` (a backend may fuse them).
    fn rope_kv_write(
        &self,
        [q, k, v]: [&mut Self::Buf; 3],
        step: &QkvStep<'_>,
        kv: &mut Self::Kv,
    ) -> crate::Result<()> {
        let (t, start) = (step.t, step.start);
        self.rope(q, t, step.q_width, start, step.inv_freq)?;
        self.rope(k, t, step.kv_width, start, step.inv_freq)?;
        self.kv_write(kv, (step.layer, start), t, k, v)
    }

    /// `bias` ([q's, k's, v's]) added to q, k and v's rows, then `rope_kv_write` (a backend may
    /// fuse them).
    fn bias_rope_kv_write(
        &self,
        [q, k, v]: [&mut Self::Buf; 3],
        bias: &[Vec<f32>; 3],
        step: &QkvStep<'_>,
        kv: &mut Self::Kv,
    ) -> crate::Result<()> {
        let t = step.t;
        self.add_rows(q, t, &bias[0])?;
        self.add_rows(k, t, &bias[1])?;
        self.add_rows(v, t, &bias[2])?;
        self.rope_kv_write([q, k, v], step, kv)
    }

    /// QK-norm then RoPE and the cache: RMSNorm of q and k (`qk`) by `norms` (weights of q's
    /// and k's norm, each a head or a whole row wide, and eps) into qo and ko, then
    /// `rope_kv_write` of qo, ko and v (a backend may fuse them: `qk_norm_then_rope_kv`).
    fn qk_norm_rope_kv(
        &self,
        qk: (&Self::Buf, &Self::Buf),
        out: [&mut Self::Buf; 3],
        norms: (&[f32], &[f32], f32),
        step: &QkvStep<'_>,
        kv: &mut Self::Kv,
    ) -> crate::Result<()> {
        qk_norm_then_rope_kv(self, qk, out, norms, step, kv)
    }

    /// The attention block's inputs: `matmul_qkv` into q, k and v, then `rope_kv_write` (a
    /// backend may fuse them).
    fn qkv_rope_kv(
        &self,
        w: [&Matrix<'_>; 3],
        x: &Self::Buf,
        [q, k, v]: [&mut Self::Buf; 3],
        step: &QkvStep<'_>,
        kv: &mut Self::Kv,
    ) -> crate::Result<()> {
        self.matmul_qkv(w, x, step.t, [&mut *q, &mut *k, &mut *v])?;
        self.rope_kv_write([q, k, v], step, kv)
    }

    /// out[t, w.rows] += x · wᵀ (the residual add of a projection), `tmp` room for the
    /// product: `matmul` then `add_assign` (a backend may fuse them, with the same sums).
    fn matmul_add(
        &self,
        w: &Matrix<'_>,
        x: &Self::Buf,
        t: usize,
        tmp: &mut Self::Buf,
        out: &mut Self::Buf,
    ) -> crate::Result<()> {
        self.matmul(w, x, t, tmp)?;
        self.add_assign(out, tmp, t * w.rows)
    }

    /// `matmul_add`, then `bias` (if any) on out's t rows: a projection with its residual add
    /// and its bias (a backend may fuse them).
    fn matmul_add_bias(
        &self,
        w: &Matrix<'_>,
        x: &Self::Buf,
        t: usize,
        (tmp, out): (&mut Self::Buf, &mut Self::Buf),
        bias: Option<&[f32]>,
    ) -> crate::Result<()> {
        self.matmul_add(w, x, t, tmp, out)?;
        match bias {
            Some(b) => self.add_rows(out, t, b),
            None => Ok(()),
        }
    }

    /// Routing of t tokens by `routing` from their router logits ([t, n_experts] in `logits`):
    /// `routes` ([t, k]) on the host.
    /// `host` is room the default uses for the logits.
    fn route(
        &self,
        logits: &Self::Buf,
        (t, n_experts, routing): (usize, usize, Routing),
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        host.resize(t * n_experts, 0.0);
        self.download(logits, host)?;
        let k = routes.len() / t.max(1);
        for (l, r) in host.chunks_exact(n_experts).zip(routes.chunks_exact_mut(k)) {
            routing.route(l, r);
        }
        Ok(())
    }

    /// The MoE block's input and routing of t tokens: xn = RMSNorm(x[..t]) with the block's
    /// norm, the router's logits, and `route` from them. A backend may fuse them (with the same
    /// results).
    fn norm_route(
        &self,
        x: &Self::Buf,
        t: usize,
        block: &MoeBlock<'_>,
        out: RouteOut<'_, Self>,
    ) -> crate::Result<()> {
        match block.norm_bias {
            Some(b) => self.layer_norm(x, 0..t, (block.norm, b), block.eps, out.xn)?,
            None => self.rms_norm(x, 0..t, block.norm, block.eps, out.xn)?,
        }
        self.matmul(block.router, out.xn, t, out.logits)?;
        if let Some(b) = block.router_bias {
            self.add_rows(out.logits, t, b)?;
        }
        let shape = (t, block.router.rows, block.routing);
        self.route(out.logits, shape, out.routes, out.host)?;
        out.reads.read_each(self, out.xn)
    }

    /// A decode token at position `pos` whose every op, through the output head, stays on the
    /// backend (no host round trip): the backend may replay what it recorded under `key`
    /// (Replayed), or record the launches that follow until `record_end` (Recording). `key`
    /// names the buffers and cache the launches use; another key drops the recording.
    fn decode_step(&self, _key: u64, _pos: usize) -> crate::Result<DecodeStep> {
        Ok(DecodeStep::Direct)
    }
    /// The recorded step's launches are made (`recorded`: how that went): stop recording and run
    /// the recording, kept under `key` for replay (true); false when nothing ran (a launch failed
    /// while recording, or the step cannot be replayed): the caller then makes the launches
    /// directly, and the backend runs `key`'s steps directly from then on.
    fn record_end(&self, _key: u64, _recorded: crate::Result<()>) -> crate::Result<bool> {
        Ok(false)
    }
}

/// `Backend::qk_norm_rope_kv` as separate ops: `rms_norm` of q and k (rows of the norm's width:
/// a head each, or a token each), then `rope_kv_write`.
pub fn qk_norm_then_rope_kv<B: Backend + ?Sized>(
    b: &B,
    (q, k): (&B::Buf, &B::Buf),
    [qo, ko, v]: [&mut B::Buf; 3],
    (qn, kn, eps): (&[f32], &[f32], f32),
    step: &QkvStep<'_>,
    kv: &mut B::Kv,
) -> crate::Result<()> {
    let t = step.t;
    let (q_rows, k_rows) = (
        t * step.q_width / qn.len().max(1),
        t * step.kv_width / kn.len().max(1),
    );
    b.rms_norm(q, 0..q_rows, qn, eps, qo)?;
    b.rms_norm(k, 0..k_rows, kn, eps, ko)?;
    b.rope_kv_write([qo, ko, v], step, kv)
}

/// GPU time of one kernel over the launches recorded (`hob bench --kernel-times`).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub name: String,
    pub launches: u64,
    pub seconds: f64,
}

/// What a backend reports about its own work for `--stats` and `hob bench --kernel-times` (not
/// needed by the forward pass; zeros where the backend does none of it).
pub trait Telemetry {
    /// Decode steps run from a recording so far (the recording runs included).
    fn decode_replays(&self) -> u64 {
        0
    }
    /// Host seconds since the last reset spent (submitting recorded decode steps, reading results
    /// back: waiting for the device included).
    fn host_times(&self) -> (f64, f64) {
        (0.0, 0.0)
    }
    fn reset_host_times(&self) {}
    /// Time every kernel launch from now on (true) or stop (false); false where the backend
    /// cannot (the CPU).
    fn kernel_clock(&self, _on: bool) -> bool {
        false
    }
    /// GPU time per kernel since the last call (waits for the recorded launches).
    fn kernel_times(&self) -> crate::Result<Vec<KernelTime>> {
        Ok(Vec::new())
    }
}
