//! Matching CUPTI activity records to a list's activity-timed commands: finding each
//! command's record among those delivered, flushing CUPTI when some are late, and giving up
//! after [`ACTIVITY_PATIENCE`] collections. Collection calls it once a list's events are in;
//! the times go to `cs.command_times` for `collect` to emit.

use super::collect::CollectState;
use super::shared::Shared;
use crate::list::{ListState, Record};

/// Collections a list with activity-timed commands waits for its records once its events
/// completed, before its command zones are given up on.
pub(crate) const ACTIVITY_PATIENCE: u32 = 16;

impl Shared {
    /// Whether the list's activity-timed commands still wait for their records (counted, up to
    /// [`ACTIVITY_PATIENCE`] collections). Fills `cs.command_times` when they arrived.
    pub(crate) fn activity_pending(&self, cs: &mut CollectState, state: &mut ListState) -> bool {
        cs.command_times.clear();
        if state.commands == 0 {
            return false;
        }
        match self.command_times_flushing(cs, state) {
            Some(true) => false,
            Some(false) => {
                state.activity_waits += 1;
                if state.activity_waits < ACTIVITY_PATIENCE {
                    return true;
                }
                // Records that never came (lost by CUPTI, or a submission whose launches did
                // not match its commands): the command zones are dropped, the rest shown.
                cs.command_times.clear();
                false
            }
            None => false,
        }
    }

    /// As [`Shared::command_times`], flushing CUPTI first when the records are not all in yet
    /// (once per collection: a flush is only worth its cost when a list is waiting for it).
    fn command_times_flushing(&self, cs: &mut CollectState, state: &mut ListState) -> Option<bool> {
        if self.sampling.samples() {
            self.refresh_cupti_clock(cs);
        }
        let found = self.command_times(cs, state);
        if found != Some(false) || cs.flushed {
            return found;
        }
        let session = self.cupti.as_ref()?;
        cs.flushed = true;
        // A failure leaves the records for a later collection.
        if session.flush().is_err() {
            return found;
        }
        self.command_times(cs, state)
    }

    /// Finds the activity records of `state`'s commands among those CUPTI delivered, takes them,
    /// and puts each command's times (trace clock) in `cs.command_times`. `Some(false)`: not all
    /// arrived yet; `None`: they can never match (no CUPTI, or launches and commands differ).
    ///
    /// Records are keyed (graph: the node cuhal added; otherwise: the launch's correlation id),
    /// sorted once, and each command looks its key up: O(n log n) in the list's records, no
    /// allocation once the scratch vectors have grown.
    fn command_times(&self, cs: &mut CollectState, state: &mut ListState) -> Option<bool> {
        let session = self.cupti.as_ref()?;
        let ids = &state.ids;
        let commands = state.commands as usize;
        // A graph is one launch whose records carry node ids; a deferred replay is one launch
        // per command, in order.
        let graph = ids.len() == 1
            && state
                .records
                .iter()
                .any(|r| matches!(r, Record::Command { node_id, .. } if *node_id != 0));
        if !graph && ids.len() != commands {
            return None;
        }
        let clock = cs.cupti_clock?;
        cs.launch_ids.clear();
        cs.launch_ids.extend_from_slice(ids);
        cs.launch_ids.sort_unstable();
        session.with_arrived(|arrived| {
            cs.candidates.clear();
            for (i, a) in arrived.iter().enumerate() {
                if cs.launch_ids.binary_search(&a.correlation_id).is_ok() {
                    let key = if graph {
                        a.node_id
                    } else {
                        u64::from(a.correlation_id)
                    };
                    cs.candidates.push((key, i));
                }
            }
            if cs.candidates.len() < commands {
                return Some(false);
            }
            cs.candidates.sort_unstable();
            cs.used.clear();
            cs.used.resize(cs.candidates.len(), false);
            cs.matched.clear();
            let mut ordinal = 0usize;
            for record in &state.records {
                let Record::Command { node_id, .. } = record else {
                    continue;
                };
                let key = if graph {
                    *node_id
                } else {
                    u64::from(ids[ordinal])
                };
                ordinal += 1;
                let found = if graph && key == 0 {
                    None
                } else {
                    let first = cs.candidates.partition_point(|&(k, _)| k < key);
                    (first..cs.candidates.len())
                        .take_while(|&c| cs.candidates[c].0 == key)
                        .find(|&c| !cs.used[c])
                };
                match found {
                    Some(c) => {
                        cs.used[c] = true;
                        cs.matched.push(cs.candidates[c].1);
                    }
                    // A graph command whose node has no record of its own (an indirect
                    // dispatch's, whose node is not reported): its zone alone is dropped.
                    None if graph => cs.matched.push(usize::MAX),
                    None => return Some(false),
                }
            }
            if graph && cs.matched.iter().all(|&i| i == usize::MAX) {
                // Nothing matched: the records may be late.
                return Some(false);
            }
            for &i in &cs.matched {
                cs.command_times.push(
                    arrived
                        .get(i)
                        .map(|a| (clock.to_trace_ns(a.start), clock.to_trace_ns(a.end))),
                );
            }
            // Take every record of the list's launches (matched or not), highest index first so
            // the lower ones stay valid.
            cs.taken.clear();
            cs.taken.extend(cs.candidates.iter().map(|&(_, i)| i));
            cs.taken.sort_unstable_by(|a, b| b.cmp(a));
            for &i in &cs.taken {
                arrived.swap_remove(i);
            }
            Some(true)
        })
    }
}
