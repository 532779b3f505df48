//! The completion policy: when the completion thread looks at a completion, how it waits for
//! one, and who may hurry it. Every timing decision of the completion side lives here; the
//! backend gives two primitives only ([`Backend::query_event`], [`Backend::block_on_event`]).
//!
//! The ladder of one wait for a completion event:
//!
//! 1. **Query** once (no wait).
//! 2. **Needed** (a host thread parked on the work's semaphores, a submitter waiting for room,
//!    work checked on completion, an urgent round): **spin**, querying every [`POLL_INTERVAL`]
//!    (every [`BUSY_QUERY_PACE`] while the device keeps issuing) for
//!    [`CompletionOptions::spin`]; then **block** on the device.
//! 3. **Not needed**: **nap** for up to [`NAP`], a query after each sleep of at most
//!    [`NAP_STEP`] on a parker of the policy's own. A hurry (a `Hurry`) ends the sleep at once
//!    and turns the rest of the wait into polling (no sleep at all) until the nap window ends
//!    or, if later, [`CompletionOptions::spin`] after the hurry was seen; then **block**.
//!
//! Between batches: after a batch nobody needed, finished work **gathers** for
//! [`CompletionOptions::gather`] (ended early by a hurry, urgent work or a full
//! [`CompletionOptions::gather_batch`]); a batch nobody needs whose newest work still runs is
//! **deferred** to the next round. With nothing to retire, the thread looks for work for
//! [`IDLE_SPIN`], then parks: an idle queue burns no core, and a queue nobody waits on never
//! spins (it naps, then blocks).
//!
//! Who hurries: a host thread about to park on the queue's work ([`CompletionNudge`], from
//! [`DeviceEvent::awaited`], which a pending
//! `wait_async` future calls when it registers), a submitter waiting for room, and the push of
//! urgent work (work checked on completion, work a host thread parked on before it was issued).
//!
//! [`Backend::query_event`]: crate::Backend::query_event
//! [`Backend::block_on_event`]: crate::Backend::block_on_event
//! [`CompletionNudge`]: crate::CompletionNudge

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;
#[cfg(not(loom))]
use std::time::Instant;

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::action::{Body, Finished};
use crate::backend::Backend;
use crate::guard;
pub use crate::options::CompletionOptions;
use crate::shared::Shared;
use crate::spin::spin_until;
use crate::sync::{Ordering, Parker};

/// How long the worker and completion threads look for new work before they park when their
/// queue is empty: a parked thread takes 5.6 us (p50, H200 host) to wake, a spinning one a
/// fraction of one (docs/decisions/scheduler.md, "Spinning is bounded").
pub const IDLE_SPIN: Duration = Duration::from_micros(100);

/// The pause between two queries of a spinning (or hurried) wait: about a query's own cost, so
/// that a completion is seen a fraction of a microsecond after it lands. Bench case 15 (a
/// `wait_async` future's wake) measured 1 us against this in one run (`git show bd2a39e:docs/benchmarks.md`).
pub const POLL_INTERVAL: Duration = Duration::from_nanos(200);

/// The pause instead while the device's queues keep issuing (two issues within this time):
/// every query takes the driver's lock those issues need; chosen by bench case 14 on the H200
/// (docs/decisions/semaphore.md, "Host waits on recorded device events").
pub const BUSY_QUERY_PACE: Duration = Duration::from_micros(10);

/// How long a wait nobody needs naps before it blocks on the device: blocking enqueues device
/// work (a wait and a blocking-sync record) that made bench case 3's gap 2.3 us longer on the
/// H200, while short work completes within the naps (docs/decisions/device.md, "A completion
/// nobody waits for naps").
pub const NAP: Duration = Duration::from_micros(500);

/// The longest sleep of one nap step: the kernel rounds it up (timer slack), so a nap costs a
/// wake-up every 50 to 100 us, not a core.
pub const NAP_STEP: Duration = Duration::from_micros(20);

/// How long a host semaphore wait polls a recorded device event before it parks (and hurries
/// the queue whose work it waits for); bench case 2 on the H200 (docs/decisions/semaphore.md).
pub const HOST_WAIT_SPIN: Duration = Duration::from_micros(200);

/// A spin budget no wait outlasts (a century), for budgets too large for an `Instant`.
#[cfg(not(loom))]
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The next rung of a wait nobody needed yet, after one nap step (see [`after_nap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// Nap again (a sleep of at most [`NAP_STEP`], then a query).
    Nap,
    /// Poll, never sleeping, for this long; then block.
    Poll(Duration),
    /// Block on the device.
    Block,
}

/// The decision after one nap step of a wait nobody needed, `napped` after the nap began:
/// hurried (the step's sleep was ended by a hurry, or one came by the end of the nap window),
/// poll until the window's end or `spin` from now, whichever is later; else nap on while the
/// window ([`NAP`]) lasts, and block once it is over.
pub fn after_nap(napped: Duration, hurried: bool, spin: Duration) -> Rung {
    if hurried {
        Rung::Poll(NAP.saturating_sub(napped).max(spin))
    } else if napped < NAP {
        Rung::Nap
    } else {
        Rung::Block
    }
}

/// What the completion thread sees when it decides whether to gather after a batch nobody
/// needed (see [`gathers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherView {
    /// The queue's gather ([`CompletionOptions::gather`]).
    pub gather: Duration,
    /// The gather batch ([`CompletionOptions::gather_batch`], at least 1).
    pub batch: usize,
    /// Finished actions handed over and not taken yet.
    pub waiting: usize,
    /// Urgent ones among them (work checked on completion, work a host thread parked on).
    pub urgent: usize,
    /// Submitters waiting for room.
    pub room_waiters: usize,
    /// Whether the worker is done (the queue shuts down: drain at once).
    pub worker_done: bool,
    /// Whether a hurry is raised.
    pub hurried: bool,
}

/// Whether the completion thread sleeps for the gather: the queue gathers, fewer than a gather
/// batch and no urgent work wait, nobody waits for room or hurried, and the queue is not
/// shutting down.
pub fn gathers(view: &GatherView) -> bool {
    !view.gather.is_zero()
        && view.waiting < view.batch
        && view.urgent == 0
        && view.room_waiters == 0
        && !view.worker_done
        && !view.hurried
}

/// Whether someone needs an action's completion seen soon: a host thread `parked` on one of its
/// signal semaphores, `room_waiters` submitters waiting for room, or anybody at all when its
/// work is `checked` on completion (it recorded no device signal, so nobody else can poll it).
pub fn needed(room_waiters: usize, parked: bool, checked: bool) -> bool {
    room_waiters > 0 || parked || checked
}

/// Whether a batch may wait for the next round (see `may_defer`): the queue gathers and is not
/// shutting down (`worker_done`), and the batch's newest issued action is there, nobody
/// `needed` it, and its completion event was `running` at one query (no wait).
pub fn defers(gather: Duration, worker_done: bool, newest: Option<(bool, bool)>) -> bool {
    !gather.is_zero()
        && !worker_done
        && matches!(newest, Some((needed, running)) if !needed && running)
}

/// How much a wait for a completion event is needed (see the ladder in the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Somebody needs it: spin, then block.
    Now,
    /// Nobody does yet: nap (polling once hurried), then block.
    Lazily,
}

/// Waits for `event` along the ladder; `Ok` once it completed, `Err` when it reports an error.
/// `nap` is the completion thread's nap parker.
pub(crate) fn wait<B: Backend>(
    shared: &Shared<B>,
    nap: &Parker,
    event: &B::Event,
    need: Need,
) -> Result<(), Failure> {
    if query(shared, event)? {
        return Ok(());
    }
    // Under loom (no time) every bounded phase ran out at once: straight to the block.
    #[cfg(not(loom))]
    {
        let spin = shared.options.completion.spin;
        let done = match need {
            Need::Now => poll(shared, event, deadline(Instant::now(), spin))?,
            Need::Lazily => nap_phase(shared, nap, event, spin)?,
        };
        if done {
            return Ok(());
        }
    }
    #[cfg(loom)]
    let _ = (nap, need);
    block(shared, event)
}

/// `now + budget`, or a century on when that cannot be represented.
#[cfg(not(loom))]
fn deadline(now: Instant, budget: Duration) -> Instant {
    now.checked_add(budget).unwrap_or(now + FOREVER)
}

/// The nap: sleeps of at most [`NAP_STEP`], a query after each, for [`NAP`]; once hurried, polls
/// until the nap's end or `spin` after the hurry, whichever is later. Whether `event` completed.
#[cfg(not(loom))]
fn nap_phase<B: Backend>(
    shared: &Shared<B>,
    parker: &Parker,
    event: &B::Event,
    spin: Duration,
) -> Result<bool, Failure> {
    let start = Instant::now();
    loop {
        let hurried = shared.hurry.nap(parker, NAP_STEP);
        let now = Instant::now();
        if !hurried && query(shared, event)? {
            return Ok(true);
        }
        // A hurry that came with the nap's last query still polls rather than blocks.
        let late_hurry = !hurried && now >= start + NAP && shared.hurry.is_hurried();
        match after_nap(now - start, hurried || late_hurry, spin) {
            Rung::Nap => {}
            Rung::Poll(budget) => return poll(shared, event, deadline(now, budget)),
            Rung::Block => return Ok(false),
        }
    }
}

/// Queries `event` every [`POLL_INTERVAL`] (every [`BUSY_QUERY_PACE`] while the device keeps
/// issuing, see [`Backend::traffic`]) until it completes, fails, or `until` passes. Never sleeps.
#[cfg(not(loom))]
fn poll<B: Backend>(shared: &Shared<B>, event: &B::Event, until: Instant) -> Result<bool, Failure> {
    let backend = &shared.backend;
    let mut traffic = cuhal_semaphore::Traffic::new(guard::traffic(backend), BUSY_QUERY_PACE);
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(false);
        }
        let pause = if traffic.busy(guard::traffic(backend), now) {
            traffic.pace().max(POLL_INTERVAL)
        } else {
            POLL_INTERVAL
        };
        let next = (now + pause).min(until);
        while Instant::now() < next {
            std::hint::spin_loop();
        }
        if query(shared, event)? {
            return Ok(true);
        }
    }
}

/// The backend's query, a panic in it counted as a failure.
fn query<B: Backend>(shared: &Shared<B>, event: &B::Event) -> Result<bool, Failure> {
    catch_unwind(AssertUnwindSafe(|| shared.backend.query_event(event))).unwrap_or_else(|_| {
        Err(Failure::msg(
            "the backend panicked while querying a completion event",
        ))
    })
}

/// The backend's block, a panic in it counted as a failure.
fn block<B: Backend>(shared: &Shared<B>, event: &B::Event) -> Result<(), Failure> {
    catch_unwind(AssertUnwindSafe(|| shared.backend.block_on_event(event))).unwrap_or_else(|_| {
        Err(Failure::msg(
            "the backend panicked while waiting for a completion event",
        ))
    })
}

/// With nothing to retire: looks for work (`ready`) for [`IDLE_SPIN`]; whether it came.
pub(crate) fn idle_spin(ready: impl FnMut() -> bool) -> bool {
    spin_until(IDLE_SPIN, ready)
}

/// After a batch nobody waited for: sleeps for the queue's gather (or until woken by a
/// submitter that needs room, by urgent work, by a hurry, or by the push that makes a
/// gather batch wait), so that the next batch holds the actions of many submissions instead of
/// one or two. Skipped when enough actions already wait, or once the worker is done (shutdown
/// drains at once).
pub(crate) fn gather<B: Backend>(shared: &Shared<B>, parker: &Parker) {
    let options = &shared.options.completion;
    let mut view = GatherView {
        gather: options.gather,
        batch: options.batch(),
        waiting: shared.finished_len.load(Ordering::Acquire),
        urgent: 0,
        room_waiters: shared.room_waiters.load(Ordering::Relaxed),
        worker_done: shared.worker_done.load(Ordering::Acquire),
        hurried: false,
    };
    if !gathers(&view) {
        return;
    }
    let hurry = &shared.hurry;
    let hurried = hurry.begin_gather();
    // Under the list's lock, as `push_finished` reads `gathering`: either the pusher of work
    // that needs this thread sees `gathering` and wakes it, or this sees that work. And after
    // `gathering` is raised in the word a hurry raises its flag in (see `Hurry`): either it
    // unparks this thread, or this sees it hurried.
    (view.waiting, view.urgent) = shared.finished_waiting();
    view.hurried = hurried || hurry.is_hurried();
    if gathers(&view) {
        // Under loom, which has no time, a gather that timed out at once is one of the runs the
        // real thread can have (a loom timed park would wait for an unpark that may never come):
        // the handshake above is modelled, the sleep is not.
        #[cfg(not(loom))]
        parker.park_timeout(options.gather);
        #[cfg(loom)]
        let _ = parker;
    }
    hurry.end_gather();
}

/// Whether `batch` may wait for the next round instead of being retired now: the queue gathers
/// and is not shutting down, nobody needs the batch's newest action (see [`wanted`]), and its
/// completion event has not completed yet (one query, no wait). Such a batch was mostly taken
/// the moment its last action was handed over, so its newest work has barely started: waiting
/// for it would cost a nap and a wake-up per batch, while one gather later it is done and the
/// next round retires it (first, in issue order) without a wait.
pub(crate) fn may_defer<B: Backend>(shared: &Shared<B>, batch: &VecDeque<Finished<B>>) -> bool {
    let gather = shared.options.completion.gather;
    let worker_done = shared.worker_done.load(Ordering::Acquire);
    if !defers(gather, worker_done, Some((false, true))) {
        return false;
    }
    let newest = batch.iter().rev().find_map(|f| match f {
        Finished::Issued {
            body,
            event,
            checked,
            ..
        } => Some((body, event, *checked)),
        Finished::Failed { .. } => None,
    });
    let newest = newest.map(|(body, event, checked)| {
        let wanted = wanted(shared, body, checked);
        // Queried only for a batch nobody needs.
        let running = !wanted
            && matches!(
                catch_unwind(AssertUnwindSafe(|| event.query())),
                Ok(Ok(false))
            );
        (wanted, running)
    });
    defers(gather, worker_done, newest)
}

/// Whether someone needs this action's completion seen soon: a host thread parked on one of its
/// signal semaphores, a submitter waiting for room, or anybody at all when its work is `checked`
/// on completion (it recorded no device signal, so nobody else can poll it).
pub(crate) fn wanted<B: Backend>(shared: &Shared<B>, body: &Body<B>, checked: bool) -> bool {
    needed(
        shared.room_waiters.load(Ordering::Relaxed),
        body.has_parked_waiters(),
        checked,
    )
}
