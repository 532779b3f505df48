//! A fake NCCL in the same library: the collectives done in host memory (the fake's device
//! memory), so the device crate's communicators and collectives run in CI.
//!
//! The library exports NCCL's entry points by name, so `cuhal-sys` loads it as NCCL from the
//! same path it loaded the driver from, and both share one instance (devices, memory, faults).
//!
//! A collective is a *round* of a clique: every rank posts its part (a call outside a group, or
//! every call of one `ncclGroupStart`/`ncclGroupEnd` on that communicator); the last rank to
//! post runs the round in host memory and wakes the others. Like the GPU kernel it stands for,
//! a posted part does not finish until every rank has posted: the calling thread blocks (the
//! fake GPU is synchronous) until then, until the communicator is aborted (`ncclCommAbort` from
//! another thread: the call then fails), or for at most [`RENDEZVOUS_LIMIT`]. So a program that
//! issues one rank's part and then waits before issuing the other's hangs here as it would on
//! GPUs, which is what the tests of the device crate's design check.
//!
//! Graph capture: a collective enqueued on a capturing stream (alone, or every part of one
//! communicator in a group) becomes one node of the capture's graph (`CapturedRound`), which
//! posts its round each time the graph is launched. A launch of a graph holding such a node runs
//! on a thread of its own (see `graph.rs`), so launching every rank's graph from one thread, back
//! to back, works as on GPUs; a program that waits on the host between those launches hangs, as
//! it would there, until the rendezvous limit fails it.
//!
//! The ranks of a round must agree on each collective (call, count, data type, reduction,
//! root), as NCCL's debug checks want: a round whose ranks disagree computes nothing and fails
//! for every rank with `ncclInvalidUsage` (the message in `ncclGetLastError`), where real NCCL
//! would compute garbage or hang.
//!
//! Limits of the model: every rank of a communicator takes part in every round (send/recv pair
//! within a round); `ncclFloat16`/`ncclBfloat16` are refused; a group may not mix captured and
//! uncaptured streams.
// Functions carry NCCL's names so a reader can match them to nccl.h.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cuhal_sys::{CUstream, NcclComm, NcclUniqueId};

use crate::entry::{Status, entry};
use crate::world::world;

/// The version the fake reports: 2.28.5.
pub const VERSION: c_int = 22805;
/// The longest a posted part waits for the other ranks before failing (a real GPU would spin
/// for ever; the fake gives up so a broken test fails instead of hanging).
pub const RENDEZVOUS_LIMIT: Duration = Duration::from_secs(60);

const INVALID_ARGUMENT: c_int = 4;
const INVALID_USAGE: c_int = 5;
const UNHANDLED_CUDA_ERROR: c_int = 1;
const INTERNAL_ERROR: c_int = 3;

/// What one rank contributes to a round.
#[derive(Clone, Copy, Debug)]
enum Part {
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        op: c_int,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        op: c_int,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        root: c_int,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        op: c_int,
        root: c_int,
    },
    Send {
        send: u64,
        count: usize,
        dtype: c_int,
        peer: c_int,
    },
    Recv {
        recv: u64,
        count: usize,
        dtype: c_int,
        peer: c_int,
    },
}

struct Comm {
    clique: u64,
    rank: usize,
    nranks: usize,
    device: i32,
    /// The next round this rank posts to.
    next_round: u64,
    aborted: bool,
    /// An error of a captured round run by a graph launch (`ncclCommGetAsyncError`'s answer).
    async_error: c_int,
    last_error: CString,
}

#[derive(Default)]
struct Round {
    posts: Vec<Option<Vec<Part>>>,
    /// `Some` once run: the result every rank returns.
    result: Option<c_int>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    comms: HashMap<usize, Comm>,
    /// Rounds by (clique, round number).
    rounds: HashMap<(u64, u64), Round>,
    /// Ranks of each clique that joined (`ncclCommInitRank`).
    joined: HashMap<u64, usize>,
}

fn state() -> MutexGuard<'static, State> {
    lock().0.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock() -> &'static (Mutex<State>, Condvar) {
    static STATE: OnceLock<(Mutex<State>, Condvar)> = OnceLock::new();
    STATE.get_or_init(|| (Mutex::new(State::default()), Condvar::new()))
}

/// One part a group collected: its communicator, the part, and the stream's address when the
/// stream was capturing (the part then becomes a graph node at the group's end).
type Grouped = (usize, Part, Option<usize>);

thread_local! {
    /// Depth of the calling thread's group and the parts it collected, per communicator.
    static GROUP: RefCell<(u32, Vec<Grouped>)> = const { RefCell::new((0, Vec::new())) };
    /// Communicators initialized inside the thread's group: they wait for their peers at its
    /// end.
    static JOINING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A round captured into a graph: what one communicator posts each time the graph runs.
#[derive(Clone, Debug)]
pub(crate) struct CapturedRound {
    comm: usize,
    parts: Vec<Part>,
}

impl CapturedRound {
    /// Posts the round and waits for the other ranks (on a graph launch's own thread, holding
    /// no lock). A failure becomes the communicator's asynchronous error, as a failed NCCL
    /// kernel's would.
    pub(crate) fn run(&self) -> Status {
        let result = post(self.comm, self.parts.clone());
        if let Err(code) = result
            && let Some(c) = state().comms.get_mut(&self.comm)
            && c.async_error == 0
        {
            c.async_error = code;
        }
        result
    }
}

/// Adds `parts` of `comm` as one node to the capture of the stream at `stream`.
fn capture(comm: usize, stream: usize, parts: Vec<Part>) -> Status {
    let stream: CUstream = std::ptr::with_exposed_provenance_mut(stream);
    let captured = world()
        .captured(stream, || {
            crate::graph::Op::Nccl(CapturedRound { comm, parts })
        })
        .map_err(|_| UNHANDLED_CUDA_ERROR)?;
    ensure_captured(captured)
}

fn ensure_captured(captured: bool) -> Status {
    if captured { Ok(()) } else { Err(INVALID_USAGE) }
}

fn element_size(dtype: c_int) -> Result<usize, c_int> {
    match dtype {
        0 | 1 => Ok(1),
        2 | 3 | 7 => Ok(4),
        4 | 5 | 8 => Ok(8),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// Combines `b` into `a` (one element of `dtype`) with `op`; integers wrap, as on the GPU.
fn combine(dtype: c_int, op: c_int, a: &mut [u8], b: &[u8]) {
    macro_rules! apply {
        ($t:ty, $add:ident, $mul:ident) => {{
            let x = <$t>::from_le_bytes(a.try_into().unwrap_or_default());
            let y = <$t>::from_le_bytes(b.try_into().unwrap_or_default());
            let r: $t = match op {
                1 => $mul(x, y),
                2 => {
                    if x >= y {
                        x
                    } else {
                        y
                    }
                }
                3 => {
                    if x <= y {
                        x
                    } else {
                        y
                    }
                }
                _ => $add(x, y),
            };
            a.copy_from_slice(&r.to_le_bytes());
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            fn add(x: $t, y: $t) -> $t {
                x.wrapping_add(y)
            }
            fn mul(x: $t, y: $t) -> $t {
                x.wrapping_mul(y)
            }
            apply!($t, add, mul)
        }};
    }
    macro_rules! float {
        ($t:ty) => {{
            fn add(x: $t, y: $t) -> $t {
                x + y
            }
            fn mul(x: $t, y: $t) -> $t {
                x * y
            }
            apply!($t, add, mul)
        }};
    }
    match dtype {
        0 => int!(i8),
        1 => int!(u8),
        2 => int!(i32),
        3 => int!(u32),
        4 => int!(i64),
        5 => int!(u64),
        7 => float!(f32),
        _ => float!(f64),
    }
}

/// Divides an element by `n` (for `ncclAvg`).
fn average(dtype: c_int, a: &mut [u8], n: usize) {
    macro_rules! div {
        ($t:ty) => {{
            let x = <$t>::from_le_bytes(a.try_into().unwrap_or_default());
            a.copy_from_slice(&(x / (n as $t)).to_le_bytes());
        }};
    }
    match dtype {
        0 => div!(i8),
        1 => div!(u8),
        2 => div!(i32),
        3 => div!(u32),
        4 => div!(i64),
        5 => div!(u64),
        7 => div!(f32),
        _ => div!(f64),
    }
}

/// Reads `len` bytes of device memory.
fn read(address: u64, len: usize) -> Result<Vec<u8>, c_int> {
    let world = world();
    let span = world
        .device_span(address, len)
        .map_err(|_| INVALID_ARGUMENT)?;
    let mut bytes = vec![0; len];
    // SAFETY: `span` is `len` bytes of a live allocation, kept alive by the held lock.
    unsafe { std::ptr::copy_nonoverlapping(span, bytes.as_mut_ptr(), len) };
    Ok(bytes)
}

/// Writes `bytes` to device memory.
fn write(address: u64, bytes: &[u8]) -> Result<(), c_int> {
    let world = world();
    let span = world
        .device_span(address, bytes.len())
        .map_err(|_| INVALID_ARGUMENT)?;
    // SAFETY: as in `read`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), span, bytes.len()) };
    Ok(())
}

/// Reduces every rank's `count` elements at `sends` with `op`.
fn reduce(sends: &[(u64, usize)], dtype: c_int, op: c_int) -> Result<Vec<u8>, c_int> {
    let size = element_size(dtype)?;
    let mut total: Option<Vec<u8>> = None;
    for &(send, offset) in sends {
        let _ = offset;
        let bytes = read(send, sends_len(sends, size))?;
        match &mut total {
            None => total = Some(bytes),
            Some(total) => {
                for (a, b) in total.chunks_mut(size).zip(bytes.chunks(size)) {
                    combine(dtype, op, a, b);
                }
            }
        }
    }
    let mut total = total.unwrap_or_default();
    if op == 4 {
        for a in total.chunks_mut(size) {
            average(dtype, a, sends.len());
        }
    }
    Ok(total)
}

fn sends_len(sends: &[(u64, usize)], size: usize) -> usize {
    sends.first().map_or(0, |&(_, count)| count * size)
}

/// What every rank's part of one collective must agree on, as NCCL's debug checks compare it:
/// the call, element count, data type, reduction and root (the buffers are each rank's own).
#[derive(Debug, PartialEq, Eq)]
struct Signature {
    call: &'static str,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: Option<c_int>,
}

impl Part {
    /// The part's [`Signature`]; `None` for a send or receive (paired by `run_round` instead).
    fn signature(&self) -> Option<Signature> {
        let (call, count, datatype, op, root) = match *self {
            Part::AllReduce {
                count, dtype, op, ..
            } => ("ncclAllReduce", count, dtype, Some(op), None),
            Part::AllGather { count, dtype, .. } => ("ncclAllGather", count, dtype, None, None),
            Part::ReduceScatter {
                count, dtype, op, ..
            } => ("ncclReduceScatter", count, dtype, Some(op), None),
            Part::Broadcast {
                count, dtype, root, ..
            } => ("ncclBroadcast", count, dtype, None, Some(root)),
            Part::Reduce {
                count,
                dtype,
                op,
                root,
                ..
            } => ("ncclReduce", count, dtype, Some(op), Some(root)),
            Part::Send { .. } | Part::Recv { .. } => return None,
        };
        Some(Signature {
            call,
            count,
            datatype,
            op,
            root,
        })
    }
}

/// Where the ranks of a round disagree on one of its collectives (the `i`th of each rank's
/// posts, sends and receives aside), as a message for `ncclGetLastError`: the round then fails
/// with `ncclInvalidUsage` and computes nothing.
fn disagreement(posts: &[Vec<Part>]) -> Option<CString> {
    let signatures: Vec<Vec<Signature>> = posts
        .iter()
        .map(|parts| parts.iter().filter_map(Part::signature).collect())
        .collect();
    let (first, others) = signatures.split_first()?;
    for (rank, theirs) in others.iter().enumerate() {
        let differs = first.iter().zip(theirs).position(|(a, b)| a != b);
        if let Some(i) = differs {
            let message = format!(
                "rank {}'s collective {i} of the round disagrees with rank 0's: {:?} against {:?}",
                rank + 1,
                theirs[i],
                first[i]
            );
            return Some(CString::new(message).unwrap_or_default());
        }
    }
    None
}

/// Runs one round: `posts[rank]` is what each rank posted.
fn run_round(posts: &[Vec<Part>]) -> Result<(), c_int> {
    let nranks = posts.len();
    let collective = |p: &Part| !matches!(p, Part::Send { .. } | Part::Recv { .. });
    let collectives: Vec<Vec<Part>> = posts
        .iter()
        .map(|parts| parts.iter().copied().filter(collective).collect())
        .collect();
    let n = collectives[0].len();
    if collectives.iter().any(|c| c.len() != n) {
        return Err(INVALID_USAGE);
    }
    for i in 0..n {
        let parts: Vec<Part> = collectives.iter().map(|c| c[i]).collect();
        match parts[0] {
            Part::AllReduce {
                count, dtype, op, ..
            } => {
                let sends: Vec<(u64, usize)> = parts
                    .iter()
                    .map(|p| match *p {
                        Part::AllReduce { send, count: c, .. } if c == count => Ok((send, count)),
                        _ => Err(INVALID_USAGE),
                    })
                    .collect::<Result<_, _>>()?;
                let total = reduce(&sends, dtype, op)?;
                for p in &parts {
                    if let Part::AllReduce { recv, .. } = *p {
                        write(recv, &total)?;
                    }
                }
            }
            Part::AllGather { count, dtype, .. } => {
                let size = element_size(dtype)? * count;
                let mut gathered = Vec::with_capacity(size * nranks);
                for p in &parts {
                    match *p {
                        Part::AllGather { send, count: c, .. } if c == count => {
                            gathered.extend(read(send, size)?)
                        }
                        _ => return Err(INVALID_USAGE),
                    }
                }
                for p in &parts {
                    if let Part::AllGather { recv, .. } = *p {
                        write(recv, &gathered)?;
                    }
                }
            }
            Part::ReduceScatter {
                count, dtype, op, ..
            } => {
                let sends: Vec<(u64, usize)> = parts
                    .iter()
                    .map(|p| match *p {
                        Part::ReduceScatter { send, count: c, .. } if c == count => {
                            Ok((send, count * nranks))
                        }
                        _ => Err(INVALID_USAGE),
                    })
                    .collect::<Result<_, _>>()?;
                let total = reduce(&sends, dtype, op)?;
                let chunk = count * element_size(dtype)?;
                for (rank, p) in parts.iter().enumerate() {
                    if let Part::ReduceScatter { recv, .. } = *p {
                        write(recv, &total[rank * chunk..(rank + 1) * chunk])?;
                    }
                }
            }
            Part::Broadcast {
                count, dtype, root, ..
            } => {
                let root = usize::try_from(root).map_err(|_| INVALID_ARGUMENT)?;
                let Some(Part::Broadcast { send, .. }) = parts.get(root).copied() else {
                    return Err(INVALID_USAGE);
                };
                let data = read(send, count * element_size(dtype)?)?;
                for p in &parts {
                    match *p {
                        Part::Broadcast { recv, count: c, .. } if c == count => write(recv, &data)?,
                        _ => return Err(INVALID_USAGE),
                    }
                }
            }
            Part::Reduce {
                count,
                dtype,
                op,
                root,
                ..
            } => {
                let sends: Vec<(u64, usize)> = parts
                    .iter()
                    .map(|p| match *p {
                        Part::Reduce { send, count: c, .. } if c == count => Ok((send, count)),
                        _ => Err(INVALID_USAGE),
                    })
                    .collect::<Result<_, _>>()?;
                let total = reduce(&sends, dtype, op)?;
                let root = usize::try_from(root).map_err(|_| INVALID_ARGUMENT)?;
                match parts.get(root) {
                    Some(Part::Reduce { recv, .. }) => write(*recv, &total)?,
                    _ => return Err(INVALID_ARGUMENT),
                }
            }
            Part::Send { .. } | Part::Recv { .. } => {}
        }
    }
    // Point to point: each send meets the first unmatched receive from its rank on its peer.
    let mut taken = vec![Vec::new(); nranks];
    for (from, parts) in posts.iter().enumerate() {
        for part in parts {
            let Part::Send {
                send,
                count,
                dtype,
                peer,
            } = *part
            else {
                continue;
            };
            let to = usize::try_from(peer).map_err(|_| INVALID_ARGUMENT)?;
            let index = posts
                .get(to)
                .ok_or(INVALID_ARGUMENT)?
                .iter()
                .enumerate()
                .position(|(i, p)| {
                    matches!(*p, Part::Recv { peer, count: c, dtype: d, .. }
                        if peer as usize == from && c == count && d == dtype)
                        && !taken[to].contains(&i)
                })
                .ok_or(INVALID_USAGE)?;
            taken[to].push(index);
            if let Part::Recv { recv, .. } = posts[to][index] {
                write(recv, &read(send, count * element_size(dtype)?)?)?;
            }
        }
    }
    let receives = posts
        .iter()
        .flatten()
        .filter(|p| matches!(p, Part::Recv { .. }))
        .count();
    if receives != taken.iter().map(Vec::len).sum::<usize>() {
        return Err(INVALID_USAGE);
    }
    Ok(())
}

/// Posts `parts` of communicator `comm` as its next round and waits for the round to run.
fn post(comm: usize, parts: Vec<Part>) -> Status {
    let (mutex, condvar) = lock();
    let mut s = mutex.lock().unwrap_or_else(PoisonError::into_inner);
    let c = s.comms.get_mut(&comm).ok_or(INVALID_ARGUMENT)?;
    if c.aborted {
        return Err(INTERNAL_ERROR);
    }
    let key = (c.clique, c.next_round);
    c.next_round += 1;
    let (rank, nranks) = (c.rank, c.nranks);
    let round = s.rounds.entry(key).or_default();
    if round.posts.is_empty() {
        round.posts = vec![None; nranks];
    }
    round.posts[rank] = Some(parts);
    if round.posts.iter().all(Option::is_some) {
        let posts: Vec<Vec<Part>> = round.posts.iter().flatten().cloned().collect();
        let disagreement = disagreement(&posts);
        // A panic (a bug of the fake) must still end the round for every rank.
        let result = match &disagreement {
            Some(_) => INVALID_USAGE,
            None => match std::panic::catch_unwind(|| run_round(&posts)) {
                Ok(Ok(())) => 0,
                Ok(Err(code)) => code,
                Err(_) => INTERNAL_ERROR,
            },
        };
        round.result = Some(result);
        if let Some(message) = disagreement {
            for c in s.comms.values_mut().filter(|c| c.clique == key.0) {
                c.last_error = message.clone();
            }
        }
        condvar.notify_all();
    }
    let deadline = Instant::now() + RENDEZVOUS_LIMIT;
    loop {
        let aborted = s.comms.get(&comm).is_none_or(|c| c.aborted);
        let round = s.rounds.get_mut(&key).ok_or(INTERNAL_ERROR)?;
        if let Some(result) = round.result {
            // The last rank to leave removes the round.
            round.posts[rank] = None;
            if round.posts.iter().all(Option::is_none) {
                s.rounds.remove(&key);
            }
            return if result == 0 { Ok(()) } else { Err(result) };
        }
        if aborted {
            return Err(INTERNAL_ERROR);
        }
        let now = Instant::now();
        if now >= deadline {
            if let Some(c) = s.comms.get_mut(&comm) {
                c.last_error =
                    CString::from(c"the other ranks never arrived (fake rendezvous limit)");
            }
            return Err(INTERNAL_ERROR);
        }
        s = condvar
            .wait_timeout(s, (deadline - now).min(Duration::from_millis(50)))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Records `last_error` on `comm`.
fn note_error(comm: usize, message: &std::ffi::CStr) {
    if let Some(c) = state().comms.get_mut(&comm) {
        c.last_error = message.to_owned();
    }
}

/// Checks the stream and either collects `part` into the thread's group, adds it to the
/// stream's capture, or posts it.
fn submit(name: &'static str, comm: NcclComm, stream: CUstream, part: Part) -> c_int {
    entry(name, || {
        let comm = comm.addr();
        let device = state().comms.get(&comm).ok_or(INVALID_ARGUMENT)?.device;
        let capturing = {
            let world = world();
            if world.stream_device(stream).map_err(|_| INVALID_ARGUMENT)? != device {
                drop(world);
                note_error(comm, c"the stream is not of the communicator's device");
                return Err(INVALID_ARGUMENT);
            }
            world.is_capturing(stream)
        };
        let captured = capturing.then(|| stream.expose_provenance());
        let grouped = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.0 > 0 {
                g.1.push((comm, part, captured));
                true
            } else {
                false
            }
        });
        match (grouped, captured) {
            (true, _) => Ok(()),
            (false, Some(stream)) => capture(comm, stream, vec![part]),
            (false, None) => post(comm, vec![part]),
        }
    })
}

/// `ncclResult_t ncclGetVersion(int *version)`.
///
/// # Safety
/// `version` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("ncclGetVersion", || unsafe {
        crate::entry::put(version, VERSION)
    })
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId *id)`: a fresh clique number in the first bytes.
///
/// # Safety
/// `id` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut NcclUniqueId) -> c_int {
    entry("ncclGetUniqueId", || {
        let mut s = state();
        s.next_id += 1;
        let mut internal = [0u8; 128];
        internal[..8].copy_from_slice(&s.next_id.to_le_bytes());
        internal[8..16].copy_from_slice(b"cuhalfak");
        // SAFETY: forwarded caller contract.
        unsafe { crate::entry::put(id, NcclUniqueId { internal }) }
    })
}

fn new_comm(s: &mut State, clique: u64, rank: usize, nranks: usize, device: i32) -> usize {
    let handle = world().new_handle();
    s.comms.insert(
        handle,
        Comm {
            clique,
            rank,
            nranks,
            device,
            next_round: 0,
            aborted: false,
            async_error: 0,
            last_error: CString::default(),
        },
    );
    handle
}

/// `ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)`:
/// the current context's device becomes the rank's.
///
/// # Safety
/// `comm` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    id: NcclUniqueId,
    rank: c_int,
) -> c_int {
    entry("ncclCommInitRank", || {
        let nranks = usize::try_from(nranks).map_err(|_| INVALID_ARGUMENT)?;
        let rank = usize::try_from(rank).map_err(|_| INVALID_ARGUMENT)?;
        if nranks == 0 || rank >= nranks || &id.internal[8..16] != b"cuhalfak" {
            return Err(INVALID_ARGUMENT);
        }
        let (_, device) = world().current_context()?;
        let clique = u64::from_le_bytes(id.internal[..8].try_into().unwrap_or_default());
        let handle = {
            let mut s = state();
            *s.joined.entry(clique).or_default() += 1;
            new_comm(&mut s, clique, rank, nranks, device)
        };
        lock().1.notify_all();
        // SAFETY: forwarded caller contract.
        unsafe { crate::entry::put(comm, crate::world::handle(handle)) }?;
        // As NCCL: inside a group the rank waits for its peers at the group's end, else now.
        let grouped = GROUP.with(|g| g.borrow().0) > 0;
        if grouped {
            JOINING.with(|j| j.borrow_mut().push(handle));
            Ok(())
        } else {
            await_join(handle)
        }
    })
}

/// Waits until every rank of `comm`'s clique joined, the communicator is aborted (an error, as
/// NCCL's blocked initialization returns after `ncclCommAbort`), or the rendezvous limit.
fn await_join(comm: usize) -> Status {
    let (mutex, condvar) = lock();
    let mut s = mutex.lock().unwrap_or_else(PoisonError::into_inner);
    let deadline = Instant::now() + RENDEZVOUS_LIMIT;
    loop {
        let c = s.comms.get(&comm).ok_or(INVALID_ARGUMENT)?;
        if c.aborted {
            return Err(INTERNAL_ERROR);
        }
        if s.joined.get(&c.clique).copied().unwrap_or(0) >= c.nranks {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(INTERNAL_ERROR);
        }
        s = condvar
            .wait_timeout(s, (deadline - now).min(Duration::from_millis(50)))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// `ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)`.
///
/// # Safety
/// `comms` is valid for `ndev` writes; `devlist` is null or valid for `ndev` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NcclComm,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    entry("ncclCommInitAll", || {
        let n = usize::try_from(ndev).map_err(|_| INVALID_ARGUMENT)?;
        if n == 0 || comms.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mut s = state();
        s.next_id += 1;
        let clique = s.next_id | (1 << 63);
        for rank in 0..n {
            let device = if devlist.is_null() {
                rank as c_int
            } else {
                // SAFETY: the caller's contract: `devlist` holds `ndev` entries.
                unsafe { *devlist.add(rank) }
            };
            crate::driver::check_device(device)?;
            let handle = new_comm(&mut s, clique, rank, n, device);
            // SAFETY: the caller's contract: `comms` has room for `ndev` handles.
            unsafe { *comms.add(rank) = crate::world::handle(handle) };
        }
        Ok(())
    })
}

fn end_comm(name: &'static str, comm: NcclComm, abort: bool) -> c_int {
    entry(name, || {
        let (mutex, condvar) = lock();
        let mut s = mutex.lock().unwrap_or_else(PoisonError::into_inner);
        if abort {
            // Aborting wakes this communicator's blocked parts, which then fail; the entry
            // stays (marked aborted) until they are gone.
            s.comms
                .get_mut(&comm.addr())
                .ok_or(INVALID_ARGUMENT)?
                .aborted = true;
            condvar.notify_all();
            Ok(())
        } else {
            s.comms
                .remove(&comm.addr())
                .map(|_| ())
                .ok_or(INVALID_ARGUMENT)
        }
    })
}

/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: NcclComm) -> c_int {
    end_comm("ncclCommDestroy", comm, false)
}

/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`: fails every part of `comm` that is waiting
/// for other ranks, from any thread.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: NcclComm) -> c_int {
    end_comm("ncclCommAbort", comm, true)
}

/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)`: an aborted
/// communicator reports `ncclInternalError` (inject a failure of this call to model others).
///
/// # Safety
/// `error` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: NcclComm, error: *mut c_int) -> c_int {
    entry("ncclCommGetAsyncError", || {
        let code = {
            let s = state();
            let c = s.comms.get(&comm.addr()).ok_or(INVALID_ARGUMENT)?;
            if c.async_error != 0 {
                c.async_error
            } else if c.aborted {
                INTERNAL_ERROR
            } else {
                0
            }
        };
        // SAFETY: forwarded caller contract.
        unsafe { crate::entry::put(error, code) }
    })
}

/// `const char *ncclGetErrorString(ncclResult_t result)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    match result {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
    .as_ptr()
}

/// `const char *ncclGetLastError(ncclComm_t comm)`: the communicator's last message (the
/// pointer stays valid until the communicator's next error).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(comm: NcclComm) -> *const c_char {
    static EMPTY: &std::ffi::CStr = c"";
    state()
        .comms
        .get(&comm.addr())
        .map_or(EMPTY.as_ptr(), |c| c.last_error.as_ptr())
}

/// `ncclResult_t ncclGroupStart(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> c_int {
    entry("ncclGroupStart", || {
        GROUP.with(|g| g.borrow_mut().0 += 1);
        Ok(())
    })
}

/// `ncclResult_t ncclGroupEnd(void)`: the outermost end posts every collected part, one round
/// per communicator, each from its own thread so no rank waits for another rank of the group.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> c_int {
    entry("ncclGroupEnd", || {
        let parts = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.0 == 0 {
                return Err(INVALID_USAGE);
            }
            g.0 -= 1;
            Ok(if g.0 == 0 {
                std::mem::take(&mut g.1)
            } else {
                Vec::new()
            })
        })?;
        if GROUP.with(|g| g.borrow().0) == 0 {
            let joining = JOINING.with(|j| std::mem::take(&mut *j.borrow_mut()));
            joining.into_iter().try_for_each(await_join)?;
        }
        let captured = parts
            .iter()
            .filter(|(_, _, stream)| stream.is_some())
            .count();
        if captured != 0 && captured != parts.len() {
            return Err(INVALID_USAGE);
        }
        let mut by_comm: Vec<(usize, Option<usize>, Vec<Part>)> = Vec::new();
        for (comm, part, stream) in parts {
            match by_comm.iter_mut().find(|(c, _, _)| *c == comm) {
                Some((_, s, list)) if *s == stream => list.push(part),
                // One communicator's parts of a captured group on two streams.
                Some(_) => return Err(INVALID_USAGE),
                None => by_comm.push((comm, stream, vec![part])),
            }
        }
        if captured != 0 {
            // Each communicator's parts become one node of its stream's capture.
            return by_comm.into_iter().try_for_each(|(comm, stream, parts)| {
                capture(comm, stream.unwrap_or_default(), parts)
            });
        }
        let results: Vec<Status> = std::thread::scope(|scope| {
            let handles: Vec<_> = by_comm
                .into_iter()
                .map(|(comm, _, parts)| scope.spawn(move || post(comm, parts)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(INTERNAL_ERROR)))
                .collect()
        });
        results.into_iter().collect()
    })
}

macro_rules! collective {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $part:expr) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $ty),*, comm: NcclComm, stream: CUstream) -> c_int {
            submit(stringify!($name), comm, stream, $part)
        }
    };
}

collective!(
    /// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
    fn ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int)
        => Part::AllReduce { send: send.addr() as u64, recv: recv.addr() as u64, count, dtype, op });
collective!(
    /// `ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)`.
    fn ncclAllGather(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int)
        => Part::AllGather { send: send.addr() as u64, recv: recv.addr() as u64, count, dtype });
collective!(
    /// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
    fn ncclReduceScatter(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int)
        => Part::ReduceScatter { send: send.addr() as u64, recv: recv.addr() as u64, count, dtype, op });
collective!(
    /// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
    fn ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int)
        => Part::Broadcast { send: send.addr() as u64, recv: recv.addr() as u64, count, dtype, root });
collective!(
    /// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)`.
    fn ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, root: c_int)
        => Part::Reduce { send: send.addr() as u64, recv: recv.addr() as u64, count, dtype, op, root });
collective!(
    /// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`.
    fn ncclSend(send: *const c_void, count: usize, dtype: c_int, peer: c_int)
        => Part::Send { send: send.addr() as u64, count, dtype, peer });
collective!(
    /// `ncclRecv(recvbuff, count, datatype, peer, comm, stream)`.
    fn ncclRecv(recv: *mut c_void, count: usize, dtype: c_int, peer: c_int)
        => Part::Recv { recv: recv.addr() as u64, count, dtype, peer });
