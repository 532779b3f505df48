//! [`Shared`]: the state a context shares with its zone lists and submissions (backend,
//! sink track, event pool, submission slots, pending queue, collector state, counters). Its
//! behaviour is spread by concept: `collect`, `calibration`, `activity`, and `submission`.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::collect::CollectState;
use super::event_bias::EventBiases;
use super::fine_source::FineSource;
use super::pending::Pending;
use super::sampling::FineSampling;
use super::stats::{Counters, DropCounts};
use crate::backend::EventBackend;
use crate::cupti::CuptiSession;
use crate::hook::Verbosity;
use crate::list::ListInner;
use crate::lock::lock;
use crate::pool::TimingEventPool;
use crate::sink::{DropReason, Sink, TrackId};

pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn EventBackend>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) track: TrackId,
    /// The track's (queue's) name.
    pub(crate) name: String,
    /// Storage of the submissions in flight, recycled.
    pub(crate) slots: crate::submission::Slots,
    /// Submissions traced so far (their ordinals).
    pub(crate) ordinals: AtomicU64,
    /// The ordinal up to which the completion side said submissions completed
    /// ([`crate::TraceContext::completed`]): their collection asks the driver nothing more.
    pub(crate) complete_through: AtomicU64,
    pub(crate) verbosity: Verbosity,
    pub(crate) pool: TimingEventPool,
    pub(crate) names: Mutex<HashSet<Arc<str>>>,
    pub(crate) pending: Mutex<VecDeque<Pending>>,
    pub(crate) collect: Mutex<CollectState>,
    pub(crate) closed: AtomicBool,
    /// The zone-stamp ring ([`crate::stamps`]).
    pub(crate) stamps: Mutex<crate::stamps::StampRing>,
    /// FINE with a stamp ring: stamped dispatches are timed by their own stamps.
    pub(crate) takes_stamps: bool,
    pub(crate) rebase_after_ns: u64,
    pub(crate) counters: Counters,
    /// The CUPTI session FINE command zones are timed from, if any.
    pub(crate) cupti: Option<Arc<CuptiSession>>,
    pub(crate) fine_source: FineSource,
    pub(crate) cupti_unavailable: Option<&'static str>,
    /// What events add to a command's zone at each placement, measured when the context was
    /// made (FINE zones from events only); collection takes it off.
    pub(crate) event_biases: EventBiases,
    /// Which replays FINE times from CUPTI ([`FineSampling::Every`] unless FINE is from CUPTI).
    pub(crate) sampling: FineSampling,
}

impl Shared {
    pub(crate) fn intern(&self, name: &str) -> Arc<str> {
        let mut names = lock(&self.names);
        if let Some(n) = names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(n.clone());
        n
    }

    pub(crate) fn count_dropped(&self, reason: DropReason, count: u64) {
        self.counters.dropped[DropCounts::index(reason)].fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn enqueue(&self, list: Arc<ListInner>, generation: u64) {
        lock(&self.pending).push_back(Pending::List { list, generation });
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let bases = lock(&self.collect).bases;
        if let Ok(_bound) = self.backend.enter() {
            for base in bases {
                // SAFETY: the base events were created by this backend and are destroyed once,
                // here.
                unsafe { self.backend.destroy_event(base.0) };
            }
        }
        let stamps = self
            .stamps
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stamps.free(&*self.backend);
    }
}
