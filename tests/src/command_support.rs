//! Helpers for the command-buffer tests (`tests/command.rs`): a stream, the three kinds of
//! command buffer behind one constructor, and the PTX kernels those tests dispatch.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cuhal_command::{
    Buffer, CommandBuffer, CommandRecorder, DeferredCommandBuffer, GraphCommandBuffer,
    StreamCommandBuffer, ZoneRecorder,
};
use cuhal_sys::{CU_STREAM_NON_BLOCKING, CUstream, Error, PrimaryContext};

/// The tests' streams: `cuhal-sys`'s own, created `CU_STREAM_NON_BLOCKING` by [`stream`].
pub use cuhal_sys::Stream;

/// A `CU_STREAM_NON_BLOCKING` stream in `context`.
pub fn stream(context: &Arc<PrimaryContext>) -> Result<Stream, Error> {
    Stream::new(context, CU_STREAM_NON_BLOCKING)
}

/// The three kinds of command buffer, for tests that run on each.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `GraphCommandBuffer`.
    Graph,
    /// `StreamCommandBuffer` (executes on `stream` while recording).
    Stream,
    /// `DeferredCommandBuffer`.
    Deferred,
}

impl Kind {
    /// Starts a command buffer of this kind. A stream command buffer records onto `stream`.
    pub fn create(
        self,
        context: &Arc<PrimaryContext>,
        stream: &Stream,
        zones: Option<Arc<dyn ZoneRecorder>>,
    ) -> Result<Recording, cuhal_command::Error> {
        let recorder = match self {
            Kind::Graph => Recorder::Graph(GraphCommandBuffer::new(context, zones)?),
            Kind::Stream => {
                // SAFETY: `stream` is a live stream of `context` and outlives the recording
                // (the caller holds it for the whole test).
                let cb = unsafe { StreamCommandBuffer::new(context, stream.raw(), zones)? };
                Recorder::Stream(cb)
            }
            Kind::Deferred => {
                Recorder::Deferred(DeferredCommandBuffer::with_context(context, zones)?)
            }
        };
        Ok(Recording {
            recorder,
            ended: None,
        })
    }

    /// Whether the same command buffer may be issued again.
    pub fn resubmittable(self) -> bool {
        self != Kind::Stream
    }
}

enum Recorder {
    Graph(GraphCommandBuffer),
    Stream(StreamCommandBuffer),
    Deferred(DeferredCommandBuffer),
}

/// A command buffer of any kind: records through [`CommandRecorder`] (by `Deref`), then
/// [`Recording::end`]. A graph or deferred one then holds the [`CommandBuffer`] its `end()`
/// returned, which [`Recording::issue`] issues; a stream one ran as it was recorded (it is not
/// a `CommandBuffer`), so issuing it does nothing. Keep it until its stream is synchronized:
/// it owns what the work reads.
pub struct Recording {
    recorder: Recorder,
    ended: Option<Arc<dyn CommandBuffer>>,
}

impl Deref for Recording {
    type Target = dyn CommandRecorder;

    fn deref(&self) -> &Self::Target {
        match &self.recorder {
            Recorder::Graph(cb) => cb,
            Recorder::Stream(cb) => cb,
            Recorder::Deferred(cb) => cb,
        }
    }
}

impl DerefMut for Recording {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match &mut self.recorder {
            Recorder::Graph(cb) => cb,
            Recorder::Stream(cb) => cb,
            Recorder::Deferred(cb) => cb,
        }
    }
}

impl Recording {
    /// The kind.
    pub fn kind(&self) -> Kind {
        match self.recorder {
            Recorder::Graph(_) => Kind::Graph,
            Recorder::Stream(_) => Kind::Stream,
            Recorder::Deferred(_) => Kind::Deferred,
        }
    }

    /// Ends the recording; a graph or deferred one keeps the command buffer `end()` returned.
    pub fn end(&mut self) -> Result<(), cuhal_command::Error> {
        match &mut self.recorder {
            Recorder::Graph(cb) => self.ended = Some(Arc::new(cb.end()?)),
            Recorder::Deferred(cb) => self.ended = Some(Arc::new(cb.end()?)),
            Recorder::Stream(cb) => cb.end()?,
        }
        Ok(())
    }

    /// The command buffer `end()` returned (`None` for a stream command buffer, or before the
    /// end).
    pub fn ended(&self) -> Option<&Arc<dyn CommandBuffer>> {
        self.ended.as_ref()
    }

    /// Issues the ended command buffer on `stream`; a stream command buffer's work is on its
    /// stream already.
    ///
    /// # Safety
    /// As [`CommandBuffer::issue`]: `stream` is a live stream of the command buffer's context
    /// (for a stream command buffer, the stream it recorded onto), and this outlives the work.
    pub unsafe fn issue(&self, stream: CUstream) -> Result<(), cuhal_command::Error> {
        match (&self.recorder, &self.ended) {
            (Recorder::Stream(cb), _) => {
                assert_eq!(
                    cb.stream(),
                    stream,
                    "a stream command buffer ran on its own stream"
                );
                Ok(())
            }
            // SAFETY: forwarded contract.
            (_, Some(ended)) => unsafe { ended.issue(stream) },
            (_, None) => panic!("issued before end()"),
        }
    }

    /// Whether the completed work did what it should (indirect dispatch counts in range).
    pub fn check_completed(&self) -> Result<(), cuhal_command::Error> {
        match (&self.recorder, &self.ended) {
            (Recorder::Stream(cb), _) => cb.check_completed(),
            (_, Some(ended)) => ended.check_completed(),
            (_, None) => Ok(()),
        }
    }

    /// The zone recorder given at creation (after `end()`).
    pub fn zones(&self) -> Option<&Arc<dyn ZoneRecorder>> {
        self.ended.as_ref().and_then(|cb| cb.zones())
    }
}

/// Issues `cb` on `stream` and waits for it.
pub fn submit(cb: &Recording, stream: &Stream) -> Result<(), cuhal_command::Error> {
    // SAFETY: `stream` is a live stream of the command buffer's context.
    unsafe { cb.issue(stream.raw()) }?;
    stream.synchronize()?;
    Ok(())
}

/// Reads a whole buffer back (after the caller synchronized its stream).
pub fn read(buffer: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; buffer.len()];
    buffer.read(0, &mut out).expect("read a buffer back");
    out
}

/// Reads a whole buffer back as native-endian `u32`s.
pub fn read_u32(buffer: &Buffer) -> Vec<u32> {
    read(buffer)
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// `u32`s as native-endian bytes.
pub fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// The module the command tests dispatch: four entry points (names in `*_NAME` below).
///
/// - `scale_add(u32 *out, const u32 *in, u32 a, u32 b, u32 n)`: `out[i] = in[i] * a + b`
///   (wrapping) for `i < n`.
/// - `mixed_args(u64 *out, u8 c, u64 x, u16 s, u32 w, f32 f)`: writes `c, x, s, w` and the
///   bits of `f`, each widened to a `u64`, to `out[0..5]`: proves every argument arrives intact
///   whatever its size and alignment.
/// - `add_one(u32 *data, u32 n)`: `data[i] += 1` for `i < n`; declared `.maxntid 64, 1, 1`,
///   so its limit is 64 threads per block.
/// - `reverse_block(u32 *data)`: reverses each block's slice of `data` through dynamic shared
///   memory (`4 * blockDim.x` bytes); launch with exactly as many threads as elements.
pub const COMMAND_KERNELS: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.extern .shared .align 16 .b8 reverse_smem[];

.visible .entry scale_add(
    .param .u64 scale_add_out,
    .param .u64 scale_add_in,
    .param .u32 scale_add_a,
    .param .u32 scale_add_b,
    .param .u32 scale_add_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [scale_add_out];
    ld.param.u64        %rd2, [scale_add_in];
    ld.param.u32        %r1, [scale_add_a];
    ld.param.u32        %r2, [scale_add_b];
    ld.param.u32        %r3, [scale_add_n];

    mov.u32             %r4, %ctaid.x;
    mov.u32             %r5, %ntid.x;
    mov.u32             %r6, %tid.x;
    mad.lo.u32          %r7, %r4, %r5, %r6;
    setp.ge.u32         %p1, %r7, %r3;
    @%p1 bra            SCALE_ADD_DONE;

    cvta.to.global.u64  %rd3, %rd1;
    cvta.to.global.u64  %rd4, %rd2;
    mul.wide.u32        %rd5, %r7, 4;
    add.s64             %rd6, %rd4, %rd5;
    ld.global.u32       %r8, [%rd6];
    mad.lo.u32          %r9, %r8, %r1, %r2;
    add.s64             %rd7, %rd3, %rd5;
    st.global.u32       [%rd7], %r9;

SCALE_ADD_DONE:
    ret;
}

.visible .entry mixed_args(
    .param .u64 mixed_out,
    .param .u8 mixed_c,
    .param .u64 mixed_x,
    .param .u16 mixed_s,
    .param .u32 mixed_w,
    .param .f32 mixed_f
)
{
    .reg .b16   %rs<3>;
    .reg .b32   %r<3>;
    .reg .f32   %f<2>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [mixed_out];
    ld.param.u8         %rs1, [mixed_c];
    ld.param.u64        %rd2, [mixed_x];
    ld.param.u16        %rs2, [mixed_s];
    ld.param.u32        %r1, [mixed_w];
    ld.param.f32        %f1, [mixed_f];

    cvta.to.global.u64  %rd3, %rd1;
    cvt.u64.u16         %rd4, %rs1;
    st.global.u64       [%rd3], %rd4;
    st.global.u64       [%rd3+8], %rd2;
    cvt.u64.u16         %rd5, %rs2;
    st.global.u64       [%rd3+16], %rd5;
    cvt.u64.u32         %rd6, %r1;
    st.global.u64       [%rd3+24], %rd6;
    mov.b32             %r2, %f1;
    cvt.u64.u32         %rd7, %r2;
    st.global.u64       [%rd3+32], %rd7;
    ret;
}

.visible .entry add_one(
    .param .u64 add_one_data,
    .param .u32 add_one_n
)
.maxntid 64, 1, 1
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [add_one_data];
    ld.param.u32        %r1, [add_one_n];

    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.u32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            ADD_ONE_DONE;

    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r5, 4;
    add.s64             %rd4, %rd2, %rd3;
    ld.global.u32       %r6, [%rd4];
    add.u32             %r7, %r6, 1;
    st.global.u32       [%rd4], %r7;

ADD_ONE_DONE:
    ret;
}

.visible .entry reverse_block(
    .param .u64 reverse_data
)
{
    .reg .b32   %r<13>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [reverse_data];
    cvta.to.global.u64  %rd2, %rd1;

    // i = blockIdx.x * blockDim.x + threadIdx.x; smem[tid] = data[i]
    mov.u32             %r1, %tid.x;
    mov.u32             %r2, %ntid.x;
    mov.u32             %r3, %ctaid.x;
    mad.lo.u32          %r4, %r3, %r2, %r1;
    mul.wide.u32        %rd3, %r4, 4;
    add.s64             %rd4, %rd2, %rd3;
    ld.global.u32       %r5, [%rd4];
    mov.u32             %r6, reverse_smem;
    shl.b32             %r7, %r1, 2;
    add.u32             %r8, %r6, %r7;
    st.shared.u32       [%r8], %r5;
    bar.sync            0;

    // data[i] = smem[blockDim.x - 1 - tid]
    sub.u32             %r9, %r2, %r1;
    sub.u32             %r10, %r9, 1;
    shl.b32             %r11, %r10, 2;
    add.u32             %r12, %r6, %r11;
    ld.shared.u32       %r5, [%r12];
    st.global.u32       [%rd4], %r5;
    ret;
}
"#;

/// Entry point of [`COMMAND_KERNELS`].
pub const SCALE_ADD_NAME: &str = "scale_add";
/// Entry point of [`COMMAND_KERNELS`].
pub const MIXED_ARGS_NAME: &str = "mixed_args";
/// Entry point of [`COMMAND_KERNELS`] (at most 64 threads per block).
pub const ADD_ONE_NAME: &str = "add_one";
/// Entry point of [`COMMAND_KERNELS`] (dynamic shared memory).
pub const REVERSE_BLOCK_NAME: &str = "reverse_block";
/// `add_one`'s `.maxntid`.
pub const ADD_ONE_MAX_THREADS: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_well_formed_ptx_text() {
        let ptx = COMMAND_KERNELS;
        assert!(ptx.contains(".version 7.0\n.target sm_75\n.address_size 64\n"));
        assert_eq!(ptx.matches('{').count(), ptx.matches('}').count());
        assert!(!ptx.contains('\0'));
        for name in [
            SCALE_ADD_NAME,
            MIXED_ARGS_NAME,
            ADD_ONE_NAME,
            REVERSE_BLOCK_NAME,
        ] {
            assert_eq!(
                ptx.matches(&format!(".visible .entry {name}(")).count(),
                1,
                "{name}"
            );
        }
        assert!(ptx.contains(&format!(".maxntid {ADD_ONE_MAX_THREADS}, 1, 1")));
        // Every label is defined once and branched to.
        for label in ["SCALE_ADD_DONE", "ADD_ONE_DONE"] {
            assert_eq!(ptx.matches(&format!("{label}:")).count(), 1);
            assert_eq!(ptx.matches(&format!("bra            {label};")).count(), 1);
        }
    }
}
