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
//! Failures land in host-mapped memory owned by the command buffer; the queue reads it when the
//! submission completes ([`crate::CommandBuffer::check_completed`]) and fails the submission with
//! [`Error::IndirectCountOutOfRange`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cuhal_sys::{
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, CU_STREAM_NON_BLOCKING, CUdeviceptr, CUgraph, CUgraphExec,
    CUgraphNode, CUstream, DriverApi, MappedHostMemory, PrimaryContext, Stream, cu,
};

use crate::dispatch::add_dispatch_node;
use crate::launch::{add_kernel_node, make_device_updatable};
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
    cuhal_sys::cubin_from_dir_or(cc, INDIRECT_HELPER_DIR_ENV, "indirect", BUILT_IN)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| Error::NoIndirectHelper {
            architecture: format!("sm_{}", (cc.0 * 10 + cc.1).max(0)),
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

/// The indirect-dispatch state of one command buffer: the helper kernel, the failure record and
/// what each indirect dispatch was checked against.
pub(crate) struct Indirect {
    helper: Function,
    /// Four `u32`s of mapped host memory: the failure record the helper writes.
    status: MappedHostMemory,
    max_grid: [u32; 3],
    /// The cluster shape of each indirect dispatch (1s without clusters), by index.
    clusters: Vec<[u32; 3]>,
}

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
            status: MappedHostMemory::new(context, 16)?,
            max_grid: [
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                max(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            clusters: Vec::new(),
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

    /// Reports (once) an indirect dispatch whose count was out of range since the last check.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let failed = self.status.word(0).load(Ordering::Acquire);
        if failed == 0 {
            return Ok(());
        }
        let count = [1, 2, 3].map(|i| self.status.word(i).load(Ordering::Acquire));
        // Cleared for the next submission; a failure of a later submission that completed in the
        // same batch is reported with this one.
        self.status.word(0).store(0, Ordering::Release);
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
    let target = add_dispatch_node(api, graph, &[], dispatch)?;
    if api.cuGraphKernelNodeSetAttribute.is_none() || api.cuGraphKernelNodeGetAttribute.is_none() {
        return Err(Error::UnsupportedAttribute {
            attribute: "indirect dispatch",
            reason: "device-updatable graph kernel nodes need a CUDA 12.4 driver",
        });
    }
    // SAFETY: `target` is a kernel node just added to `graph`.
    let device_node = unsafe { make_device_updatable(api, target) }?;
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
        .with(indirect.status.device_ptr())
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
        cuhal_sys::cubin_for(cc, BUILT_IN)
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
