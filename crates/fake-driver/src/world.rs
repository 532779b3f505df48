//! Every object the fake driver hands out, behind one lock.
//!
//! Handles are never dereferenced: a `CUstream`, `CUevent`, `CUgraph`, ... is a unique id
//! dressed as a pointer, looked up here on every use, so a destroyed or made-up handle is
//! `CUDA_ERROR_INVALID_HANDLE` instead of undefined behaviour, and every live object can be
//! counted. One lock for everything keeps the fake simple and its operations atomic; nothing
//! that holds it blocks or calls back into user code.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use crate::context::PrimaryContext;
use crate::control::Counts;
use crate::graph::{Exec, Graph};
use crate::memory::{Allocation, Kind, Pool};
use crate::module::{Function, Module};
use crate::status;
use crate::stream::{Event, Stream};

/// The first handle id; ids grow by [`HANDLE_STEP`] so they look like aligned addresses and
/// never collide with the special stream handles 0, 1 (`CU_STREAM_LEGACY`) and 2
/// (`CU_STREAM_PER_THREAD`).
const FIRST_HANDLE: usize = 0x00fa_ce00_0000;
const HANDLE_STEP: usize = 0x10;

/// All objects of one loaded instance.
#[derive(Default)]
pub(crate) struct World {
    next_handle: usize,
    /// Primary contexts by device ordinal (created on first retain).
    pub contexts: Vec<PrimaryContext>,
    /// Live allocations by address (device, pool and pinned host memory).
    pub allocations: BTreeMap<u64, Allocation>,
    pub pools: HashMap<usize, Pool>,
    /// Each device's default pool, created on first use.
    pub default_pools: HashMap<i32, usize>,
    pub streams: HashMap<usize, Stream>,
    pub events: HashMap<usize, Event>,
    pub graphs: HashMap<usize, Graph>,
    /// Each graph node's graph.
    pub nodes: HashMap<usize, usize>,
    pub execs: HashMap<usize, Exec>,
    pub modules: HashMap<usize, Module>,
    pub functions: HashMap<usize, Function>,
    /// Enabled peer access: (context, peer context) pairs.
    pub peer_access: std::collections::HashSet<(usize, usize)>,
    /// Kernel launches (stream and graph) by function name; kept after modules unload.
    pub launches: HashMap<String, u64>,
    /// Programmatic edges added to graphs (`cuGraphAddDependencies_v2`).
    pub programmatic_edges: u64,
    /// `cuEventElapsedTime` calls that found an event not complete yet and answered
    /// `CUDA_ERROR_NOT_READY` (an API error to compute-sanitizer: callers query first).
    pub elapsed_not_ready: u64,
    /// How long device work takes on the model clock (zero: synchronous).
    pub timing: crate::stream::Timing,
    /// Every `cuGraphLaunch` so far, in call order.
    pub graph_launches: Vec<crate::graph::GraphLaunch>,
}

impl World {
    /// A fresh handle id.
    pub fn new_handle(&mut self) -> usize {
        if self.next_handle == 0 {
            self.next_handle = FIRST_HANDLE;
        }
        let id = self.next_handle;
        self.next_handle += HANDLE_STEP;
        id
    }

    /// The live-object counters a test compares against its baseline.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts {
            context_retains: self.contexts.iter().map(|c| u64::from(c.retains)).sum(),
            pools: self.pools.values().filter(|p| !p.default).count() as u64,
            streams: self.streams.len() as u64,
            events: self.events.len() as u64,
            graphs: self.graphs.len() as u64,
            graph_execs: self.execs.len() as u64,
            modules: self.modules.len() as u64,
            launches: self.launches.values().sum(),
            programmatic_edges: self.programmatic_edges,
            pool_peer_grants: self.pools.values().map(|p| p.access.len() as u64).sum(),
            ..Counts::default()
        };
        for allocation in self.allocations.values() {
            if matches!(allocation.kind, Kind::Host) {
                counts.host_allocations += 1;
            } else {
                counts.device_allocations += 1;
                counts.device_bytes += allocation.len as u64;
            }
        }
        counts
    }
}

/// The instance's objects.
pub(crate) fn world() -> MutexGuard<'static, World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    // A poisoned lock means a body panicked (and returned CUDA_ERROR_UNKNOWN); the maps are
    // still structurally sound, so carry on rather than fail every later call.
    WORLD
        .get_or_init(|| Mutex::new(World::default()))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The id behind a handle, `Err(INVALID_HANDLE)` for null.
pub(crate) fn id<T>(handle: *mut T) -> Result<usize, c_int> {
    match handle.addr() {
        0 => Err(status::INVALID_HANDLE),
        id => Ok(id),
    }
}

/// The handle for an id: an address that is never dereferenced.
pub(crate) fn handle<T>(id: usize) -> *mut T {
    std::ptr::without_provenance_mut(id)
}

/// Looks `id` up in `map`, `Err(INVALID_HANDLE)` if it is not there.
pub(crate) fn lookup<T>(map: &HashMap<usize, T>, id: usize) -> Result<&T, c_int> {
    map.get(&id).ok_or(status::INVALID_HANDLE)
}

/// As [`lookup`], mutably.
pub(crate) fn lookup_mut<T>(map: &mut HashMap<usize, T>, id: usize) -> Result<&mut T, c_int> {
    map.get_mut(&id).ok_or(status::INVALID_HANDLE)
}

/// A host address the caller handed in, kept as an integer (with its provenance exposed) so
/// objects that remember it stay `Send`.
pub(crate) fn host_address(pointer: *const c_void) -> usize {
    pointer.expose_provenance()
}
