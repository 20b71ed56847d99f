//! A dense tensor of a checkpoint as convert writes it: its .hob and checkpoint names, shape and
//! role, and the lanes it takes of the checkpoint's values (a reordering or a split where hob
//! stores the tensor another way than the checkpoint).

/// How a dense tensor is stored: matrices in the --dense dtype, the rest always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    Matrix,
    Norm,
    Router,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseTensor {
    pub hob_name: String,
    pub hf_name: String,
    /// The shape written (the checkpoint's, but for `lanes`).
    pub shape: Vec<usize>,
    pub role: TensorRole,
    pub lanes: Lanes,
}

/// Which values of the checkpoint tensor's last axis a dense tensor takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    All,
    /// Every other value from 0 or from 1 (gpt-oss's interleaved gate/up biases): the
    /// checkpoint's last axis is twice the shape's.
    Even,
    Odd,
    /// Each head's values (along the first axis) in hob's RoPE order for partial rotary
    /// (src/import/glm4moe.rs).
    RopeOrder {
        head_dim: usize,
        rope_dim: usize,
    },
    /// In each block of `block` rows, rows offset..offset + len from interleaved RoPE pairs to
    /// rotate-half (src/import/deepseek.rs).
    Interleaved {
        block: usize,
        offset: usize,
        len: usize,
    },
    /// DeepSeek's kv_b_proj ([heads * (nope + v), rank]) split: each head's k part transposed
    /// ([heads * rank, nope]), or its v part ([heads * v, rank]).
    KvB {
        heads: usize,
        nope: usize,
        v: usize,
        rank: usize,
        values: bool,
    },
}

impl DenseTensor {
    pub fn new(hob_name: String, hf_name: String, shape: Vec<usize>, role: TensorRole) -> Self {
        DenseTensor {
            hob_name,
            hf_name,
            shape,
            role,
            lanes: Lanes::All,
        }
    }

    /// The tensor's shape in the checkpoint.
    pub fn source_shape(&self) -> Vec<usize> {
        if let Lanes::KvB {
            heads,
            nope,
            v,
            rank,
            ..
        } = self.lanes
        {
            return vec![heads * (nope + v), rank];
        }
        let mut s = self.shape.clone();
        if let (Lanes::Even | Lanes::Odd, Some(last)) = (self.lanes, s.last_mut()) {
            *last *= 2;
        }
        s
    }

    /// The values this tensor takes of the checkpoint's (`source_shape`, row-major).
    pub fn take_lanes(&self, source: Vec<f32>) -> Vec<f32> {
        let first = match self.lanes {
            Lanes::All => return source,
            Lanes::Even => 0,
            Lanes::Odd => 1,
            Lanes::Interleaved { block, offset, len } => {
                let row = self.shape.iter().skip(1).product::<usize>().max(1);
                let mut out = source;
                for b in out.chunks_exact_mut(block * row) {
                    let part = b[offset * row..(offset + len) * row].to_vec();
                    for j in 0..len {
                        let i = super::deepseek::deinterleave_source(j, len);
                        let dst = (offset + j) * row;
                        b[dst..dst + row].copy_from_slice(&part[i * row..(i + 1) * row]);
                    }
                }
                return out;
            }
            Lanes::KvB {
                heads,
                nope,
                v,
                rank,
                values,
            } => {
                let mut out = Vec::with_capacity(heads * (nope + v) * rank);
                for h in source.chunks_exact((nope + v) * rank).take(heads) {
                    match values {
                        true => out.extend_from_slice(&h[nope * rank..]),
                        false => {
                            for i in 0..rank {
                                out.extend((0..nope).map(|j| h[j * rank + i]));
                            }
                        }
                    }
                }
                return out;
            }
            Lanes::RopeOrder { head_dim, rope_dim } => {
                // Rows of `row` values, head_dim rows a head.
                let row = self.shape.iter().skip(1).product::<usize>().max(1);
                let mut out = Vec::with_capacity(source.len());
                for head in source.chunks_exact(head_dim * row) {
                    for j in 0..head_dim {
                        let i = super::glm4moe::rope_order_source(j, head_dim, rope_dim);
                        out.extend_from_slice(&head[i * row..(i + 1) * row]);
                    }
                }
                return out;
            }
        };
        source.into_iter().skip(first).step_by(2).collect()
    }
}
