//! [`Dispatch`]: one kernel launch as a command names it (function, shape, shared memory,
//! arguments, launch attributes), with its builder methods. The recorder checks it and hands
//! it to the encoders (a graph adds it as a kernel node, [`add_dispatch_node`]); an indirect
//! dispatch wraps one with its counts.

use cuhal_sys::{CUgraph, CUgraphNode, DriverApi};

use crate::launch::{LaunchAttributes, add_kernel_node, set_kernel_node_attributes};
use crate::{Error, Function, KernelArgs};

/// One kernel launch: function, grid and block shape, dynamic shared memory, arguments and
/// launch attributes.
#[derive(Copy, Clone, Debug)]
pub struct Dispatch<'a> {
    /// The kernel.
    pub function: &'a Function,
    /// Grid size in blocks (x, y, z).
    pub grid: [u32; 3],
    /// Block size in threads (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_memory_bytes: u32,
    /// The kernel's arguments (copied at record time).
    pub args: &'a KernelArgs,
    /// Clusters, cooperative launch, programmatic dependency, priority (default: none).
    pub attributes: LaunchAttributes,
}

impl<'a> Dispatch<'a> {
    /// A dispatch with no dynamic shared memory.
    pub fn new(
        function: &'a Function,
        grid: [u32; 3],
        block: [u32; 3],
        args: &'a KernelArgs,
    ) -> Self {
        Self {
            function,
            grid,
            block,
            shared_memory_bytes: 0,
            args,
            attributes: LaunchAttributes::default(),
        }
    }

    /// Sets the dynamic shared memory per block. Above the function's current limit (48 KiB by
    /// default) recording raises the limit, up to the device's opt-in maximum.
    pub fn with_shared_memory(mut self, bytes: u32) -> Self {
        self.shared_memory_bytes = bytes;
        self
    }

    /// Launches in thread-block clusters of `dims` blocks (see [`LaunchAttributes::cluster`]).
    pub fn with_cluster(mut self, dims: [u32; 3]) -> Self {
        self.attributes.cluster = Some(dims);
        self
    }

    /// Launches cooperatively (see [`LaunchAttributes::cooperative`]).
    pub fn cooperative(mut self) -> Self {
        self.attributes.cooperative = true;
        self
    }

    /// Depends programmatically on the dispatch before the preceding barrier (see
    /// [`LaunchAttributes::programmatic`]).
    pub fn programmatic(mut self) -> Self {
        self.attributes.programmatic = true;
        self
    }

    /// Sets the dispatch's priority (see [`LaunchAttributes::priority`]).
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.attributes.priority = Some(priority);
        self
    }

    /// Sets every launch attribute at once.
    pub fn with_attributes(mut self, attributes: LaunchAttributes) -> Self {
        self.attributes = attributes;
        self
    }
}

/// Adds a kernel node for `dispatch` to `graph` after `deps` ([`add_kernel_node`]) and sets its
/// launch attributes ([`set_kernel_node_attributes`]): a graph dispatch, or the dispatch node of
/// an indirect fragment. The context must be current.
pub(crate) fn add_dispatch_node(
    api: &DriverApi,
    graph: CUgraph,
    deps: &[CUgraphNode],
    dispatch: &Dispatch<'_>,
) -> Result<CUgraphNode, Error> {
    let node = add_kernel_node(
        api,
        graph,
        deps,
        dispatch.function,
        dispatch.grid,
        dispatch.block,
        dispatch.shared_memory_bytes,
        dispatch.args,
    )?;
    set_kernel_node_attributes(api, node, &dispatch.attributes)?;
    Ok(node)
}
