//! Launchers of the prefill products (cuBLAS, the int4 GEMM) and the small element-wise kernels.

use super::*;

impl Gpu {
    /// out[t, rows] = x[t, cols] · Wᵀ for t > 1, through cuBLAS. f32 weights: SGEMM on the
    /// weights as stored (exact f32). Every other kind: the tokens rounded to f16 once, the weights
    /// in f16 (f16 as stored; the others dequantized to f16 row tiles in `scratch`), a tensor-core
    /// GEMM accumulating in f32. `scratch` holds `scratch_len` floats.
    pub fn matmul(
        &self,
        w: &DevMat,
        x: u64,
        t: usize,
        out: u64,
        scratch: u64,
        scratch_len: usize,
    ) -> crate::Result<()> {
        if t == 1 {
            return self.matvec(w, x, out);
        }
        let (rows, cols) = (w.rows as usize, w.cols as usize);
        if w.kind == 0 {
            return self.gemm(
                (w.codes, Precision::F32, (rows, cols)),
                (x, t),
                (out, 0, rows),
            );
        }
        // scratch as f16: [tokens (chunk x cols) | weight tile]
        let halves = scratch_len * 2;
        let chunk = (halves / 2 / cols).clamp(1, t);
        let tile_rows = prefill_tile_rows((halves - chunk * cols) / cols, rows);
        let xh = scratch;
        let tile = scratch + (chunk * cols * 2) as u64;
        let (kind, wm) = (w.kind, *w);
        // Integer kinds a code word per thread where the layout allows (cuda/dequant.cu
        // dequant_words_h): 4-byte aligned words, 16-byte aligned output rows, one group a word.
        let per_word = match kind {
            3 => 4,
            4 | 8 => 8,
            _ => 16,
        };
        // (int3: words of its low bits; its rows of 64-column blocks keep every word in place.)
        let words = w.is_packed_int()
            && w.codes.is_multiple_of(4)
            && w.row_bytes % 4 == 0
            && cols % 8 == 0
            && w.group > 0
            && w.group % per_word == 0
            && w.cols % w.group == 0;
        let mut t0 = 0;
        while t0 < t {
            let tn = chunk.min(t - t0);
            let (src, n) = (x + (t0 * cols * 4) as u64, (tn * cols) as i32);
            // to_half: four values a thread.
            let c = cfg(blocks((tn * cols).div_ceil(4), 256), 256);
            launch!(self, self.kernels.to_half, c; src, xh, n)?;
            let dst = out + (t0 * rows * 4) as u64;
            // The partials of gemm_q4h's parts of K go after the tokens in the scratch.
            let part = scratch + ((chunk * cols * 2).div_ceil(256) * 256) as u64;
            let room = (scratch_len * 4).saturating_sub((part - scratch) as usize);
            let fit = room / (tn * rows * 4).max(1);
            if let Some(splits) = self.gemm_q4h(w, xh, tn, (dst, part), fit)? {
                if splits > 1 {
                    self.sum_splits(part, dst, tn * rows, splits)?;
                }
            } else if kind == 1 {
                self.gemm(
                    (w.codes, Precision::F16, (rows, cols)),
                    (xh, tn),
                    (dst, 0, rows),
                )?;
            } else {
                let mut r0 = 0;
                while r0 < rows {
                    let n = tile_rows.min(rows - r0);
                    let (r0i, ni) = (r0 as i32, n as i32);
                    if w.is_ap8() {
                        // A 16-value unit a thread (ap8.cu dequant_ap8_h).
                        let grid = LaunchConfig {
                            grid_dim: (blocks(cols / 16, 128), n as u32, 1),
                            block_dim: (128, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        launch!(self, self.kernels.dequant_ap8_h, grid; wm, tile, r0i, ni)?;
                    } else if words {
                        let grid = LaunchConfig {
                            grid_dim: (blocks(wm.chunk_bytes() as usize / 4, 128), n as u32, 1),
                            block_dim: (128, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        launch!(self, self.kernels.dequant_words_h, grid; wm, kind, tile, r0i, ni)?;
                    } else {
                        let grid = LaunchConfig {
                            grid_dim: (blocks(cols, 256), n as u32, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        launch!(self, self.kernels.dequant_rows_h, grid; wm, kind, tile, r0i, ni)?;
                    }
                    self.gemm((tile, Precision::F16, (n, cols)), (xh, tn), (dst, r0, rows))?;
                    r0 += n;
                }
            }
            t0 += tn;
        }
        Ok(())
    }

    /// out[token, r0 + i] = sum_c A[i, c] B[token, c] for i < n, token < t: A a row-major
    /// [n, cols] weight block (`a` = (A, its precision, (n, cols))), B the tokens [t, cols], out
    /// rows `ld_out` wide (the whole matrix's rows), from row r0. Column-major for cuBLAS:
    /// C (n x t, ld ld_out, from row r0) = Aᵀ (cols x n)ᵀ · B.
    fn gemm(
        &self,
        (a, p, (n, cols)): (u64, Precision, (usize, usize)),
        (b, t): (u64, usize),
        (out, r0, ld_out): (u64, usize, usize),
    ) -> crate::Result<()> {
        use cublas_sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dt = match p {
            Precision::F32 => cudaDataType::CUDA_R_32F,
            Precision::F16 => cudaDataType::CUDA_R_16F,
        };
        // SAFETY: a holds n * cols values of `dt`, b holds t * cols, out holds t * ld_out floats
        // from row r0 on; the handle is bound to the compute stream, after the tile and tokens.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                t as i32,
                cols as i32,
                &alpha as *const f32 as *const _,
                a as *const _,
                dt,
                cols as i32,
                b as *const _,
                dt,
                cols as i32,
                &beta as *const f32 as *const _,
                (out as *mut f32).add(r0) as *mut _,
                cudaDataType::CUDA_R_32F,
                ld_out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda_err)
    }

    /// Each head's own f32 product for t tokens, one cuBLAS call over the heads:
    /// y[tok, h, i] = alpha · sum_c w[h * rows + i, c] · x[tok, h, c] for i < rows, with x and y given
    /// with their floats per head (`xs`, `ys`; a token's heads follow each other). Column-major
    /// for cuBLAS, head h: C (rows x t, ld heads * ys, from y + h * ys) = W_hᵀ (cols x rows)ᵀ ·
    /// X (cols x t, ld heads * xs, from x + h * xs). f32 arithmetic (the handle keeps the default
    /// math mode: no TF32).
    pub fn gemm_heads(
        &self,
        w: u64,
        (x, xs): (u64, usize),
        (y, ys): (u64, usize),
        (heads, rows, cols): (usize, usize, usize),
        (t, alpha): (usize, f32),
    ) -> crate::Result<()> {
        use cublas_sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        let beta = 0.0f32;
        let f32t = cudaDataType::CUDA_R_32F;
        let dim = |v: usize| {
            i32::try_from(v)
                .map_err(|_| Error::Invalid(format!("gemm_heads: {v} is past cuBLAS's int")))
        };
        let (m, n, k, h) = (dim(rows)?, dim(t)?, dim(cols)?, dim(heads)?);
        let (ldb, ldc) = (dim(heads * xs)?, dim(heads * ys)?);
        // SAFETY: w holds heads * rows * cols floats; x holds t tokens of heads * xs floats
        // (each head's cols <= xs), y t tokens of heads * ys (rows <= ys), as the caller
        // checked; the handle is bound to the compute stream, after the launches that wrote x.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                &alpha as *const f32 as *const _,
                w as *const _,
                f32t,
                k,
                (rows * cols) as i64,
                x as *const _,
                f32t,
                ldb,
                xs as i64,
                &beta as *const f32 as *const _,
                y as *mut _,
                f32t,
                ldc,
                ys as i64,
                h,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda_err)
    }

    /// True where gemm_q4h computes `w`'s products from f16 tokens at `xh` (int4, groups of a
    /// multiple of 32: hob's g64 and a GGUF's Q4_K g32; 16-byte aligned rows).
    pub fn gemm_q4h_applies(&self, w: &DevMat, xh: u64) -> bool {
        let int4 = w.kind == 4 && w.group % 32 == 0 || w.is_int4k();
        self.kernels.gemm_q4h.is_some() && int4 && q4h_layout(w, xh)
    }

    /// int4 `w` (groups of a multiple of 32) or MXFP4 `w` times the `tn` f16 tokens at `xh`
    /// through gemm_q4h (gemm_mx4h), f32 [tn, rows] out: at `direct` in one launch over K, or as the partial sums of K's parts at `parts` + z·tn·rows
    /// (at most `max_parts` of them) where the grid is short of two waves. Returns the number
    /// of parts (1: the product is at `direct`), None where the kernel does not apply.
    pub fn gemm_q4h(
        &self,
        w: &DevMat,
        xh: u64,
        tn: usize,
        (direct, parts): (u64, u64),
        max_parts: usize,
    ) -> crate::Result<Option<usize>> {
        // MXFP4 (one 32-value block a thread's codes): gemm_mx4h, the same tiles.
        let kernels = if w.is_mxfp4() && q4h_layout(w, xh) {
            self.kernels.gemm_mx4h.as_ref()
        } else {
            let fs = match w.is_int4k() {
                true => &self.kernels.gemm_q4k,
                false => &self.kernels.gemm_q4h,
            };
            fs.as_ref().filter(|_| self.gemm_q4h_applies(w, xh))
        };
        let Some(fs) = kernels else {
            return Ok(None);
        };
        let (rows, cols) = (w.rows as usize, w.cols as usize);
        let (f, bn) = q4h_kernel(fs, tn);
        // K in 4 parts where the grid is short of two waves (Mixtral's 14336-row gate and up:
        // 112 blocks, its 4096-row down: 32): the best of 1-8 parts and of parts sized to the
        // SM count (benches/results/2026-11-24-h100-prefill.md).
        let grid = rows.div_ceil(128) * tn.div_ceil(bn);
        let steps = cols / 64;
        let mut splits = if grid < 2 * self.q_limits.sm_count {
            4.min(steps)
        } else {
            1
        };
        if splits > max_parts {
            splits = 1;
        }
        let ksteps = steps.div_ceil(splits);
        let splits = steps.div_ceil(ksteps);
        let c = q4h_grid(rows, tn.div_ceil(bn), splits);
        let (ti, ld, ks) = (tn as i32, rows as i32, ksteps as i32);
        let out = if splits == 1 { direct } else { parts };
        let wm = *w;
        launch!(self, f, c; wm, xh, ti, out, ld, ks)?;
        Ok(Some(splits))
    }

    /// Product `which` (0 gate, 1 up, 2 down) of every expert in the device table `groups`
    /// (`n_groups` QGroups, each gemm_q4h_applies to its matrices) on its rows of the f16 tokens
    /// at `xh`, f32 rows of `rows` values out at `out`, K not split: group by group what
    /// gemm_q4h computes with one part. `max_n`: the most rows of a group; `int4k`: the
    /// matrices are int4k (else int4).
    pub fn gemm_q4h_groups(
        &self,
        (groups, n_groups, max_n): (u64, usize, usize),
        (which, int4k): (usize, bool),
        (xh, out): (u64, u64),
        rows: usize,
    ) -> crate::Result<()> {
        let fs = match int4k {
            true => &self.kernels.gemm_q4k_grp,
            false => &self.kernels.gemm_q4h_grp,
        };
        let Some(fs) = fs.as_ref() else {
            return Err(Error::Invalid(
                "gemm_q4h_groups: needs sm_80 or later".into(),
            ));
        };
        let (f, bn) = q4h_kernel(fs, max_n);
        let c = q4h_grid(rows, max_n.div_ceil(bn), n_groups);
        let (wi, ld) = (which as i32, rows as i32);
        launch!(self, f, c; groups, wi, xh, out, ld)
    }

    /// out[idx[r], :] += w[r] · y[r, :] for the m rows r, each token's rows in ascending r (one
    /// block a token, t tokens; at most 32 rows a token).
    pub fn gather_axpy(
        &self,
        out: u64,
        (idx, w): (u64, u64),
        y: u64,
        (n, m, t): (usize, usize, usize),
    ) -> crate::Result<()> {
        let (ni, mi) = (n as i32, m as i32);
        launch!(self, self.kernels.gather_axpy, cfg(t as u32, 256); out, idx, w, y, ni, mi)
    }

    /// out[..n] = the sum of the `splits` partials at parts, n apart, in order.
    pub fn sum_splits(&self, parts: u64, out: u64, n: usize, splits: usize) -> crate::Result<()> {
        let (ni, si) = (n as i32, splits as i32);
        launch!(self, self.kernels.sum_splits, cfg(blocks(n, 256), 256); parts, out, ni, si)
    }

    /// act = f16(silu(g) · u) over n values.
    pub fn swiglu_half(&self, g: u64, u: u64, act: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.swiglu_half, cfg(blocks(n, 256), 256); g, u, act, ni)
    }

    pub fn swiglu(&self, g: u64, u: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.swiglu, cfg(blocks(n, 256), 256); g, u, ni)
    }

    /// g = gpt-oss's activation of (g + bg, u + bu) over n values, rows of f (`act`: alpha and
    /// limit; `b`: the gate and up biases of f values each).
    pub fn expert_glu(
        &self,
        (g, u, n): (u64, u64, usize),
        (bg, bu, f): (u64, u64, usize),
        (alpha, limit): (f32, f32),
    ) -> crate::Result<()> {
        let (ni, fi) = (n as i32, f as i32);
        let c = cfg(blocks(n, 256), 256);
        launch!(self, self.kernels.expert_glu, c; g, u, bg, bu, fi, ni, alpha, limit)
    }

    /// `expert_glu` of one token's k routed experts in g ([2k, f]: gate rows, then up rows),
    /// each with the biases of its expert (`routes`: k indices as f32 bits) in the tables bg, bu.
    pub fn expert_glu_routed(
        &self,
        (g, routes, k, f): (u64, u64, usize, usize),
        (bg, bu): (u64, u64),
        (alpha, limit): (f32, f32),
    ) -> crate::Result<()> {
        let (fi, ki) = (f as i32, k as i32);
        let c = cfg(blocks(k * f, 256), 256);
        launch!(self, self.kernels.expert_glu_routed, c; g, routes, bg, bu, fi, ki, alpha, limit)
    }

    /// d ([k, n]) += each routed expert's row of the bias table b.
    pub fn add_routed_rows(
        &self,
        d: u64,
        routes: u64,
        b: u64,
        (k, n): (usize, usize),
    ) -> crate::Result<()> {
        let (ni, ki) = (n as i32, k as i32);
        launch!(self, self.kernels.add_routed_rows, cfg(blocks(k * n, 256), 256); d, routes, b, ni, ki)
    }

    /// x[i] += b[i % n] over rows of n, `total` values.
    pub fn add_bias_rows(&self, x: u64, b: u64, n: usize, total: usize) -> crate::Result<()> {
        let (ni, ti) = (n as i32, total as i32);
        launch!(self, self.kernels.add_rows, cfg(blocks(total, 256), 256); x, b, ni, ti)
    }

    /// dst[j, :] = src[idx[j], :] for j < m, rows of n, stored as f16 where `half` (else f32).
    pub fn gather_rows(
        &self,
        (src, idx): (u64, u64),
        dst: u64,
        n: usize,
        m: usize,
        half: bool,
    ) -> crate::Result<()> {
        let (ni, mi) = (n as i32, m as i32);
        let f = if half {
            &self.kernels.gather_rows_half
        } else {
            &self.kernels.gather_rows
        };
        launch!(self, f, cfg(blocks(n * m, 256), 256); src, idx, dst, ni, mi)
    }

    /// out[idx[j], :] += w[j] · y[j, :] for j < m, rows of n, y the sum of `splits` partials
    /// (gemm_q4h's parts of K) n·m apart.
    pub fn scatter_axpy(
        &self,
        out: u64,
        (idx, w): (u64, u64),
        y: u64,
        n: usize,
        m: usize,
        splits: usize,
    ) -> crate::Result<()> {
        let (ni, mi, si) = (n as i32, m as i32, splits as i32);
        launch!(self, self.kernels.scatter_axpy, cfg(blocks(n * m, 256), 256); out, idx, w, y, ni, mi, si)
    }

    pub fn axpy(&self, out: u64, w: f32, y: u64, n: usize) -> crate::Result<()> {
        let ni = n as i32;
        launch!(self, self.kernels.axpy, cfg(blocks(n, 256), 256); out, w, y, ni)
    }

    pub fn zero(&self, ptr: u64, bytes: usize) -> crate::Result<()> {
        // SAFETY: callers pass a live device allocation of at least `bytes` bytes.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(cuda_err)
    }
}

/// gemm_q4h's form for `tn` tokens and its tokens a block: 128 a block above 64 (64 a block was
/// slower at pp512: benches/results/2026-11-24-h100-prefill.md).
/// The layout gemm_q4h and gemm_mx4h read: 64-column steps, 16-byte aligned rows and tokens.
fn q4h_layout(w: &DevMat, xh: u64) -> bool {
    (w.cols as usize).is_multiple_of(64)
        && w.row_bytes % 16 == 0
        && w.codes.is_multiple_of(16)
        && xh.is_multiple_of(16)
}

fn q4h_kernel(
    fs: &[cudarc::driver::CudaFunction; 2],
    tn: usize,
) -> (&cudarc::driver::CudaFunction, usize) {
    if tn > 64 {
        (&fs[1], 128)
    } else {
        (&fs[0], 64)
    }
}

/// A gemm_q4h grid: 128 rows a block, `token_tiles` blocks of tokens, `z` K parts or groups.
fn q4h_grid(rows: usize, token_tiles: usize, z: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(128) as u32, token_tiles as u32, z as u32),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
