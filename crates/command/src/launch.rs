//! Launch attributes of a dispatch: thread-block clusters, cooperative launch, programmatic
//! dependent launch and priority, and how each command buffer kind passes them to the driver.
//!
//! Every attribute is checked when the dispatch is recorded ([`check_attributes`]), against what
//! the function, its device and the loaded driver can do, so a recorded dispatch never fails at
//! issue for an attribute. The stream and deferred kinds pass them to `cuLaunchKernelEx`
//! ([`LaunchAttributes::fill`] writes them into a stack array, so a replay allocates nothing);
//! the graph kind sets them on the kernel node (`cuGraphKernelNodeSetAttribute`) and turns a
//! programmatic dependency into a programmatic edge (`cuGraphAddDependencies_v2`).

use std::ffi::{c_int, c_void};

use cuhal_sys::{
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, CUDA_KERNEL_NODE_PARAMS, CUgraph,
    CUgraphNode, CUlaunchAttribute, CUlaunchAttributeValue, CUlaunchConfig, DriverApi, cu,
};

use crate::{Error, Function, KernelArgs};

/// The kernel-node parameters of a launch of `function` over `grid` blocks of `block` threads
/// with `shared` bytes of dynamic shared memory. `kernel_params` is null (a template whose
/// arguments are set later) or one pointer per argument, each to a live value of its size.
pub(crate) fn kernel_node_params(
    function: &Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    kernel_params: *mut *mut c_void,
) -> CUDA_KERNEL_NODE_PARAMS {
    CUDA_KERNEL_NODE_PARAMS {
        func: function.raw(),
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared,
        kernelParams: kernel_params,
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Adds a kernel node launching `function` with `args` to `graph` after `deps`
/// (`cuGraphAddKernelNode`; the driver copies the argument values). The graph kind's dispatches
/// and the indirect-dispatch fragment's two nodes are made here.
#[allow(clippy::too_many_arguments)] // a kernel node's parameters, as cuda.h has them
pub(crate) fn add_kernel_node(
    api: &DriverApi,
    graph: CUgraph,
    deps: &[CUgraphNode],
    function: &Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    args: &KernelArgs,
) -> Result<CUgraphNode, Error> {
    // Points into `args`, borrowed for this call.
    let mut pointers = args.pointers();
    let kernel_params = if pointers.is_empty() {
        std::ptr::null_mut()
    } else {
        pointers.as_mut_ptr()
    };
    let params = kernel_node_params(function, grid, block, shared, kernel_params);
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: out-pointer valid; `deps` are nodes of `graph` (callers add to their own graph)
    // and outlive the call, passed with their length (null when empty); the function's module
    // is retained by the command buffer (or resident in its context); `kernelParams` holds one
    // pointer per argument, each to a live value of that argument's size.
    unsafe {
        cu!(
            api,
            cuGraphAddKernelNode(
                &mut node,
                graph,
                if deps.is_empty() {
                    std::ptr::null()
                } else {
                    deps.as_ptr()
                },
                deps.len(),
                &params
            )
        )
    }?;
    Ok(node)
}

/// Makes graph kernel node `node` device-updatable and returns its device-side handle, which
/// device code names it by (`cudaGraphKernelNodeSetParam`, `cudaGraphKernelNodeSetGridDim`).
/// The binding-table patch helper and the indirect-dispatch helper both update nodes this way.
///
/// # Safety
/// `node` is a live kernel node of a graph of the bound context.
pub(crate) unsafe fn make_device_updatable(
    api: &DriverApi,
    node: CUgraphNode,
) -> Result<u64, Error> {
    let updatable = CUlaunchAttributeValue::int(1);
    // SAFETY: `node` is a live kernel node (the caller's contract); the value is a live local.
    unsafe {
        cu!(
            optional: api,
            cuGraphKernelNodeSetAttribute(
                node,
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
                node,
                CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
                &mut value,
            )
        )
    }?;
    Ok(value.device_node().addr() as u64)
}

/// The largest thread-block cluster every cluster-capable GPU runs (8 blocks); kernels that
/// allow non-portable sizes may use up to [`MAX_NON_PORTABLE_CLUSTER`].
pub const MAX_PORTABLE_CLUSTER: u32 = 8;
/// The largest non-portable cluster (16 blocks on Hopper), for kernels that allow it.
pub const MAX_NON_PORTABLE_CLUSTER: u32 = 16;

/// Launch attributes of one dispatch. The default is a plain launch.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaunchAttributes {
    /// Thread-block cluster dimensions in blocks (compute capability 9.0+). Each grid axis must
    /// be a multiple of the cluster's. A kernel compiled with `.reqnctapercluster` runs in its
    /// clusters without this; if set, it must match.
    pub cluster: Option<[u32; 3]>,
    /// A cooperative launch: every block is resident at once, so the grid can synchronize as a
    /// whole. The grid may not exceed what the device holds at once (checked against the
    /// occupancy the driver reports).
    pub cooperative: bool,
    /// Programmatic dependent launch (compute capability 9.0+): the dispatch depends on the
    /// dispatch before the barrier just recorded, but may start as soon as every block of that
    /// kernel has run `griddepcontrol.launch_dependents` (or exited); it must execute
    /// `griddepcontrol.wait` before it reads what that kernel wrote. It must be the first
    /// command after a barrier that closed a group of exactly one dispatch.
    pub programmatic: bool,
    /// The dispatch's priority, a stream priority value of the context's range
    /// (`cuCtxGetStreamPriorityRange`; lower numbers are higher priority).
    pub priority: Option<i32>,
}

impl LaunchAttributes {
    /// Whether no attribute is set: the dispatch is a plain `cuLaunchKernel`.
    pub fn is_plain(&self) -> bool {
        *self == Self::default()
    }

    /// Writes the attributes into `out` (the form `cuLaunchKernelEx` and kernel nodes take) and
    /// returns how many there are. `programmatic` is included only with `with_programmatic`:
    /// graphs express it as an edge instead.
    pub(crate) fn fill(&self, out: &mut [CUlaunchAttribute; 4], with_programmatic: bool) -> usize {
        let mut n = 0;
        let mut push = |id, value| {
            out[n] = CUlaunchAttribute {
                id,
                pad: [0; 4],
                value,
            };
            n += 1;
        };
        if let Some(cluster) = self.cluster {
            push(
                CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                CUlaunchAttributeValue::cluster(cluster),
            );
        }
        if self.cooperative {
            push(
                CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                CUlaunchAttributeValue::int(1),
            );
        }
        if self.programmatic && with_programmatic {
            push(
                CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                CUlaunchAttributeValue::int(1),
            );
        }
        if let Some(priority) = self.priority {
            push(
                CU_LAUNCH_ATTRIBUTE_PRIORITY,
                CUlaunchAttributeValue::int(priority),
            );
        }
        n
    }
}

/// Sets a kernel node's launch attributes (all but the programmatic dependency, which is an
/// edge). The recorder checked the driver has the entry point when there is any.
pub(crate) fn set_kernel_node_attributes(
    api: &cuhal_sys::DriverApi,
    node: cuhal_sys::CUgraphNode,
    attributes: &LaunchAttributes,
) -> Result<(), Error> {
    let mut attrs = [NO_ATTRIBUTE; 4];
    let n = attributes.fill(&mut attrs, false);
    if n == 0 {
        return Ok(());
    }
    if api.cuGraphKernelNodeSetAttribute.is_none() {
        return Err(Error::UnsupportedAttribute {
            attribute: "launch attributes",
            reason: "the driver cannot set a graph kernel node's launch attributes",
        });
    }
    for attr in &attrs[..n] {
        // SAFETY: `node` is a kernel node just added to the graph; the value is a local that
        // outlives the call and holds the member the attribute reads.
        unsafe { cu!(optional: api, cuGraphKernelNodeSetAttribute(node, attr.id, &attr.value)) }?;
    }
    Ok(())
}

/// An empty attribute slot.
pub(crate) const NO_ATTRIBUTE: CUlaunchAttribute = CUlaunchAttribute {
    id: 0,
    pad: [0; 4],
    value: CUlaunchAttributeValue::zeroed(),
};

/// Which driver entry points a command buffer kind needs for attributes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum AttributePath {
    /// `cuLaunchKernelEx` (stream and deferred kinds).
    Launch,
    /// Kernel node attributes and typed edges (graph kind).
    GraphNode,
}

/// Checks `attributes` for a dispatch of `function` with this shape, and returns the attributes
/// to record (a kernel's compiled-in cluster needs no attribute and is not repeated).
pub(crate) fn check_attributes(
    function: &Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared_memory: u32,
    attributes: &LaunchAttributes,
    path: AttributePath,
) -> Result<LaunchAttributes, Error> {
    if attributes.is_plain() && function.capabilities().required_cluster.is_none() {
        if function.capabilities().cluster_must_be_set {
            return Err(bad_cluster(
                function,
                [0; 3],
                grid,
                "the kernel must be launched with a cluster size",
            ));
        }
        return Ok(*attributes);
    }
    let caps = function.capabilities();
    let api = function.context().api();
    let mut out = *attributes;
    if !attributes.is_plain() {
        match path {
            AttributePath::Launch => need(
                api.cuLaunchKernelEx.is_some(),
                "launch attributes",
                "the driver has no cuLaunchKernelEx (CUDA 11.8)",
            )?,
            AttributePath::GraphNode => need(
                api.cuGraphKernelNodeSetAttribute.is_some(),
                "launch attributes",
                "the driver has no cuGraphKernelNodeSetAttribute",
            )?,
        }
    }

    // Clusters: the requested or compiled-in shape must tile the grid and fit the device.
    let cluster = match (attributes.cluster, caps.required_cluster) {
        (Some(asked), Some(required)) if asked != required => {
            return Err(bad_cluster(
                function,
                asked,
                grid,
                "differs from the cluster the kernel was compiled with (.reqnctapercluster)",
            ));
        }
        (Some(asked), _) => Some(asked),
        (None, Some(required)) => {
            // The driver applies the compiled-in shape; recording it again is redundant.
            out.cluster = None;
            Some(required)
        }
        (None, None) if caps.cluster_must_be_set => {
            return Err(bad_cluster(
                function,
                [0; 3],
                grid,
                "the kernel must be launched with a cluster size",
            ));
        }
        (None, None) => None,
    };
    if let Some(cluster) = cluster {
        need(
            caps.clusters,
            "cluster",
            "the device cannot launch thread-block clusters (compute capability 9.0+)",
        )?;
        if cluster.contains(&0) {
            return Err(bad_cluster(
                function,
                cluster,
                grid,
                "a cluster axis is zero",
            ));
        }
        if grid.iter().zip(cluster).any(|(&g, c)| g % c != 0) {
            return Err(bad_cluster(
                function,
                cluster,
                grid,
                "the grid is not a multiple of the cluster on every axis",
            ));
        }
        let size = u64::from(cluster[0]) * u64::from(cluster[1]) * u64::from(cluster[2]);
        let max = if caps.non_portable_cluster {
            MAX_NON_PORTABLE_CLUSTER
        } else {
            MAX_PORTABLE_CLUSTER
        };
        if size > u64::from(max) {
            return Err(Error::ClusterTooLarge {
                function: function.name().to_owned(),
                cluster,
                blocks: size,
                max,
            });
        }
        if api.cuOccupancyMaxActiveClusters.is_some() {
            let mut attrs = [NO_ATTRIBUTE; 4];
            let n = LaunchAttributes {
                cluster: Some(cluster),
                ..Default::default()
            }
            .fill(&mut attrs, false);
            let config = launch_config(
                grid,
                block,
                shared_memory,
                std::ptr::null_mut(),
                &mut attrs,
                n,
            );
            let mut clusters: c_int = 0;
            let _bound = function.context().enter()?;
            // SAFETY: `clusters` is a valid out-pointer; `config` and the attribute array it
            // points to live across the call; the function's module is loaded.
            unsafe {
                cu!(
                    optional: api,
                    cuOccupancyMaxActiveClusters(&mut clusters, function.raw(), &config)
                )
            }?;
            if clusters <= 0 {
                return Err(bad_cluster(
                    function,
                    cluster,
                    grid,
                    "no cluster of this shape fits on the device (shared memory or registers)",
                ));
            }
        }
    }

    if attributes.cooperative {
        need(
            caps.cooperative,
            "cooperative",
            "the device does not support cooperative launches",
        )?;
        if api.cuOccupancyMaxActiveBlocksPerMultiprocessor.is_none() {
            return Err(unsupported(
                "cooperative",
                "the driver cannot report occupancy",
            ));
        }
        let threads = block.iter().map(|&b| b as c_int).product::<c_int>();
        let mut per_sm: c_int = 0;
        let _bound = function.context().enter()?;
        // SAFETY: `per_sm` is a valid out-pointer; the function's module is loaded.
        unsafe {
            cu!(
                optional: api,
                cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut per_sm,
                    function.raw(),
                    threads,
                    shared_memory as usize
                )
            )
        }?;
        let max = u64::from(per_sm.max(0) as u32) * u64::from(caps.multiprocessors);
        let blocks = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        if blocks > max {
            return Err(Error::CooperativeGridTooLarge {
                function: function.name().to_owned(),
                blocks,
                max,
            });
        }
    }

    if attributes.programmatic {
        need(
            caps.compute_capability.0 >= 9,
            "programmatic",
            "programmatic dependent launch needs compute capability 9.0",
        )?;
        if path == AttributePath::GraphNode {
            need(
                api.cuGraphAddDependencies_v2.is_some(),
                "programmatic",
                "the driver has no typed graph edges (CUDA 12.3)",
            )?;
        }
    }

    if let Some(priority) = attributes.priority {
        let (least, greatest) = caps.priority_range;
        if priority < greatest || priority > least {
            return Err(Error::BadPriority {
                priority,
                least,
                greatest,
            });
        }
    }
    Ok(out)
}

fn need(ok: bool, attribute: &'static str, reason: &'static str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(unsupported(attribute, reason))
    }
}

fn unsupported(attribute: &'static str, reason: &'static str) -> Error {
    Error::UnsupportedAttribute { attribute, reason }
}

fn bad_cluster(
    function: &Function,
    cluster: [u32; 3],
    grid: [u32; 3],
    reason: &'static str,
) -> Error {
    Error::BadCluster {
        function: function.name().to_owned(),
        cluster,
        grid,
        reason,
    }
}

/// A `CUlaunchConfig` over the first `n` of `attrs`.
pub(crate) fn launch_config(
    grid: [u32; 3],
    block: [u32; 3],
    shared_memory: u32,
    stream: cuhal_sys::CUstream,
    attrs: &mut [CUlaunchAttribute; 4],
    n: usize,
) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared_memory,
        hStream: stream,
        attrs: if n == 0 {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: n as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_fill_in_a_fixed_order_without_programmatic_for_graphs() {
        let attrs = LaunchAttributes {
            cluster: Some([2, 1, 1]),
            cooperative: true,
            programmatic: true,
            priority: Some(-1),
        };
        let mut out = [NO_ATTRIBUTE; 4];
        assert_eq!(attrs.fill(&mut out, true), 4);
        assert_eq!(out[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
        assert_eq!(out[0].value.as_dims(), [2, 1, 1]);
        assert_eq!(out[1].id, CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
        assert_eq!(
            out[2].id,
            CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
        assert_eq!(out[3].id, CU_LAUNCH_ATTRIBUTE_PRIORITY);
        assert_eq!(out[3].value.as_int(), -1);
        let mut out = [NO_ATTRIBUTE; 4];
        assert_eq!(attrs.fill(&mut out, false), 3);
        assert_eq!(out[2].id, CU_LAUNCH_ATTRIBUTE_PRIORITY);
        assert_eq!(LaunchAttributes::default().fill(&mut out, true), 0);
        assert!(LaunchAttributes::default().is_plain());
    }
}
