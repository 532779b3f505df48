//! Indirect dispatch: a dispatch whose workgroup count is read from device memory when it runs.
//!
//! Every kind builds the same graph fragment: a helper kernel node (`cuhal_indirect_apply`, from
//! `kernels/indirect.cu`, which needs the CUDA device runtime and so ships as cubins) followed by
//! the dispatch as a *device-updatable* kernel node (CUDA 12.4). When the fragment runs, the
//! helper reads the three counts and, on the device, sets the dispatch node's grid, or disables
//! it for a zero count, or disables it and records a failure for a count over the device's grid
//! limits (or not a multiple of the dispatch's cluster). No host round trip: the graph kind adds
//! the fragment to its own graph; the stream and deferred kinds instantiate it as a small graph
//! of its own and launch it on their stream (`cuGraphLaunch`) in command order.
//!
//! Failures land in host-mapped memory owned by the command buffer (the status record, whose
//! address the helper nodes carry). Each submission of a graph or deferred command buffer then
//! copies the record into a slot of its own and clears it, in stream order right after its work
//! ([`Indirect::submit`]); submissions of one command buffer on different streams are chained by
//! an event, so no other submission's helper writes the record between one submission's work
//! and its copy. The queue reads the submission's slot when the submission completes
//! ([`crate::CommandBuffer::check_completed_on`]) and fails that submission alone with
//! [`Error::IndirectCountOutOfRange`]: not an earlier one, a later one, or one on another queue.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuhal_sys::{
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, CU_EVENT_DISABLE_TIMING,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, CU_MEMHOSTALLOC_DEVICEMAP,
    CU_MEMHOSTALLOC_PORTABLE, CU_STREAM_NON_BLOCKING, CUdeviceptr, CUgraph, CUgraphExec,
    CUgraphNode, CUlaunchAttributeValue, CUstream, DriverApi, Event, PrimaryContext, Stream, cu,
};

use crate::launch::{add_kernel_node, set_kernel_node_attributes};
use crate::{Dispatch, Error, Executable, Function, KernelArgs};

/// The helper kernel's name in its cubins.
pub const INDIRECT_HELPER: &str = "cuhal_indirect_apply";

/// The key of the helper module among the context's resident modules.
const HELPER_MODULE: &str = "cuhal.helpers";

/// A directory holding `indirect_sm_XY.cubin` files, looked at before the built-in cubins (for
/// architectures this build of cuhal has none for; `kernels/build.sh` makes them).
pub const INDIRECT_HELPER_DIR_ENV: &str = "CUHAL_INDIRECT_HELPER_DIR";

/// Bytes of a workgroup count in device memory: three `u32`s (x, y, z).
pub const INDIRECT_COUNT_BYTES: usize = 12;

/// The helper cubins built into cuhal (`kernels/build.sh`, CUDA 13.0): (architecture as
/// major * 10 + minor, image).
pub(crate) const BUILT_IN: &[(u32, &[u8])] = &[
    (80, include_bytes!("../kernels/indirect_sm_80.cubin")),
    (86, include_bytes!("../kernels/indirect_sm_86.cubin")),
    (89, include_bytes!("../kernels/indirect_sm_89.cubin")),
    (90, include_bytes!("../kernels/indirect_sm_90.cubin")),
    (100, include_bytes!("../kernels/indirect_sm_100.cubin")),
    (120, include_bytes!("../kernels/indirect_sm_120.cubin")),
];

/// The driver version that has device-updatable kernel nodes.
pub(crate) const DEVICE_UPDATABLE_SINCE: i32 = 12040;

/// The helper image for compute capability `cc`: an exact match, else the newest of the same
/// major version and a lower minor (cubins run on later minors of their major).
fn helper_image(cc: (i32, i32)) -> Result<Vec<u8>, Error> {
    let arch = (cc.0 * 10 + cc.1).max(0) as u32;
    let candidates = || (cc.0 * 10..=cc.0 * 10 + cc.1).rev().map(|a| a as u32);
    if let Some(dir) = std::env::var_os(INDIRECT_HELPER_DIR_ENV).filter(|d| !d.is_empty()) {
        for a in candidates() {
            let path = PathBuf::from(&dir).join(format!("indirect_sm_{a}.cubin"));
            if let Ok(bytes) = std::fs::read(&path) {
                return Ok(bytes);
            }
        }
    }
    built_in(cc)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| Error::NoIndirectHelper {
            architecture: format!("sm_{arch}"),
        })
}

/// The built-in cubin for compute capability `cc` (same rule as [`helper_image`]).
fn built_in(cc: (i32, i32)) -> Option<&'static [u8]> {
    (cc.0 * 10..=cc.0 * 10 + cc.1).rev().find_map(|a| {
        BUILT_IN
            .iter()
            .find(|(b, _)| i64::from(*b) == i64::from(a))
            .map(|(_, image)| *image)
    })
}

/// The helper kernel `name` (`cuhal_indirect_apply` or `cuhal_bindings_apply`) from the helper
/// module of `context`'s device, loaded once per context: a module per command buffer would make
/// recording and dropping wait for the context's running work (module load and unload do).
pub(crate) fn helper_function(
    context: &Arc<PrimaryContext>,
    name: &str,
) -> Result<Function, Error> {
    let cc = (
        context.attribute(cuhal_sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        context.attribute(cuhal_sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let image = helper_image(cc)?;
    Executable::load_cubin_resident(context, HELPER_MODULE, &image)?.function(name)
}

/// `u32`s of pinned host memory mapped into the device: the failure record (words 0 to 3, which
/// the helper writes: index + 1 of the first failing dispatch, then its count) and four zeros
/// (words 4 to 7, the source that clears it); or a chunk of submission slots.
struct Status {
    context: Arc<PrimaryContext>,
    host: *mut u32,
    device: CUdeviceptr,
    words: usize,
}

/// Bytes of a failure record: four `u32`s.
const RECORD_BYTES: usize = 16;

/// Submission slots per chunk of pinned memory (a chunk is added when every slot is taken by a
/// submission not checked yet).
const SLOTS_PER_CHUNK: u32 = 64;

impl Status {
    fn new(context: &Arc<PrimaryContext>, words: usize) -> Result<Self, Error> {
        let api = context.api();
        let _bound = context.enter()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; `words` u32s of mapped, portable pinned memory.
        unsafe {
            cu!(
                api,
                cuMemHostAlloc(
                    &mut host,
                    words * 4,
                    CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE
                )
            )
        }?;
        let mut this = Self {
            context: Arc::clone(context),
            host: host.cast(),
            device: 0,
            words,
        };
        // SAFETY: `words` writable u32s just allocated; nothing reads them yet.
        unsafe { std::ptr::write_bytes(this.host, 0, words) };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `host` is mapped pinned memory of this context; flags must be 0.
        unsafe { cu!(api, cuMemHostGetDevicePointer(&mut device, host, 0)) }?;
        this.device = device;
        Ok(this)
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.words, "word {i} of {}", self.words);
        // SAFETY: the allocation holds `words` aligned u32s for as long as `self` lives (`i` is
        // checked above); the device writes them only with plain stores, atomics and copies,
        // which an AtomicU32 view tolerates.
        unsafe { AtomicU32::from_ptr(self.host.add(i)) }
    }

    /// The failure record at word `first` (0 for none), cleared for the record's next use.
    fn take_record(&self, first: usize) -> (u32, [u32; 3]) {
        let failed = self.word(first).load(Ordering::Acquire);
        let count = [1, 2, 3].map(|i| self.word(first + i).load(Ordering::Acquire));
        self.word(first).store(0, Ordering::Release);
        (failed, count)
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: allocated in `new`, freed once; no work that writes it is in flight (the
            // command buffer that owns it outlives its submissions).
            let _ = unsafe { cu!(self.context.api(), cuMemFreeHost(self.host.cast())) };
        }
    }
}

/// The indirect-dispatch state of one command buffer: the helper kernel, the failure record and
/// what each indirect dispatch was checked against, and where each submission's outcome went.
pub(crate) struct Indirect {
    helper: Function,
    status: Status,
    max_grid: [u32; 3],
    /// The cluster shape of each indirect dispatch (1s without clusters), by index.
    clusters: Vec<[u32; 3]>,
    submissions: Mutex<Submissions>,
}

/// The submissions of one command buffer whose outcome was not read yet ([`Indirect::submit`]).
#[derive(Default)]
struct Submissions {
    /// Recorded after the latest submission's copy and clear, with that submission's stream
    /// (as an address): a submission on another stream waits for it first.
    chain: Option<(Event, usize)>,
    /// Submissions not checked yet, oldest first: their stream (as an address) and slot.
    in_flight: VecDeque<(usize, u32)>,
    /// Slots no unchecked submission holds.
    free: Vec<u32>,
    /// The slots' memory, [`SLOTS_PER_CHUNK`] records a chunk.
    chunks: Vec<Status>,
    /// A submission was issued through [`Indirect::submit`] (graph and deferred kinds); a
    /// stream command buffer, whose work ran as it was recorded, has its record read directly.
    submitted: bool,
}

// SAFETY: the raw status pointers are only read and written through atomics (and by the device);
// the rest is Send.
unsafe impl Send for Indirect {}
// SAFETY: as above; the submissions are behind a mutex.
unsafe impl Sync for Indirect {}

impl Indirect {
    /// Loads the helper for `context`'s device and allocates the failure record. A driver
    /// without device-updatable kernel nodes, or a device with no helper cubin, is an error.
    pub(crate) fn new(context: &Arc<PrimaryContext>) -> Result<Self, Error> {
        let api = context.api();
        if api.driver_version() < DEVICE_UPDATABLE_SINCE
            || api.cuGraphKernelNodeSetAttribute.is_none()
            || api.cuGraphKernelNodeGetAttribute.is_none()
        {
            return Err(Error::UnsupportedAttribute {
                attribute: "indirect dispatch",
                reason: "device-updatable graph kernel nodes need a CUDA 12.4 driver",
            });
        }
        let helper = helper_function(context, INDIRECT_HELPER)?;
        let max = |a| context.attribute(a).map(|v| v.max(1) as u32);
        Ok(Self {
            helper,
            status: Status::new(context, 8)?,
            max_grid: [
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            clusters: Vec::new(),
            submissions: Mutex::default(),
        })
    }

    /// Registers the next indirect dispatch (with its cluster shape) and returns its index.
    pub(crate) fn push(&mut self, cluster: [u32; 3]) -> Result<u32, Error> {
        let index = u32::try_from(self.clusters.len())
            .ok()
            .filter(|&i| i < u32::MAX - 1)
            .ok_or(Error::IndirectCounts {
                reason: "too many indirect dispatches in one command buffer",
            })?;
        self.clusters.push(cluster);
        Ok(index)
    }

    fn submissions(&self) -> MutexGuard<'_, Submissions> {
        // A poisoned lock only means a panic between two steps that each leave it consistent.
        self.submissions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Issues one submission's `work` on `stream` so that its outcome can be read alone: after
    /// the latest submission of this command buffer on another stream (an event wait; the
    /// stream's own order covers one on the same stream), then the work, then a copy of the
    /// failure record into a slot of this submission's and a clear of the record, all before
    /// the next submission of this command buffer starts. The lock makes the host order of
    /// submissions their GPU order. [`Indirect::check_on`] reads the slot.
    ///
    /// # Safety
    /// `stream` is a live stream of the command buffer's context, which is current; `work`
    /// enqueues the command buffer's work on it.
    pub(crate) unsafe fn submit(
        &self,
        stream: CUstream,
        work: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut submissions = self.submissions();
        // SAFETY: forwarded contract.
        unsafe { self.wait_for_previous(&submissions, stream) }?;
        work()?;
        // SAFETY: forwarded contract.
        unsafe { self.take_outcome(&mut submissions, stream) }
    }

    /// The first part of [`Indirect::submit`], for a replay issued in several parts (before
    /// the first).
    ///
    /// # Safety
    /// As [`Indirect::submit`].
    pub(crate) unsafe fn begin_parts(&self, stream: CUstream) -> Result<(), Error> {
        let submissions = self.submissions();
        // SAFETY: forwarded contract.
        unsafe { self.wait_for_previous(&submissions, stream) }
    }

    /// The last part of [`Indirect::submit`], for a replay issued in several parts (after the
    /// last). Parts of two submissions that interleave on the host may see each other's failure.
    ///
    /// # Safety
    /// As [`Indirect::submit`].
    pub(crate) unsafe fn end_parts(&self, stream: CUstream) -> Result<(), Error> {
        let mut submissions = self.submissions();
        // SAFETY: forwarded contract.
        unsafe { self.take_outcome(&mut submissions, stream) }
    }

    /// # Safety
    /// As [`Indirect::submit`].
    unsafe fn wait_for_previous(
        &self,
        submissions: &Submissions,
        stream: CUstream,
    ) -> Result<(), Error> {
        if let Some((event, last)) = &submissions.chain
            && *last != stream.addr()
        {
            // SAFETY: both are live objects of the context (the caller's contract for the
            // stream; the event lives as long as `self`).
            unsafe {
                cu!(
                    self.status.context.api(),
                    cuStreamWaitEvent(stream, event.raw(), 0)
                )
            }?;
        }
        Ok(())
    }

    /// # Safety
    /// As [`Indirect::submit`].
    unsafe fn take_outcome(
        &self,
        submissions: &mut Submissions,
        stream: CUstream,
    ) -> Result<(), Error> {
        let context = &self.status.context;
        let api = context.api();
        let slot = match submissions.free.pop() {
            Some(slot) => slot,
            None => {
                // Every slot is held by a submission not checked yet: one more chunk.
                let chunk = u32::try_from(submissions.chunks.len())
                    .ok()
                    .and_then(|c| c.checked_mul(SLOTS_PER_CHUNK))
                    .ok_or(Error::IndirectCounts {
                        reason: "too many submissions of one command buffer in flight",
                    })?;
                submissions
                    .chunks
                    .push(Status::new(context, SLOTS_PER_CHUNK as usize * 4)?);
                submissions
                    .free
                    .extend((chunk + 1..chunk + SLOTS_PER_CHUNK).rev());
                chunk
            }
        };
        let chunk = &submissions.chunks[(slot / SLOTS_PER_CHUNK) as usize];
        let record = chunk.device + u64::from(slot % SLOTS_PER_CHUNK) * RECORD_BYTES as u64;
        let copied = (|| {
            // Mapped pinned memory on both ends: unified addressing makes these copies in stream
            // order, after the helpers of this submission's work wrote the record.
            // SAFETY: both ranges are 16 bytes of live mapped memory of this context (the slot's
            // chunk and the status record, owned by `self`); the caller's stream is live.
            unsafe {
                cu!(
                    api,
                    cuMemcpyAsync(record, self.status.device, RECORD_BYTES, stream)
                )
            }?;
            // SAFETY: as above; words 4 to 7 of the status block are zeros, never written.
            unsafe {
                cu!(
                    api,
                    cuMemcpyAsync(
                        self.status.device,
                        self.status.device + RECORD_BYTES as u64,
                        RECORD_BYTES,
                        stream
                    )
                )
            }?;
            if submissions.chain.is_none() {
                submissions.chain = Some((Event::new(context, CU_EVENT_DISABLE_TIMING)?, 0));
            }
            if let Some((event, last)) = submissions.chain.as_mut() {
                // SAFETY: the caller's stream is live.
                unsafe { event.record_raw(stream) }?;
                *last = stream.addr();
            }
            Ok::<(), Error>(())
        })();
        if let Err(e) = copied {
            submissions.free.push(slot);
            return Err(e);
        }
        submissions.in_flight.push_back((stream.addr(), slot));
        submissions.submitted = true;
        Ok(())
    }

    /// Reports an indirect dispatch whose count was out of range in the oldest submission on
    /// `stream` not checked yet (`None`: on any stream), once. A stream command buffer (whose
    /// work ran as it was recorded) reports what its recording found since the last check.
    pub(crate) fn check_on(&self, stream: Option<CUstream>) -> Result<(), Error> {
        let mut submissions = self.submissions();
        let (failed, count) = if submissions.submitted {
            let position = match stream {
                Some(stream) => submissions
                    .in_flight
                    .iter()
                    .position(|&(s, _)| s == stream.addr()),
                None => (!submissions.in_flight.is_empty()).then_some(0),
            };
            let Some((_, slot)) = position.and_then(|p| submissions.in_flight.remove(p)) else {
                return Ok(());
            };
            let chunk = &submissions.chunks[(slot / SLOTS_PER_CHUNK) as usize];
            let outcome = chunk.take_record((slot % SLOTS_PER_CHUNK) as usize * 4);
            submissions.free.push(slot);
            outcome
        } else {
            self.status.take_record(0)
        };
        drop(submissions);
        if failed == 0 {
            return Ok(());
        }
        let dispatch = failed - 1;
        Err(Error::IndirectCountOutOfRange {
            dispatch,
            count,
            max: self.max_grid,
            cluster: self
                .clusters
                .get(dispatch as usize)
                .copied()
                .unwrap_or([1; 3]),
        })
    }
}

/// What the fragment of one indirect dispatch needs.
pub(crate) struct IndirectLaunch<'a> {
    /// The dispatch, with a placeholder grid (its cluster shape, or 1s) and checked attributes.
    pub(crate) dispatch: &'a Dispatch<'a>,
    /// Device address of the three counts.
    pub(crate) counts: CUdeviceptr,
    /// The dispatch's index in its command buffer's [`Indirect`].
    pub(crate) index: u32,
}

/// Adds the fragment (helper node after `deps`, then the device-updatable dispatch node) to
/// `graph` and returns the dispatch node, the fragment's tail. The context must be current.
pub(crate) fn add_fragment(
    api: &DriverApi,
    graph: CUgraph,
    deps: &[CUgraphNode],
    launch: &IndirectLaunch<'_>,
    indirect: &Indirect,
) -> Result<CUgraphNode, Error> {
    let dispatch = launch.dispatch;
    let target = add_kernel_node(
        api,
        graph,
        &[],
        dispatch.function,
        dispatch.grid,
        dispatch.block,
        dispatch.shared_memory_bytes,
        dispatch.args,
    )?;
    set_kernel_node_attributes(api, target, &dispatch.attributes)?;
    if api.cuGraphKernelNodeSetAttribute.is_none() || api.cuGraphKernelNodeGetAttribute.is_none() {
        return Err(Error::UnsupportedAttribute {
            attribute: "indirect dispatch",
            reason: "device-updatable graph kernel nodes need a CUDA 12.4 driver",
        });
    }
    let updatable = CUlaunchAttributeValue::int(1);
    // SAFETY: `target` is a kernel node just added to `graph`; the value is a live local.
    unsafe {
        cu!(
            optional: api,
            cuGraphKernelNodeSetAttribute(
                target,
                CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                &updatable,
            )
        )
    }?;
    let mut value = CUlaunchAttributeValue::zeroed();
    // SAFETY: as above; `value` is a valid out-pointer.
    unsafe {
        cu!(
            optional: api,
            cuGraphKernelNodeGetAttribute(
                target,
                CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                &mut value,
            )
        )
    }?;
    let device_node = value.device_node().addr() as u64;
    let cluster = indirect.clusters[launch.index as usize];
    let args = KernelArgs::new()
        .with(launch.counts)
        .with(device_node)
        .with(indirect.max_grid[0])
        .with(indirect.max_grid[1])
        .with(indirect.max_grid[2])
        .with(cluster[0])
        .with(cluster[1])
        .with(cluster[2])
        .with(indirect.status.device)
        .with(launch.index);
    let helper = add_kernel_node(api, graph, deps, &indirect.helper, [1; 3], [1; 3], 0, &args)?;
    // SAFETY: both are nodes of `graph`; the one-element arrays are locals.
    unsafe { cu!(api, cuGraphAddDependencies(graph, &helper, &target, 1)) }?;
    Ok(target)
}

/// Uploads `exec` (a graph whose device-updatable nodes are updated from inside it must be
/// uploaded before its first launch) on a private stream, and waits for the upload.
pub(crate) fn upload(context: &Arc<PrimaryContext>, exec: CUgraphExec) -> Result<(), Error> {
    let stream = Stream::new(context, CU_STREAM_NON_BLOCKING)?;
    // SAFETY: `exec` is a live executable graph of this context; `stream` is live.
    unsafe { cu!(context.api(), cuGraphUpload(exec, stream.raw())) }?;
    stream.synchronize()?;
    Ok(())
}

/// One indirect dispatch as a graph of its own (stream and deferred kinds), launched on their
/// stream in command order.
pub(crate) struct IndirectGraph {
    context: Arc<PrimaryContext>,
    graph: CUgraph,
    exec: CUgraphExec,
}

// SAFETY: the handles are only used by `launch` (the driver serializes launches of one
// executable) and `drop`.
unsafe impl Send for IndirectGraph {}
// SAFETY: as above.
unsafe impl Sync for IndirectGraph {}

impl IndirectGraph {
    /// Builds, instantiates and uploads the fragment of `launch`.
    pub(crate) fn new(
        context: &Arc<PrimaryContext>,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
    ) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let api = context.api();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        unsafe { cu!(api, cuGraphCreate(&mut graph, 0)) }?;
        let mut this = Self {
            context: Arc::clone(context),
            graph,
            exec: std::ptr::null_mut(),
        };
        add_fragment(api, graph, &[], launch, indirect)?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // A dispatch priority is a node priority here.
        let flags = if launch.dispatch.attributes.priority.is_some() {
            cuhal_sys::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        } else {
            0
        };
        // SAFETY: `exec` is a valid out-pointer; the graph is complete.
        unsafe { cu!(api, cuGraphInstantiateWithFlags(&mut exec, graph, flags)) }?;
        this.exec = exec;
        upload(context, exec)?;
        Ok(this)
    }

    /// `cuGraphLaunch` on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of the context, which is current; the owner outlives the work.
    pub(crate) unsafe fn launch(&self, stream: CUstream) -> Result<(), Error> {
        let api = self.context.api();
        // SAFETY: `exec` is live until drop; the caller guarantees the stream.
        unsafe { cu!(api, cuGraphLaunch(self.exec, stream)) }?;
        Ok(())
    }
}

impl Drop for IndirectGraph {
    fn drop(&mut self) {
        let Ok(_bound) = self.context.enter() else {
            return;
        };
        let api = self.context.api();
        if !self.exec.is_null() {
            // SAFETY: instantiated here, destroyed once; a launch in flight completes first.
            let _ = unsafe { cu!(api, cuGraphExecDestroy(self.exec)) };
        }
        // SAFETY: created here, destroyed once.
        let _ = unsafe { cu!(api, cuGraphDestroy(self.graph)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_cubins_are_elf_images_of_the_helper() {
        for (arch, image) in BUILT_IN {
            assert_eq!(&image[..4], b"\x7fELF", "sm_{arch}");
            let name = INDIRECT_HELPER.as_bytes();
            assert!(
                image.windows(name.len()).any(|w| w == name),
                "sm_{arch} has no {INDIRECT_HELPER}"
            );
        }
        // sm_87 (Orin) runs the sm_86 cubin; sm_90 its own.
        assert_eq!(helper_image_built_in((8, 7)), Some(BUILT_IN[1].1));
        assert_eq!(helper_image_built_in((9, 0)), Some(BUILT_IN[3].1));
        assert_eq!(helper_image_built_in((7, 5)), None);
    }

    fn helper_image_built_in(cc: (i32, i32)) -> Option<&'static [u8]> {
        built_in(cc)
    }

    #[test]
    fn without_a_cubin_the_error_names_the_architecture() {
        // No built-in cubin for a compute capability no GPU has.
        assert_eq!(
            helper_image((1, 3)),
            Err(Error::NoIndirectHelper {
                architecture: "sm_13".into()
            })
        );
        let text = helper_image((1, 3)).unwrap_err().to_string();
        assert!(text.contains("sm_13"), "{text}");
    }
}
