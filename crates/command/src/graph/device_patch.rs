//! Binding patches applied on the device: when a launch changes the bindings of many kernel
//! nodes, one helper kernel node at the head of the graph (`cuhal_bindings_apply`, from
//! `kernels/bindings.cu`) writes the changed argument words into the kernel nodes, which are
//! device-updatable, instead of one `cuGraphExecKernelNodeSetParams` per node on the host.
//!
//! A graph with device-updatable nodes can be instantiated only once at a time, so each
//! executable of the pool gets a graph of its own: a clone of the recorded graph (which itself
//! stays plain), whose bound kernel nodes are made device-updatable and which gains the helper
//! node before its root nodes. Each such executable owns a ring of patch lists in host-mapped
//! memory: at a launch the host writes the list into the next free entry, points the helper node
//! at it (`cuGraphExecKernelNodeSetParams`, one call) and enables it; the helper marks the entry
//! consumed once it has applied every patch, and only then is the entry written again. With no
//! entry free, or few nodes changed, or for memset nodes, the launch patches on the host as
//! before and the helper node is disabled.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cuhal_sys::{
    CUDA_KERNEL_NODE_PARAMS, CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode, DriverApi,
    MappedHostMemory, PrimaryContext, cu,
};

use super::pool::{PatchKind, PatchNode};
use crate::indirect::{self, DEVICE_UPDATABLE_SINCE};
use crate::launch::{kernel_node_params, make_device_updatable};
use crate::{BufferRange, Error, Function};

/// The binding-patch helper kernel's name in the helper cubins.
pub const BINDINGS_HELPER: &str = "cuhal_bindings_apply";

/// In [`PatchMethod::Auto`], the fewest changed kernel nodes a launch patches on the device.
///
/// Host patching costs one `cuGraphExecKernelNodeSetParams` per changed node (0.37 us each on
/// the H200, driver 580); the device path costs one such call for the helper node, a few stores
/// into mapped memory, and the helper node itself on the GPU (one one-block kernel node ahead of
/// the graph, about as long as a short dependent dispatch, 1 to 2 us). Eight host calls
/// (about 3 us) are where the two meet; bench case 11 reports both per-node costs.
pub const DEVICE_PATCH_MIN_NODES: usize = 8;

/// Patch lists per executable: launches of one executable that may patch on the device before
/// the first of them has run. A launch that finds every list still unread patches on the host.
pub const DEVICE_PATCH_RING: usize = 16;

/// Bytes of one patch as the helper reads it: device node, parameter offset, 8-byte value.
const PATCH_BYTES: usize = 24;

/// Most threads of the helper's one block (`HELPER_MAX_THREADS` in `bindings.cu`).
const HELPER_MAX_THREADS: u32 = 256;

/// How a graph command buffer with binding slots gives its executables new addresses.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum PatchMethod {
    /// On the device when a launch changes at least [`DEVICE_PATCH_MIN_NODES`] kernel nodes and
    /// the device has the helper, else on the host.
    #[default]
    Auto,
    /// Always on the host (`cuGraphExec*NodeSetParams` per changed node); no helper node.
    Host,
    /// On the device whenever a kernel node changes (where the helper is available); memset
    /// nodes, and launches that find no free patch list, still patch on the host.
    Device,
}

impl PatchMethod {
    /// The fewest changed kernel nodes patched on the device (`None`: never).
    fn min_nodes(self) -> Option<usize> {
        match self {
            PatchMethod::Auto => Some(DEVICE_PATCH_MIN_NODES),
            PatchMethod::Host => None,
            PatchMethod::Device => Some(1),
        }
    }
}

/// What device patching needs for every executable of one command buffer.
pub(crate) struct DevicePatcher {
    context: Arc<PrimaryContext>,
    helper: Function,
    min_nodes: usize,
    /// Patches in one list: every bound kernel argument of the graph.
    capacity: usize,
}

impl DevicePatcher {
    /// The patcher for a graph whose nodes with slots are `patches`, or `None` when `method`,
    /// the graph or the driver and device leave patching on the host only: no kernel node with
    /// slots (or fewer than the method's minimum), a graph that already holds device-updatable
    /// nodes (`has_updatable`: indirect dispatch), a driver without device-updatable nodes, or
    /// a device without a helper cubin.
    pub(crate) fn new(
        context: &Arc<PrimaryContext>,
        method: PatchMethod,
        patches: &[PatchNode],
        has_updatable: bool,
    ) -> Option<Self> {
        let min_nodes = method.min_nodes()?;
        let kernels = patches
            .iter()
            .filter(|p| matches!(p.kind, PatchKind::Kernel { .. }))
            .count();
        let api = context.api();
        if has_updatable
            || kernels == 0
            || kernels < min_nodes
            || api.driver_version() < DEVICE_UPDATABLE_SINCE
            || api.cuGraphKernelNodeSetAttribute.is_none()
            || api.cuGraphKernelNodeGetAttribute.is_none()
            || api.cuGraphClone.is_none()
            || api.cuGraphNodeFindInClone.is_none()
            || api.cuGraphGetRootNodes.is_none()
            || api.cuGraphNodeSetEnabled.is_none()
        {
            return None;
        }
        // No cubin for the device (or a load failure) leaves the host path, which always works.
        let helper = indirect::helper_function(context, BINDINGS_HELPER).ok()?;
        let capacity = patches
            .iter()
            .map(|p| match &p.kind {
                PatchKind::Kernel { bindings, .. } => bindings.len(),
                PatchKind::Memset { .. } | PatchKind::Work(_) => 0,
            })
            .sum();
        Some(Self {
            context: Arc::clone(context),
            helper,
            min_nodes,
            capacity,
        })
    }

    /// Whether a launch that changes `kernels` kernel nodes patches them on the device.
    pub(crate) fn wants(&self, kernels: usize) -> bool {
        kernels > 0 && kernels >= self.min_nodes
    }

    /// Clones `graph`, makes the kernel nodes of `patches` device-updatable, adds the helper
    /// node before every root, instantiates the clone with `flags` and uploads it.
    ///
    /// # Safety
    /// `graph` is the complete, live graph that holds the nodes of `patches`; the context is
    /// current.
    pub(crate) unsafe fn instantiate(
        &self,
        graph: CUgraph,
        patches: &[PatchNode],
        flags: u64,
    ) -> Result<(CUgraphExec, DeviceSide), Error> {
        let api = self.context.api();
        let ring = new_ring(&self.context, ring_bytes(self.capacity))?;
        let mut clone: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `graph` is live and complete (the caller's contract).
        unsafe { cu!(optional: api, cuGraphClone(&mut clone, graph)) }?;
        let mut side = DeviceSide {
            clone,
            exec: std::ptr::null_mut(),
            nodes: Vec::with_capacity(patches.len()).into_boxed_slice(),
            device_nodes: Box::default(),
            helper: std::ptr::null_mut(),
            enabled: true,
            ring,
            capacity: self.capacity,
            next: 0,
            pending: None,
        };
        // SAFETY: `clone` is the live clone of `graph`, owned by `side` from here on (destroyed
        // with it on an error below).
        unsafe { side.build(api, patches, &self.helper) }?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the clone is complete.
        unsafe {
            cu!(
                api,
                cuGraphInstantiateWithFlags(&mut exec, side.clone, flags)
            )
        }?;
        side.exec = exec;
        // Nodes updated from inside the graph need it uploaded before the first launch.
        indirect::upload(&self.context, exec)?;
        // The helper runs only at launches that patch on the device.
        // SAFETY: `helper` is a kernel node of the graph `exec` was instantiated from.
        unsafe { cu!(optional: api, cuGraphNodeSetEnabled(exec, side.helper, 0)) }?;
        side.enabled = false;
        side.exec = std::ptr::null_mut();
        Ok((exec, side))
    }

    /// The helper kernel's launch parameters for `count` patches in list `slot` of `side`'s ring:
    /// written into `values`, which `pointers` then points at.
    fn helper_params(
        &self,
        side: &DeviceSide,
        slot: usize,
        count: u32,
        values: &mut HelperArgs,
    ) -> CUDA_KERNEL_NODE_PARAMS {
        values.patches = side.ring.device_ptr() + list_offset(side.capacity, slot) as u64;
        values.count = count;
        values.done = side.ring.device_ptr() + (slot * 4) as u64;
        let threads = count.div_ceil(32).clamp(1, HELPER_MAX_THREADS / 32) * 32;
        kernel_node_params(
            &self.helper,
            [1, 1, 1],
            [threads, 1, 1],
            0,
            std::ptr::null_mut(),
        )
    }
}

/// The helper's three arguments, kept in one place while the driver reads them.
#[derive(Default)]
struct HelperArgs {
    patches: CUdeviceptr,
    count: u32,
    done: CUdeviceptr,
}

/// Bytes of the ring: the done words (padded to 64 bytes), then the lists.
fn ring_bytes(capacity: usize) -> usize {
    list_offset(capacity, DEVICE_PATCH_RING)
}

/// Where list `slot` starts in the ring.
fn list_offset(capacity: usize, slot: usize) -> usize {
    (DEVICE_PATCH_RING * 4).next_multiple_of(64) + slot * capacity.max(1) * PATCH_BYTES
}

/// The device-patching side of one executable.
pub(crate) struct DeviceSide {
    /// The graph the executable was instantiated from (a clone of the recorded graph).
    clone: CUgraph,
    /// Set only while `instantiate` builds it (so an error there destroys the executable).
    exec: CUgraphExec,
    /// Per node of the pool's patch list, the node in `clone`.
    nodes: Box<[CUgraphNode]>,
    /// Per node of the pool's patch list, its device handle (0 for memset nodes).
    device_nodes: Box<[u64]>,
    /// The helper node in `clone`.
    helper: CUgraphNode,
    /// Whether the helper node is enabled in the executable.
    enabled: bool,
    /// The ring of patch lists, its done words first; dropped after the executable that reads
    /// it (freeing waits for its launches).
    ring: MappedHostMemory,
    capacity: usize,
    /// The next list to use.
    next: usize,
    /// The list written for the launch being prepared (released if that launch fails).
    pending: Option<usize>,
}

// SAFETY: the raw handles are used only under the pool's lock (or in drop); the mapped ring is
// written by the host under that lock and read through atomics.
unsafe impl Send for DeviceSide {}
// SAFETY: as above.
unsafe impl Sync for DeviceSide {}

impl DeviceSide {
    /// Fills the clone: finds each patched node, makes kernel nodes device-updatable, adds the
    /// helper before every root.
    ///
    /// # Safety
    /// `self.clone` is a live clone of the graph that holds the nodes of `patches`.
    unsafe fn build(
        &mut self,
        api: &DriverApi,
        patches: &[PatchNode],
        helper: &Function,
    ) -> Result<(), Error> {
        let mut nodes = Vec::with_capacity(patches.len());
        let mut device_nodes = Vec::with_capacity(patches.len());
        for patch in patches {
            let mut node: CUgraphNode = std::ptr::null_mut();
            // SAFETY: `patch.node` is a node of the original graph; valid out-pointer.
            unsafe {
                cu!(optional: api, cuGraphNodeFindInClone(&mut node, patch.node, self.clone))
            }?;
            let mut device = 0u64;
            if let PatchKind::Kernel { .. } = patch.kind {
                // SAFETY: `node` is a kernel node of the clone.
                device = unsafe { make_device_updatable(api, node) }?;
            }
            nodes.push(node);
            device_nodes.push(device);
        }
        self.nodes = nodes.into_boxed_slice();
        self.device_nodes = device_nodes.into_boxed_slice();
        let mut count = 0usize;
        // SAFETY: the clone is live; with a null array the driver writes only the count.
        unsafe {
            cu!(
                optional: api,
                cuGraphGetRootNodes(self.clone, std::ptr::null_mut(), &mut count)
            )
        }?;
        let mut roots = vec![std::ptr::null_mut(); count];
        if count > 0 {
            // SAFETY: `roots` holds `count` handles.
            unsafe {
                cu!(
                    optional: api,
                    cuGraphGetRootNodes(self.clone, roots.as_mut_ptr(), &mut count)
                )
            }?;
            roots.truncate(count);
        }
        // The helper, pointed at list 0 with no patch until a launch sets it.
        let mut args = HelperArgs {
            patches: self.ring.device_ptr() + list_offset(self.capacity, 0) as u64,
            count: 0,
            done: self.ring.device_ptr(),
        };
        let mut pointers = args.pointers();
        let params = kernel_node_params(helper, [1, 1, 1], [32, 1, 1], 0, pointers.as_mut_ptr());
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: valid out-pointer; no dependencies; three pointers to live values of the
        // helper's parameter types; the helper's module is resident in the context.
        unsafe {
            cu!(
                api,
                cuGraphAddKernelNode(&mut node, self.clone, std::ptr::null(), 0, &params)
            )
        }?;
        self.helper = node;
        let from = vec![node; roots.len()];
        if !roots.is_empty() {
            // SAFETY: `from` and `roots` hold `roots.len()` nodes of the clone each.
            unsafe {
                cu!(
                    api,
                    cuGraphAddDependencies(self.clone, from.as_ptr(), roots.as_ptr(), roots.len())
                )
            }?;
        }
        Ok(())
    }

    /// The node to patch on the host for entry `index` of the pool's patch list.
    pub(crate) fn node(&self, index: usize) -> CUgraphNode {
        self.nodes[index]
    }

    /// Takes a free patch list for this launch, or `None` when every one is still unread.
    pub(crate) fn take_list(&mut self) -> Option<ListWriter<'_>> {
        let slot = self.next;
        // 0: written for a launch whose helper has not run yet.
        if self.ring.word(slot).load(Ordering::Acquire) == 0 {
            return None;
        }
        self.next = (slot + 1) % DEVICE_PATCH_RING;
        self.ring.word(slot).store(0, Ordering::Release);
        self.pending = Some(slot);
        let base = list_offset(self.capacity, slot);
        Some(ListWriter {
            // SAFETY: the list lies inside the ring (`ring_bytes`); nothing reads it until the
            // launch this list is written for.
            at: unsafe { self.ring.host_ptr().add(base) },
            capacity: self.capacity,
            count: 0,
            device_nodes: &self.device_nodes,
        })
    }

    /// Points the helper at the pending list of `count` patches and enables it.
    ///
    /// # Safety
    /// `exec` is the executable instantiated from `self.clone`; the context is current.
    pub(crate) unsafe fn arm(
        &mut self,
        api: &DriverApi,
        exec: CUgraphExec,
        patcher: &DevicePatcher,
        count: usize,
    ) -> Result<(), Error> {
        let slot = self.pending.ok_or(Error::InvalidState {
            operation: "patch on the device",
            state: crate::CommandBufferState::Ended,
        })?;
        let mut values = HelperArgs::default();
        let mut params = patcher.helper_params(self, slot, count as u32, &mut values);
        let mut pointers = values.pointers();
        params.kernelParams = pointers.as_mut_ptr();
        // SAFETY: `helper` is a kernel node of the graph `exec` came from; three pointers to
        // live values of the helper's parameter types, copied by the driver before returning.
        unsafe {
            cu!(
                api,
                cuGraphExecKernelNodeSetParams(exec, self.helper, &params)
            )
        }?;
        if !self.enabled {
            // SAFETY: as above.
            unsafe { cu!(optional: api, cuGraphNodeSetEnabled(exec, self.helper, 1)) }?;
            self.enabled = true;
        }
        Ok(())
    }

    /// Disables the helper for a launch that patches nothing on the device; gives back a list
    /// taken for it, if any.
    ///
    /// # Safety
    /// As [`Self::arm`].
    pub(crate) unsafe fn disarm(
        &mut self,
        api: &DriverApi,
        exec: CUgraphExec,
    ) -> Result<(), Error> {
        self.release();
        if self.enabled {
            // SAFETY: the caller's contract.
            unsafe { cu!(optional: api, cuGraphNodeSetEnabled(exec, self.helper, 0)) }?;
            self.enabled = false;
        }
        Ok(())
    }

    /// The launch was enqueued: its list now belongs to its helper.
    pub(crate) fn launched(&mut self) {
        self.pending = None;
    }

    /// Gives back the pending list (its launch was not enqueued, so no helper will read it).
    pub(crate) fn release(&mut self) {
        if let Some(slot) = self.pending.take() {
            self.ring.word(slot).store(1, Ordering::Release);
            self.next = slot;
        }
    }

    /// Destroys the clone (after its executable).
    ///
    /// # Safety
    /// The executable instantiated from the clone is destroyed; the context is current.
    pub(crate) unsafe fn destroy(&mut self, api: &DriverApi) {
        if !self.exec.is_null() {
            // SAFETY: instantiated in `instantiate` and not handed out (an error path).
            let _ = unsafe { cu!(api, cuGraphExecDestroy(self.exec)) };
            self.exec = std::ptr::null_mut();
        }
        if !self.clone.is_null() {
            // SAFETY: cloned in `instantiate`, destroyed once.
            let _ = unsafe { cu!(api, cuGraphDestroy(self.clone)) };
            self.clone = std::ptr::null_mut();
        }
    }
}

impl Drop for DeviceSide {
    fn drop(&mut self) {
        if self.exec.is_null() && self.clone.is_null() {
            return;
        }
        let context = Arc::clone(self.ring.context());
        if let Ok(_bound) = context.enter() {
            // SAFETY: the context is current; an executable still here was never handed out.
            unsafe { self.destroy(context.api()) };
        }
    }
}

impl HelperArgs {
    /// One pointer per parameter of `cuhal_bindings_apply(patches, count, done)`.
    fn pointers(&mut self) -> [*mut c_void; 3] {
        [
            (&raw mut self.patches).cast(),
            (&raw mut self.count).cast(),
            (&raw mut self.done).cast(),
        ]
    }
}

/// Writes one launch's patches into its list.
pub(crate) struct ListWriter<'a> {
    at: *mut u8,
    capacity: usize,
    count: usize,
    device_nodes: &'a [u64],
}

impl ListWriter<'_> {
    /// Adds the patches of node `index` of the pool's patch list for `table`: each of its bound
    /// arguments whose slot `changed`.
    pub(crate) fn push_node(
        &mut self,
        index: usize,
        patch: &PatchNode,
        table: &[BufferRange],
        changed: &[bool],
    ) {
        let PatchKind::Kernel {
            bindings,
            param_offsets,
            ..
        } = &patch.kind
        else {
            return;
        };
        let node = self.device_nodes[index];
        for b in bindings.iter() {
            if !changed[b.slot as usize] || self.count >= self.capacity {
                continue;
            }
            // Where the kernel's own parameter buffer holds the argument, which is not where
            // `KernelArgs` packed it when its type is less aligned than the parameter.
            let offset = u64::from(param_offsets[b.arg as usize]);
            let value = table[b.slot as usize].device_ptr() + b.offset;
            let mut bytes = [0u8; PATCH_BYTES];
            bytes[0..8].copy_from_slice(&node.to_ne_bytes());
            bytes[8..16].copy_from_slice(&offset.to_ne_bytes());
            bytes[16..24].copy_from_slice(&value.to_ne_bytes());
            // SAFETY: the list holds `capacity` patches and `count < capacity`; the host is the
            // only writer while the list is pending and unlaunched.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.at.add(self.count * PATCH_BYTES),
                    PATCH_BYTES,
                );
            }
            self.count += 1;
        }
    }

    /// Patches written.
    pub(crate) fn count(&self) -> usize {
        self.count
    }
}

/// The ring's pinned host memory mapped into the device, zeroed but for the done words (1: free).
fn new_ring(context: &Arc<PrimaryContext>, bytes: usize) -> Result<MappedHostMemory, Error> {
    let ring = MappedHostMemory::new(context, bytes)?;
    for slot in 0..DEVICE_PATCH_RING {
        ring.word(slot).store(1, Ordering::Relaxed);
    }
    Ok(ring)
}
