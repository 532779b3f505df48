//! The model's weights on the device: one buffer, each tensor at a 256-byte aligned offset,
//! uploaded with queue writes. The q, k and v projections of a layer sit back to back (one
//! `[q + 2 kv, hidden]` matrix, read by one GEMV), and so do the gate and up projections (one
//! `[2 intermediate, hidden]` matrix): row-major `[out, in]` matrices concatenate along `out`
//! by concatenating their bytes, so no host copy is made.

use std::sync::Arc;
use std::time::Duration;

use cuhal::{Buffer, BufferRange, Device};

use crate::error::{Error, Result};
use crate::weights::{Tensor, Weights};

/// Alignment of every tensor in the weights buffer (the GEMV's 128-bit loads need 16).
const ALIGN: usize = 256;
/// Bytes of writes in flight before the upload waits for them (each stages its bytes in pinned
/// host memory until it completes).
const UPLOAD_WINDOW: usize = 512 << 20;
/// How long the upload waits for its writes.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// One layer's tensors as ranges of the weights buffer.
#[derive(Clone)]
pub struct LayerRanges {
    /// `input_layernorm.weight`, `[hidden]`.
    pub attn_norm: BufferRange,
    /// q, k and v projections, `[q_dim + 2 kv_dim, hidden]`.
    pub qkv: BufferRange,
    /// `o_proj.weight`, `[hidden, q_dim]`.
    pub o: BufferRange,
    /// `post_attention_layernorm.weight`, `[hidden]`.
    pub mlp_norm: BufferRange,
    /// gate and up projections, `[2 intermediate, hidden]`.
    pub gate_up: BufferRange,
    /// `down_proj.weight`, `[hidden, intermediate]`.
    pub down: BufferRange,
}

/// The uploaded weights.
pub struct DeviceWeights {
    /// The one buffer holding every tensor.
    pub buffer: Arc<Buffer>,
    /// `embed_tokens.weight`, `[vocab, hidden]`.
    pub embed: BufferRange,
    /// Each layer's tensors.
    pub layers: Vec<LayerRanges>,
    /// `model.norm.weight`, `[hidden]`.
    pub norm: BufferRange,
    /// The output projection, `[vocab, hidden]` (the embedding's range when tied).
    pub lm_head: BufferRange,
}

/// Where each tensor goes: a running offset into the buffer-to-be, and the writes to make.
struct Planner<'a> {
    offset: usize,
    /// (offset in the buffer, bytes to write there).
    writes: Vec<(usize, &'a [u8])>,
}

impl<'a> Planner<'a> {
    /// Places `group` back to back at the next aligned offset; returns (offset, total length).
    fn place(&mut self, group: &[&Tensor<'a>]) -> (usize, usize) {
        let at = self.offset.next_multiple_of(ALIGN);
        let mut end = at;
        for tensor in group {
            self.writes.push((end, tensor.data));
            end += tensor.data.len();
        }
        self.offset = end;
        (at, end - at)
    }
}

impl DeviceWeights {
    /// Allocates the buffer and uploads `weights` on `device`'s first queue; returns once every
    /// write has completed.
    pub fn upload(device: &Device, weights: &Weights<'_>) -> Result<Self> {
        let mut planner = Planner {
            offset: 0,
            writes: Vec::new(),
        };
        let embed = planner.place(&[&weights.embed_tokens]);
        let mut layers = Vec::with_capacity(weights.layers.len());
        for l in &weights.layers {
            layers.push([
                planner.place(&[&l.input_layernorm]),
                planner.place(&[&l.q_proj, &l.k_proj, &l.v_proj]),
                planner.place(&[&l.o_proj]),
                planner.place(&[&l.post_attention_layernorm]),
                planner.place(&[&l.gate_proj, &l.up_proj]),
                planner.place(&[&l.down_proj]),
            ]);
        }
        let norm = planner.place(&[&weights.norm]);
        let lm_head = weights.lm_head.as_ref().map(|head| planner.place(&[head]));
        let total = planner.offset.next_multiple_of(ALIGN);
        let buffer = device
            .create_buffer(total)
            .map_err(Error::gpu("allocating the weights"))?;
        let range = |(at, len): (usize, usize)| {
            buffer
                .range(at, len)
                .map_err(|e| Error::gpu("a weights range")(e.into()))
        };

        // The writes, chained on one semaphore; the host waits whenever UPLOAD_WINDOW bytes are
        // staged, and at the end.
        let queue = device.queue(0);
        let uploaded = device.create_semaphore(0);
        let mut value = 0u64;
        let mut staged = 0usize;
        for &(offset, data) in &planner.writes {
            let target = range((offset, data.len()))?;
            queue
                .write(
                    &[(&uploaded, value)],
                    &[(&uploaded, value + 1)],
                    &target,
                    data,
                )
                .map_err(Error::gpu("uploading a weight"))?;
            value += 1;
            staged += data.len();
            if staged >= UPLOAD_WINDOW {
                uploaded
                    .wait(value, UPLOAD_TIMEOUT)
                    .map_err(|e| Error::gpu("waiting for the upload")(e.into()))?;
                staged = 0;
            }
        }
        uploaded
            .wait(value, UPLOAD_TIMEOUT)
            .map_err(|e| Error::gpu("waiting for the upload")(e.into()))?;

        let embed = range(embed)?;
        let lm_head = match lm_head {
            Some(head) => range(head)?,
            None => embed.clone(),
        };
        let layers = layers
            .into_iter()
            .map(|[attn_norm, qkv, o, mlp_norm, gate_up, down]| {
                Ok(LayerRanges {
                    attn_norm: range(attn_norm)?,
                    qkv: range(qkv)?,
                    o: range(o)?,
                    mlp_norm: range(mlp_norm)?,
                    gate_up: range(gate_up)?,
                    down: range(down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceWeights {
            embed,
            layers,
            norm: range(norm)?,
            lm_head,
            buffer,
        })
    }

    /// Bytes a decode step reads from the weights: every matrix once (the embedding only one
    /// row per sequence, the norms negligibly), the floor a step's time cannot go under at the
    /// device's memory rate.
    pub fn bytes_per_step(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.len() + l.o.len() + l.gate_up.len() + l.down.len())
            .sum();
        layers + self.lm_head.len()
    }
}
