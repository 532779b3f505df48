//! The one error type of `cuhal-command`: every rejected command says what and by how much.

use std::fmt;

use crate::CommandBufferState;

/// Errors from allocating buffers, loading executables and recording or issuing commands.
///
/// Validation errors (ranges, alignment, dispatch shape, state) are returned before anything
/// reaches the driver: the command is not recorded and the command buffer stays usable.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed.
    Cuda(cuhal_sys::Error),
    /// `offset + length` does not fit in a `usize`.
    RangeOverflow {
        /// Offset of the range.
        offset: usize,
        /// Length of the range.
        length: usize,
    },
    /// A range reaches past the end of its buffer.
    OutOfBounds {
        /// Offset of the range within the buffer (or parent range).
        offset: usize,
        /// Length of the range.
        length: usize,
        /// Length of the buffer (or parent range).
        capacity: usize,
    },
    /// A size that must be non-zero was zero.
    ZeroSize {
        /// What was empty (`"buffer"`, `"fill"`, `"update"`, `"copy"`).
        what: &'static str,
    },
    /// The host had no memory for something whose size the caller gave (inline update bytes,
    /// kernel arguments, a binding layout): nothing was recorded.
    OutOfHostMemory {
        /// What needed the memory.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A host buffer is used by queued device work (a queue read writes into it until the read
    /// completes): reading it now would race with the device's writes. Wait for the work first.
    HostBufferBusy,
    /// A host copy through a buffer whose memory its owner released (a stream-ordered
    /// allocation after its `dealloca`): the memory may already serve another allocation.
    MemoryReleased,
    /// An offset, address or length is not a multiple of the alignment the operation needs.
    Misaligned {
        /// What is misaligned (`"fill offset"`, `"fill length"`, ...).
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The required alignment in bytes.
        alignment: usize,
    },
    /// A fill pattern of a size other than 1, 2 or 4 bytes.
    BadPattern {
        /// The pattern's length in bytes.
        length: usize,
    },
    /// The two sides of an update or copy differ in length.
    LengthMismatch {
        /// `"update"` or `"copy"`.
        what: &'static str,
        /// Length of the target range.
        target: usize,
        /// Length of the source (bytes or range).
        source: usize,
    },
    /// A copy whose source and target overlap (the driver's copies have undefined results then).
    OverlappingCopy {
        /// Device address of the source range.
        source: u64,
        /// Device address of the target range.
        target: u64,
        /// Bytes to copy.
        length: usize,
    },
    /// A buffer of another context was recorded into a command buffer.
    ContextMismatch,
    /// A deferred command buffer recorded only raw ranges and was created without a context,
    /// so it has none to replay in (see `DeferredCommandBuffer::with_context`).
    NoContext,
    /// A kernel argument was rejected by [`crate::KernelArgs`].
    BadKernelArgument {
        /// Why.
        reason: &'static str,
    },
    /// The arguments of a dispatch do not match the kernel's parameters (as the driver reports
    /// them): the launch would make the driver read past the arguments given.
    ArgumentMismatch {
        /// The kernel.
        function: String,
        /// The parameter (`None`: the count differs).
        index: Option<usize>,
        /// The kernel's parameter count, or that parameter's size in bytes.
        expected: usize,
        /// The argument count, or that argument's size in bytes.
        found: usize,
    },
    /// The driver cannot report a kernel's parameters (`cuFuncGetParamInfo` needs a CUDA 12.4
    /// driver) and the caller did not state them: a dispatch could make the driver read
    /// arguments that were never passed. State them with [`crate::Function::with_parameter_sizes`].
    UnknownParameters {
        /// The kernel.
        function: String,
    },
    /// A layout was stated for a kernel whose parameters neither the driver nor its module image
    /// declares, so nothing can check it: a wrong one would make the driver read past the
    /// arguments. Only [`crate::Function::with_parameter_sizes_unchecked`] (`unsafe`) takes it.
    UnverifiableParameters {
        /// The kernel.
        function: String,
    },
    /// The driver could not load a module; `log` is the JIT compiler's error log.
    ModuleLoad {
        /// The driver's error.
        source: cuhal_sys::Error,
        /// The JIT error log (empty when the driver wrote none).
        log: String,
    },
    /// A module image was rejected before reaching the driver.
    BadImage {
        /// Why.
        reason: &'static str,
    },
    /// No function of that name in the module.
    UnknownFunction {
        /// The name looked up.
        name: String,
        /// The driver's error.
        source: cuhal_sys::Error,
    },
    /// A dispatch asked for more threads per block than the function can run with.
    BlockTooLarge {
        /// The function.
        function: String,
        /// The block's dimensions.
        block: [u32; 3],
        /// The most threads per block the function allows.
        max_threads: u32,
    },
    /// A grid or block dimension is zero or above CUDA's limit for that axis.
    BadDimension {
        /// `"grid"` or `"block"`.
        what: &'static str,
        /// The dimensions given.
        dims: [u32; 3],
        /// The largest value each axis may take.
        max: [u32; 3],
    },
    /// A dispatch asked for more dynamic shared memory than the function is set up for.
    SharedMemoryTooLarge {
        /// The function.
        function: String,
        /// Bytes asked for.
        requested: u32,
        /// Bytes allowed (see `Function::set_max_dynamic_shared_memory`).
        max: u32,
    },
    /// A launch attribute the GPU or the loaded driver cannot honour.
    UnsupportedAttribute {
        /// The attribute (`"cluster"`, `"cooperative"`, `"programmatic"`, ...).
        attribute: &'static str,
        /// What is missing.
        reason: &'static str,
    },
    /// A thread-block cluster shape that cannot be launched.
    BadCluster {
        /// The function.
        function: String,
        /// The cluster asked for (zeros: none).
        cluster: [u32; 3],
        /// The grid.
        grid: [u32; 3],
        /// Why.
        reason: &'static str,
    },
    /// A cluster of more blocks than the function may use.
    ClusterTooLarge {
        /// The function.
        function: String,
        /// The cluster asked for.
        cluster: [u32; 3],
        /// Its blocks.
        blocks: u64,
        /// The most blocks a cluster of this function may have (8 portable, 16 non-portable).
        max: u32,
    },
    /// A cooperative grid larger than the device holds at once.
    CooperativeGridTooLarge {
        /// The function.
        function: String,
        /// Blocks in the grid.
        blocks: u64,
        /// Blocks that can be resident at once (occupancy times multiprocessors).
        max: u64,
    },
    /// A programmatic dispatch without the one dispatch it may depend on.
    NoProgrammaticPredecessor {
        /// What is wrong.
        reason: &'static str,
    },
    /// A priority outside the context's stream priority range.
    BadPriority {
        /// The priority asked for.
        priority: i32,
        /// The lowest priority (numerically largest).
        least: i32,
        /// The highest priority (numerically smallest).
        greatest: i32,
    },
    /// No indirect-dispatch helper cubin for the device's architecture (see
    /// `INDIRECT_HELPER_DIR_ENV`).
    NoIndirectHelper {
        /// The device's architecture, as `sm_XY`.
        architecture: String,
    },
    /// The counts range of an indirect dispatch is unusable.
    IndirectCounts {
        /// Why.
        reason: &'static str,
    },
    /// An indirect dispatch read a workgroup count over the device's grid limits (or not a
    /// multiple of its cluster): the dispatch did not run and its submission failed.
    IndirectCountOutOfRange {
        /// The indirect dispatch's index among its command buffer's indirect dispatches.
        dispatch: u32,
        /// The count it read (x, y, z).
        count: [u32; 3],
        /// The device's grid limits.
        max: [u32; 3],
        /// The dispatch's cluster shape (1s without clusters).
        cluster: [u32; 3],
    },
    /// The operation is not valid in the command buffer's current state.
    InvalidState {
        /// The operation attempted.
        operation: &'static str,
        /// The state the command buffer was in.
        state: CommandBufferState,
    },
    /// `end_debug_group` without an open group.
    NoOpenDebugGroup,
    /// `end()` with debug groups still open.
    UnclosedDebugGroups {
        /// How many are open.
        open: u32,
    },
    /// Stream work cannot be captured into a graph: the driver lacks
    /// `cuStreamBeginCaptureToGraph` (CUDA 12.3). Deferred command buffers run it instead.
    CaptureUnsupported {
        /// The driver's CUDA version (`cuDriverGetVersion`, e.g. 12020).
        driver_version: i32,
    },
    /// Stream work could not be captured into a graph command buffer: it did something capture
    /// forbids (synchronized, waited on work outside the capture, ...) or failed. Nothing of it
    /// stays in the graph and the command buffer is still recording.
    Capture {
        /// The driver's complaint: the capture call that failed (usually `cuStreamEndCapture`
        /// with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`), if one did.
        cuda: Option<cuhal_sys::Error>,
        /// What the closure returned (often the forbidden call's own error, e.g.
        /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), if it failed.
        work: Option<crate::WorkError>,
    },
    /// A stream-work closure failed when a deferred command buffer replayed it or a stream
    /// command buffer ran it.
    StreamWork(crate::WorkError),
    /// A slot range or a binding table was refused.
    Binding(crate::BindingError),
}

impl Error {
    /// The underlying driver error, if this is one.
    pub fn cuda(&self) -> Option<&cuhal_sys::Error> {
        match self {
            Error::Cuda(e) | Error::ModuleLoad { source: e, .. } => Some(e),
            Error::UnknownFunction { source, .. } => Some(source),
            Error::Capture { cuda: Some(e), .. } => Some(e),
            _ => None,
        }
    }

    /// Whether this error lost the context (a sticky CUDA error).
    pub fn is_sticky(&self) -> bool {
        self.cuda().is_some_and(cuhal_sys::Error::is_sticky)
    }
}

impl From<cuhal_sys::Error> for Error {
    fn from(e: cuhal_sys::Error) -> Self {
        match e {
            cuhal_sys::Error::ModuleLoad { source, log } => Error::ModuleLoad {
                source: *source,
                log,
            },
            cuhal_sys::Error::BadImage { reason } => Error::BadImage { reason },
            other => Error::Cuda(other),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuda(e) => write!(f, "{e}"),
            Error::RangeOverflow { offset, length } => {
                write!(f, "range offset {offset} + length {length} overflows")
            }
            Error::OutOfBounds {
                offset,
                length,
                capacity,
            } => write!(
                f,
                "range [{offset}, {offset}+{length}) is out of bounds of a {capacity}-byte buffer"
            ),
            Error::ZeroSize { what } => write!(f, "{what} of zero bytes"),
            Error::MemoryReleased => write!(
                f,
                "the buffer's memory was released by its owner (a dealloca): the handle may no \
                 longer reach it"
            ),
            Error::OutOfHostMemory { what, bytes } => {
                write!(f, "the host has no memory for the {what} ({bytes} bytes)")
            }
            Error::HostBufferBusy => write!(
                f,
                "the host buffer is used by queued device work: wait for that work (the signal \
                 of the read into it) before reading it on the host"
            ),
            Error::Misaligned {
                what,
                value,
                alignment,
            } => write!(f, "{what} {value} is not a multiple of {alignment}"),
            Error::UnsupportedAttribute { attribute, reason } => {
                write!(f, "launch attribute {attribute} is not supported: {reason}")
            }
            Error::BadCluster {
                function,
                cluster,
                grid,
                reason,
            } => write!(
                f,
                "cluster {cluster:?} for grid {grid:?} of kernel {function}: {reason}"
            ),
            Error::ClusterTooLarge {
                function,
                cluster,
                blocks,
                max,
            } => write!(
                f,
                "cluster {cluster:?} of kernel {function} has {blocks} blocks; at most {max} allowed"
            ),
            Error::CooperativeGridTooLarge {
                function,
                blocks,
                max,
            } => write!(
                f,
                "cooperative grid of {blocks} blocks for kernel {function}; the device holds at most {max} at once"
            ),
            Error::NoProgrammaticPredecessor { reason } => {
                write!(f, "programmatic dispatch: {reason}")
            }
            Error::BadPriority {
                priority,
                least,
                greatest,
            } => write!(
                f,
                "priority {priority} is outside the context's range {greatest} (highest) to {least} (lowest)"
            ),
            Error::BadPattern { length } => {
                write!(f, "fill pattern of {length} bytes (must be 1, 2 or 4)")
            }
            Error::LengthMismatch {
                what,
                target,
                source,
            } => write!(
                f,
                "{what} source of {source} bytes does not match its {target}-byte target range"
            ),
            Error::OverlappingCopy {
                source,
                target,
                length,
            } => write!(
                f,
                "copy of {length} bytes from {source:#x} to {target:#x}: source and target overlap"
            ),
            Error::ContextMismatch => {
                write!(
                    f,
                    "buffer belongs to another context than the command buffer"
                )
            }
            Error::NoContext => write!(
                f,
                "the deferred command buffer has no context: it recorded only raw ranges; \
                 create it with DeferredCommandBuffer::with_context"
            ),
            Error::BadKernelArgument { reason } => write!(f, "bad kernel argument: {reason}"),
            Error::ArgumentMismatch {
                function,
                index: None,
                expected,
                found,
            } => write!(
                f,
                "kernel `{function}` takes {expected} parameters; the dispatch gives {found} arguments"
            ),
            Error::ArgumentMismatch {
                function,
                index: Some(index),
                expected,
                found,
            } => write!(
                f,
                "kernel `{function}`: parameter {index} is {expected} bytes; the argument is {found}"
            ),
            Error::UnknownParameters { function } => write!(
                f,
                "kernel `{function}`: the driver cannot report its parameters (it needs CUDA \
                 12.4 for that); state them with Function::with_parameter_sizes before \
                 dispatching it"
            ),
            Error::UnverifiableParameters { function } => write!(
                f,
                "kernel `{function}`: neither the driver nor its module image says what \
                 parameters it takes, so a stated layout cannot be checked; state it with the \
                 unsafe Function::with_parameter_sizes_unchecked"
            ),
            Error::ModuleLoad { source, log } => {
                write!(f, "module load failed: {source}")?;
                if !log.is_empty() {
                    write!(f, "\nJIT log:\n{log}")?;
                }
                Ok(())
            }
            Error::BadImage { reason } => write!(f, "bad module image: {reason}"),
            Error::UnknownFunction { name, source } => {
                write!(f, "no function named {name:?} in the module ({source})")
            }
            Error::BlockTooLarge {
                function,
                block,
                max_threads,
            } => write!(
                f,
                "block {}x{}x{} = {} threads exceeds the {max_threads} threads per block \
                 that {function} allows",
                block[0],
                block[1],
                block[2],
                u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2])
            ),
            Error::BadDimension { what, dims, max } => write!(
                f,
                "{what} {}x{}x{}: each axis must be between 1 and {}x{}x{}",
                dims[0], dims[1], dims[2], max[0], max[1], max[2]
            ),
            Error::SharedMemoryTooLarge {
                function,
                requested,
                max,
            } => write!(
                f,
                "{requested} bytes of dynamic shared memory exceed the {max} that {function} \
                 may use"
            ),
            Error::NoIndirectHelper { architecture } => write!(
                f,
                "no indirect-dispatch helper cubin for {architecture} (build one with \
                 crates/command/kernels/build.sh and point CUHAL_INDIRECT_HELPER_DIR at it)"
            ),
            Error::IndirectCounts { reason } => write!(f, "indirect dispatch counts: {reason}"),
            Error::IndirectCountOutOfRange {
                dispatch,
                count,
                max,
                cluster,
            } => write!(
                f,
                "indirect dispatch {dispatch} read workgroup count {count:?}: over the device's \
                 grid limits {max:?} or not a multiple of its cluster {cluster:?}; it did not run"
            ),
            Error::InvalidState { operation, state } => {
                write!(f, "cannot {operation}: the command buffer is {state}")
            }
            Error::NoOpenDebugGroup => write!(f, "end_debug_group without an open debug group"),
            Error::UnclosedDebugGroups { open } => {
                write!(f, "end() with {open} debug group(s) still open")
            }
            Error::CaptureUnsupported { driver_version } => write!(
                f,
                "capturing stream work into a graph needs cuStreamBeginCaptureToGraph (CUDA 12.3); \
                 the driver supports CUDA {}: use a deferred command buffer",
                cuhal_sys::format_cuda_version(*driver_version)
            ),
            Error::Capture { cuda, work } => {
                write!(f, "stream work could not be captured into the graph")?;
                if let Some(cuda) = cuda {
                    write!(f, ": {cuda}")?;
                }
                if let Some(work) = work {
                    write!(f, "; the work reported: {work}")?;
                }
                Ok(())
            }
            Error::StreamWork(work) => write!(f, "stream work failed: {work}"),
            Error::Binding(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::StreamWork(work)
            | Error::Capture {
                cuda: None,
                work: Some(work),
            } => Some(&*work.0),
            _ => self.cuda().map(|e| e as _),
        }
    }
}

/// The error for a host allocation of `bytes` that failed for `what`.
pub(crate) fn out_of_host_memory(what: &'static str, bytes: usize) -> Error {
    Error::OutOfHostMemory { what, bytes }
}

impl From<crate::BindingError> for Error {
    fn from(e: crate::BindingError) -> Self {
        Error::Binding(e)
    }
}
