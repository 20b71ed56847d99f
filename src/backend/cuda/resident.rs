//! The dense weights resident on the device, found by the host address of their mmap bytes.

use super::*;

impl CudaBackend {
    /// Upload every dense weight of `model` (matrices in their stored dtype, norms and RoPE
    /// frequencies in f32).
    pub fn new(gpu: Arc<Gpu>, model: &Model<'_>) -> crate::Result<CudaBackend> {
        let w = model.weights();
        // MLA's per-head maps: in their stored kind or as f32 (mla.rs upload_mla).
        let maps = w.mla_maps();
        let is_map = |m: &Matrix<'_>| maps.iter().any(|a| std::ptr::eq(a.codes, m.codes));
        let mats: Vec<_> = w.matrices().into_iter().filter(|m| !is_map(m)).collect();
        let mut vectors = w.vectors();
        vectors.extend(model.rope_tables());
        let needed: usize = mats
            .iter()
            .map(|m| m.codes.len() + m.scales.len() + m.mins.len())
            .sum::<usize>()
            + vectors.iter().map(|v| v.len() * 4).sum::<usize>()
            + maps.iter().map(|m| super::mla::mla_bytes(m)).sum::<usize>()
            + maps
                .iter()
                .map(|m| super::mla::mla_room(m))
                .max()
                .unwrap_or(0)
            + SCRATCH_FLOATS * 4;
        let (free, total) = gpu.mem_info()?;
        if needed > free {
            return Err(Error::Invalid(format!(
                "CUDA: the model's non-expert weights need {} on {} but only {} of {} is free",
                size(needed),
                gpu.name,
                size(free),
                size(total)
            )));
        }
        let mut b = CudaBackend::empty(gpu)?;
        for m in mats {
            b.upload_matrix(m)?;
        }
        for m in maps {
            b.upload_mla(m)?;
        }
        for v in vectors {
            let key = v.as_ptr() as usize;
            if !b.vectors.contains_key(&key) {
                let d = b.gpu.stream.clone_htod(v).map_err(cuda_err)?;
                b.resident_bytes += v.len() * 4;
                b.vectors.insert(key, d);
            }
        }
        b.gpu.sync()?;
        Ok(b)
    }

    /// A backend with nothing resident yet (weights come with `make_resident`).
    pub fn empty(gpu: Arc<Gpu>) -> crate::Result<CudaBackend> {
        Ok(CudaBackend {
            scratch: gpu.alloc::<f32>(SCRATCH_FLOATS, "the prefill tile")?,
            scratch_len: SCRATCH_FLOATS,
            step: gpu.alloc::<i32>(2, "the decode position and token")?,
            pos_now: Mutex::new(None),
            qkv_settled: AtomicBool::new(false),
            graph: Mutex::new(None),
            baked: AtomicBool::new(false),
            replays: AtomicU64::new(0),
            launch_ns: AtomicU64::new(0),
            gpu,
            mats: HashMap::new(),
            vectors: HashMap::new(),
            mla: HashMap::new(),
            mla_rows: None,
            resident_bytes: 0,
        })
    }

    /// Where a write of t rows at `start` goes: (key rows, value rows, position pointer). One
    /// token: the layer's rows from position 0 and the position read from the device, so a
    /// recorded decode step replays at each token's own position; several: their rows and the
    /// position as an argument (a recorded step cannot replay that: marked baked).
    pub(super) fn kv_target(
        &self,
        kv: &CudaKv,
        layer: usize,
        start: usize,
        t: usize,
    ) -> crate::Result<(u64, u64, u64)> {
        let (kd, vd) = kv.rows(layer, start, t, &self.gpu.stream)?;
        if t == 1 {
            let (k0, v0) = kv.rows(layer, 0, 1, &self.gpu.stream)?;
            return Ok((k0, v0, self.pos_ptr(start)?));
        }
        self.baked.store(true, Ordering::Relaxed);
        Ok((kd, vd, 0))
    }

    /// The device address holding decode position `pos`, written there first if it holds
    /// another (never while a step is recorded: decode_step writes it before).
    pub(super) fn pos_ptr(&self, pos: usize) -> crate::Result<u64> {
        let p = ptr(&self.step, &self.gpu.stream);
        let mut now = self.pos_now.lock().unwrap_or_else(|e| e.into_inner());
        if *now != Some(pos) {
            let v = step_pos(pos)?;
            // SAFETY: p holds an i32, set by a memset queued on the stream (no host buffer: no
            // staging copy), ordered before the launches that read it.
            unsafe {
                cudarc::driver::sys::cuMemsetD32Async(p, v, 1, self.gpu.stream.cu_stream())
                    .result()
                    .map_err(cuda_err)?;
            }
            *now = Some(pos);
        }
        Ok(p)
    }

    /// Copy a host matrix to the device; later calls with the same view find it.
    pub fn make_resident(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        self.upload_matrix(m)
    }

    /// Copy a host f32 vector (a norm, RoPE frequencies) to the device.
    pub fn make_resident_vector(&mut self, v: &[f32]) -> crate::Result<()> {
        let key = v.as_ptr() as usize;
        if !self.vectors.contains_key(&key) {
            let d = self.gpu.stream.clone_htod(v).map_err(cuda_err)?;
            self.resident_bytes += v.len() * 4;
            self.vectors.insert(key, d);
        }
        Ok(())
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Bytes of dense weights on the device.
    pub fn resident_bytes(&self) -> usize {
        self.resident_bytes
    }

    pub(super) fn upload_matrix(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        let key = m.codes.as_ptr() as usize;
        if self.mats.contains_key(&key) {
            return Ok(());
        }
        // codes | scales | mins, each starting on a 256-byte boundary.
        let a = |n: usize| n.div_ceil(256) * 256;
        let (sc, mn) = (a(m.codes.len()), a(m.codes.len()) + a(m.scales.len()));
        let total = mn + m.mins.len();
        let mut host = vec![0u8; total];
        host[..m.codes.len()].copy_from_slice(m.codes);
        host[sc..sc + m.scales.len()].copy_from_slice(m.scales);
        host[mn..mn + m.mins.len()].copy_from_slice(m.mins);
        let dev = self.gpu.stream.clone_htod(&host).map_err(cuda_err)?;
        let base = ptr(&dev, &self.gpu.stream);
        let dm = DevMat::new(m, base, base + sc as u64, base + mn as u64);
        self.resident_bytes += total;
        self.mats.insert(key, (dm, dev));
        Ok(())
    }

    pub(super) fn mat(&self, w: &Matrix<'_>) -> crate::Result<&DevMat> {
        self.mats
            .get(&(w.codes.as_ptr() as usize))
            .map(|(d, _)| d)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA backend: a [{}, {}] matrix was never uploaded",
                    w.rows, w.cols
                ))
            })
    }

    pub(super) fn vector(&self, v: &[f32]) -> crate::Result<u64> {
        self.vectors
            .get(&(v.as_ptr() as usize))
            .map(|d| ptr(d, &self.gpu.stream))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA backend: a vector of {} was never uploaded",
                    v.len()
                ))
            })
    }

    /// The three matrices of one token's fused products (matvec3_*): resident float kinds, all
    /// one kind, 16-byte rows and x, the buffers long enough; None where the fused kernels do
    /// not apply.
    pub(super) fn one_token_floats(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        t: usize,
        out: [&CudaSlice<f32>; 3],
    ) -> crate::Result<Option<[DevMat; 3]>> {
        let m = [*self.mat(w[0])?, *self.mat(w[1])?, *self.mat(w[2])?];
        let fused = t == 1
            && self.p(x).is_multiple_of(16)
            && m.iter()
                .all(|d| d.kind < 3 && d.kind == m[0].kind && d.vectorizable());
        if !fused {
            return Ok(None);
        }
        for (w, o) in w.iter().zip(out) {
            check_len("matmul input", x.len(), w.cols)?;
            check_len("matmul output", o.len(), w.rows)?;
        }
        Ok(Some(m))
    }

    pub(super) fn p(&self, s: &CudaSlice<f32>) -> u64 {
        ptr(s, &self.gpu.stream)
    }

    /// Routes of t tokens as Gpu::route writes them at `dev` ([t, k] indices, then weights),
    /// read back into `routes` ([t, k]); `host` is room for them.
    pub(super) fn routes_back(
        &self,
        dev: u64,
        t: usize,
        n_experts: usize,
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let k = routes.len() / t.max(1);
        host.resize(2 * t * k, 0.0);
        self.gpu.download_f32(dev, &mut host[..2 * t * k])?;
        read_routes(host, n_experts, routes);
        Ok(())
    }

    /// `routes_back` of one token, with `reads` of its xn: their product launched, and every
    /// copy queued, before one wait.
    pub(super) fn routes_back_with(
        &self,
        dev: u64,
        n_experts: usize,
        (routes, host): (&mut [Route], &mut Vec<f32>),
        (reads, xn): (RouteReads<'_, Self>, &CudaSlice<f32>),
    ) -> crate::Result<()> {
        if !reads.any() {
            return self.routes_back(dev, 1, n_experts, routes, host);
        }
        let k = routes.len();
        host.resize(2 * k, 0.0);
        let mut parts: Vec<(u64, &mut [f32])> = vec![(dev, &mut host[..2 * k])];
        if let Some((m, out, h)) = reads.product {
            self.matmul(&m, xn, 1, out)?;
            check_len("route_reads product", out.len(), h.len())?;
            parts.push((self.p(out), h));
        }
        if let Some(h) = reads.xn {
            check_len("route_reads xn", xn.len(), h.len())?;
            parts.push((self.p(xn), h));
        }
        self.gpu.download_parts(&mut parts)?;
        read_routes(host, n_experts, routes);
        Ok(())
    }

    /// The prefill scratch: its device address and length in floats.
    pub fn scratch(&self) -> (u64, usize) {
        (self.p(&self.scratch), self.scratch_len)
    }

    /// Multiply by a device matrix (e.g. an expert in the cache).
    pub fn matmul_dev(&self, w: &DevMat, x: u64, t: usize, out: u64) -> crate::Result<()> {
        let scratch = self.p(&self.scratch);
        self.gpu.matmul(w, x, t, out, scratch, self.scratch_len)
    }

    /// RoPE on q and k, k and v into the cache, in one launch (elementwise.cu rope_kv); with
    /// `bias` ([q's, k's, v's]) q, k and v first get their biases in the same launch.
    pub(super) fn rope_kv_launch(
        &self,
        [q, k, v]: [&mut CudaSlice<f32>; 3],
        bias: Option<&[Vec<f32>; 3]>,
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (t, q_width, kv_width) = (step.t, step.q_width, step.kv_width);
        let (start, inv_freq, layer) = (step.start, step.inv_freq, step.layer);
        check_len("rope input", q.len(), t * q_width)?;
        check_len("kv_write input", k.len().min(v.len()), t * kv_width)?;
        if kv_width != kv.kv_dim {
            return Err(Error::Invalid(format!(
                "CUDA backend: keys of {kv_width} values for a cache of {}",
                kv.kv_dim
            )));
        }
        let (kd, vd, posp) = self.kv_target(kv, layer, start, t)?;
        let (qp, kp, vp, fp) = (self.p(q), self.p(k), self.p(v), self.vector(inv_freq)?);
        let n = t * (q_width / 2 + kv_width / 2 + kv_width);
        let (ti, qw, kw, hi, si) = (
            t as i32,
            q_width as i32,
            kv_width as i32,
            inv_freq.len() as i32,
            start as i32,
        );
        let [bq, bk, bv] = self.qkv_biases(bias, q_width, kv_width)?;
        let c = cfg(blocks(n, 256), 256);
        launch!(self.gpu, self.gpu.kernels.rope_kv, c; qp, kp, vp, fp, ti, qw, kw, hi, si, kd, vd, posp, bq, bk, bv)
    }

    /// A decode token's first `n` (2 or 3) products of one x in one launch: float kinds through
    /// matvec3_* (blockIdx.y picks the matrix; a grid of n rows leaves the rest unread), integer
    /// ones through Gpu::matvec3_int; false, nothing launched, where neither applies (then
    /// separate `matmul`s, the same sums). Put the matrices with the fewest rows first: their
    /// blocks then start before the larger one's.
    pub(super) fn products_in_one_launch(
        &self,
        w: [&Matrix<'_>; 3],
        x: &CudaSlice<f32>,
        out: [&CudaSlice<f32>; 3],
        n: u32,
    ) -> crate::Result<bool> {
        let d = [*self.mat(w[0])?, *self.mat(w[1])?, *self.mat(w[2])?];
        for (m, o) in w.iter().zip(&out) {
            check_len("matmul input", x.len(), m.cols)?;
            check_len("matmul output", o.len(), m.rows)?;
        }
        let (xp, y) = (self.p(x), out.map(|o| self.p(o)));
        let floats = xp.is_multiple_of(16)
            && d.iter()
                .all(|m| m.kind < 3 && m.kind == d[0].kind && m.vectorizable());
        if !floats {
            return self.gpu.matvec3_int([&d[0], &d[1], &d[2]], xp, y, n);
        }
        let rows = d.iter().map(|m| m.rows as usize).max().unwrap_or(0);
        let c = LaunchConfig {
            grid_dim: (blocks(rows, 8), n, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.gpu.kernels.matvec3[d[0].kind as usize];
        let [a, b, m] = d;
        launch!(self.gpu, f, c; a, b, m, xp, y[0], y[1], y[2])?;
        Ok(true)
    }

    /// Backend::mlp_hidden of one token through Gpu::mlp_gate_up (then, with a gate logit s,
    /// shared_gate's factor alone); false, nothing launched, where that does not apply.
    pub(super) fn mlp_hidden_in_one_launch(
        &self,
        w: [&Matrix<'_>; 2],
        x: &CudaSlice<f32>,
        gate: &CudaSlice<f32>,
        s: Option<&CudaSlice<f32>>,
    ) -> crate::Result<bool> {
        let width = w[0].rows;
        check_len("mlp input", x.len(), w[0].cols)?;
        check_len("mlp output", gate.len(), width)?;
        let (gm, um) = (*self.mat(w[0])?, *self.mat(w[1])?);
        if !self.gpu.mlp_gate_up((&gm, &um), self.p(x), self.p(gate))? {
            return Ok(false);
        }
        let Some(s) = s else {
            return Ok(true);
        };
        check_len("shared_gate logits", s.len(), 1)?;
        // A null up: gate already holds the SwiGLU.
        self.shared_gate_launch((self.p(gate), 0, self.p(s)), (1, width))?;
        Ok(true)
    }

    /// cuda/elementwise.cu shared_gate over t rows of `width` at g: with u (0: g already holds
    /// the SwiGLU) and the gate logits s (0: none).
    pub(super) fn shared_gate_launch(
        &self,
        (g, u, s): (u64, u64, u64),
        (t, width): (usize, usize),
    ) -> crate::Result<()> {
        let n = t * width;
        let (wi, ni) = (width as i32, n as i32);
        let c = cfg(blocks(n, 256), 256);
        launch!(self.gpu, self.gpu.kernels.shared_gate, c; g, u, s, wi, ni)
    }

    /// Backend::qk_norm_rope_kv: per-head QK-norm (norms of 2 * half values), RoPE and the KV
    /// store in one launch (qk_norm_rope_kv); a whole-row norm as separate launches.
    pub(super) fn qk_norm_launch(
        &self,
        (q, k): (&CudaSlice<f32>, &CudaSlice<f32>),
        [qo, ko, v]: [&mut CudaSlice<f32>; 3],
        (qn, kn, eps): (&[f32], &[f32], f32),
        step: &QkvStep<'_>,
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (t, q_width, kv_width) = (step.t, step.q_width, step.kv_width);
        let (start, inv_freq, layer) = (step.start, step.inv_freq, step.layer);
        let hd = 2 * inv_freq.len();
        let per_head = hd > 0
            && qn.len() == hd
            && kn.len() == hd
            && q_width % hd == 0
            && kv_width % hd == 0
            && kv_width == kv.kv_dim;
        if !per_head {
            return qk_norm_then_rope_kv(self, (q, k), [qo, ko, v], (qn, kn, eps), step, kv);
        }
        check_len("qk_norm input", q.len().min(qo.len()), t * q_width)?;
        check_len(
            "qk_norm input",
            [k.len(), ko.len(), v.len()].into_iter().min().unwrap_or(0),
            t * kv_width,
        )?;
        let (kd, vd, posp) = self.kv_target(kv, layer, start, t)?;
        let (qp, kp, vp, qop, kop) = (self.p(q), self.p(k), self.p(v), self.p(qo), self.p(ko));
        let (qnp, knp, fp) = (self.vector(qn)?, self.vector(kn)?, self.vector(inv_freq)?);
        let rows = t * (q_width + kv_width) / hd;
        let n = rows * 32 + t * kv_width;
        let (ti, qw, kw, hi, si) = (
            t as i32,
            q_width as i32,
            kv_width as i32,
            inv_freq.len() as i32,
            start as i32,
        );
        let c = cfg(blocks(n, 256), 256);
        let f = &self.gpu.kernels.qk_norm_rope_kv;
        launch!(self.gpu, f, c; qp, kp, vp, qop, kop, qnp, knp, eps, fp, ti, qw, kw, hi, si, kd, vd, posp)
    }

    /// Whether attention_prep takes this decode step: one token, heads up to 256 wide, RoPE over
    /// whole heads, per-head QK-norm if any, and not the float q, k, v without biases or
    /// norms that matvec3_rope rotates in its own launch.
    pub(super) fn attention_prep_applies(
        &self,
        w: [&Matrix<'_>; 3],
        prep: &AttnPrep<'_>,
        step: &QkvStep<'_>,
        shape: &AttentionShape<'_>,
    ) -> bool {
        let hd = shape.head_dim;
        let floats = w.iter().all(|m| self.mat(m).is_ok_and(|d| d.kind < 3));
        shape.t == 1
            && step.t == 1
            && hd > 0
            && hd <= 256
            && step.inv_freq.len() * 2 == hd
            && shape.n_kv_heads > 0
            && shape.n_heads.is_multiple_of(shape.n_kv_heads)
            && step.q_width == shape.n_heads * hd
            && step.kv_width == shape.n_kv_heads * hd
            && prep
                .norms
                .is_none_or(|(qn, kn, _)| qn.len() == hd && kn.len() == hd)
            && !(floats && prep.bias.is_none() && prep.norms.is_none())
    }

    /// One decode token's biases, QK-norm, RoPE, cache rows, q scale and attention in one
    /// launch (attention.cu attention_prep), where attention_prep_applies.
    pub(super) fn attention_prep(
        &self,
        [q, k, v]: [&CudaSlice<f32>; 3],
        prep: &AttnPrep<'_>,
        step: &QkvStep<'_>,
        shape: AttentionShape<'_>,
        kv: &mut CudaKv,
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let (qw, kw) = (step.q_width, step.kv_width);
        check_len("attention q", q.len().min(out.len()), qw)?;
        check_len("attention k, v", k.len().min(v.len()), kw)?;
        if kw != kv.kv_dim {
            return Err(Error::Invalid(format!(
                "CUDA backend: keys of {kw} values for a cache of {}",
                kv.kv_dim
            )));
        }
        let (kd, vd, posp) = self.kv_target(kv, step.layer, step.start, 1)?;
        let [bq, bk, bv] = self.qkv_biases(prep.bias, qw, kw)?;
        let (qn, kn, eps) = match prep.norms {
            Some((qn, kn, eps)) => (self.vector(qn)?, self.vector(kn)?, eps),
            None => (0u64, 0u64, 0f32),
        };
        let sinks = self.sinks_ptr(&shape)?;
        let (qp, kp, vp, op, fp) = (
            self.p(q),
            self.p(k),
            self.p(v),
            self.p(out),
            self.vector(step.inv_freq)?,
        );
        let (nh, nkv, hd) = (
            shape.n_heads as i32,
            shape.n_kv_heads as i32,
            shape.head_dim as i32,
        );
        let window = shape.window.map_or(0, |w| w as i32);
        let scale = prep.q_scale;
        // 16 warps share a head's positions, as the decode attention launch.
        let c = cfg(shape.n_heads as u32, 512);
        let f = &self.gpu.kernels.attention_prep;
        launch!(self.gpu, f, c; qp, kp, vp, bq, bk, bv, qn, kn, eps, fp, scale, kd, vd, op, nh, nkv, hd, window, posp, sinks)
    }

    /// The device copy of an attention's per-head sinks (0: none); a count that is not the
    /// heads' is an error.
    pub(super) fn sinks_ptr(&self, shape: &AttentionShape<'_>) -> crate::Result<u64> {
        match shape.sinks {
            Some(s) if s.len() == shape.n_heads => self.vector(s),
            Some(s) => Err(Error::Invalid(format!(
                "CUDA attention: {} sinks for {} heads",
                s.len(),
                shape.n_heads
            ))),
            None => Ok(0u64),
        }
    }

    /// The device copy of an optional bias vector of `len` values (0: none), its length checked
    /// (`what` names it in the error).
    pub(super) fn bias_ptr(&self, b: Option<&[f32]>, len: usize, what: &str) -> crate::Result<u64> {
        match b {
            Some(b) => {
                check_len(what, b.len(), len)?;
                self.vector(b)
            }
            None => Ok(0),
        }
    }

    /// q's, k's and v's biases on the device (zeros: none).
    fn qkv_biases(
        &self,
        b: Option<&[Vec<f32>; 3]>,
        qw: usize,
        kw: usize,
    ) -> crate::Result<[u64; 3]> {
        Ok([
            self.bias_ptr(b.map(|b| &b[0][..]), qw, "q bias")?,
            self.bias_ptr(b.map(|b| &b[1][..]), kw, "k bias")?,
            self.bias_ptr(b.map(|b| &b[2][..]), kw, "v bias")?,
        ])
    }
}

/// Routes from their read-back copy `host` ([t, k] indices as f32 bits, then weights).
fn read_routes(host: &[f32], n_experts: usize, routes: &mut [Route]) {
    let (ids, wts) = host[..2 * routes.len()].split_at(routes.len());
    for (r, (id, w)) in routes.iter_mut().zip(ids.iter().zip(wts)) {
        let expert = id.to_bits() as usize;
        // No expert found (the device's top-k saw only NaN: router logits not finite): a
        // route in range with a NaN weight, which the forward pass refuses by layer
        // (as the host's route_softmax_topk leaves it).
        *r = if expert < n_experts {
            Route { expert, weight: *w }
        } else {
            Route {
                expert: 0,
                weight: f32::NAN,
            }
        };
    }
}
