//! The completion policy's decisions (`cuhal_scheduler::policy`: `after_nap`, `gathers`,
//! `needed`, `defers`) against a model written here from the ladder as docs/architecture.md
//! states it: random sequences of events (work handed over, a host waiter parks, a hurry, a
//! submitter wants room or gets it, the newest work completes, time passes in nap steps, the
//! queue shuts down), and after each one every decision the completion thread could take then.

use std::time::Duration;

use cuhal_scheduler::policy::{
    GatherView, NAP, NAP_STEP, Rung, after_nap, defers, gathers, needed,
};
use proptest::prelude::*;

/// One thing that happens to a queue's completion side.
#[derive(Debug, Clone)]
enum Event {
    /// An action is handed over; `checked` on completion, or not.
    HandOver { checked: bool },
    /// A host thread parks on the newest action's signal.
    WaiterParks,
    /// A hurry (a nudge from a host wait) is raised.
    Hurry,
    /// A submitter starts waiting for room.
    RoomWanted,
    /// A submitter got its room.
    RoomGiven,
    /// The newest action's completion event completes.
    Completes,
    /// One nap step passes, its sleep ended early by a hurry or not.
    NapStep,
    /// The completion thread takes the batch (the round starts over).
    Take,
    /// The worker is done: the queue shuts down.
    ShutDown,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => any::<bool>().prop_map(|checked| Event::HandOver { checked }),
        1 => Just(Event::WaiterParks),
        1 => Just(Event::Hurry),
        1 => Just(Event::RoomWanted),
        1 => Just(Event::RoomGiven),
        2 => Just(Event::Completes),
        4 => Just(Event::NapStep),
        1 => Just(Event::Take),
        1 => Just(Event::ShutDown),
    ]
}

/// The model's view of the queue.
#[derive(Debug, Default)]
struct Model {
    waiting: usize,
    urgent: usize,
    room_waiters: usize,
    hurried: bool,
    worker_done: bool,
    /// The newest action handed over: (checked, a host thread parked on it, still running).
    newest: Option<(bool, bool, bool)>,
    /// How long the current wait has napped.
    napped: Duration,
}

impl Model {
    fn apply(&mut self, event: &Event) {
        match *event {
            Event::HandOver { checked } => {
                self.waiting += 1;
                // Work checked on completion is urgent when it is pushed.
                self.urgent += usize::from(checked);
                self.newest = Some((checked, false, true));
            }
            Event::WaiterParks => {
                if let Some(newest) = &mut self.newest {
                    newest.1 = true;
                }
                // A waiter that parks hurries the queue.
                self.hurried = true;
            }
            Event::Hurry => self.hurried = true,
            Event::RoomWanted => self.room_waiters += 1,
            Event::RoomGiven => self.room_waiters = self.room_waiters.saturating_sub(1),
            Event::Completes => {
                if let Some(newest) = &mut self.newest {
                    newest.2 = false;
                }
            }
            Event::NapStep => self.napped += NAP_STEP,
            Event::Take => {
                self.waiting = 0;
                self.urgent = 0;
                // The take consumes the hurry, and a new wait starts its nap window.
                self.hurried = false;
                self.napped = Duration::ZERO;
            }
            Event::ShutDown => self.worker_done = true,
        }
    }

    /// The ladder of a wait nobody needs, as the model states it.
    fn rung(&self, spin: Duration) -> Rung {
        if self.hurried {
            // Hurried: poll for the rest of the window, or the spin, whichever is longer.
            let rest = if self.napped >= NAP {
                Duration::ZERO
            } else {
                NAP - self.napped
            };
            Rung::Poll(if rest > spin { rest } else { spin })
        } else if self.napped >= NAP {
            Rung::Block
        } else {
            Rung::Nap
        }
    }

    /// Whether the completion thread sleeps for the gather.
    fn gathers(&self, gather: Duration, batch: usize) -> bool {
        if gather.is_zero() || self.worker_done {
            return false;
        }
        // Anything that needs the thread now ends (or skips) the gather.
        let somebody_needs_it = self.urgent > 0 || self.room_waiters > 0 || self.hurried;
        let full = self.waiting >= batch;
        !somebody_needs_it && !full
    }

    /// Whether the newest action's completion is needed soon.
    fn needed(&self) -> bool {
        match self.newest {
            Some((checked, parked, _)) => checked || parked || self.room_waiters > 0,
            None => self.room_waiters > 0,
        }
    }

    /// Whether the batch may wait for the next round.
    fn defers(&self, gather: Duration) -> bool {
        match self.newest {
            Some((_, _, running)) if !gather.is_zero() && !self.worker_done => {
                running && !self.needed()
            }
            _ => false,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After every event, each decision of the policy is the model's.
    #[test]
    fn the_policy_decides_as_the_model(
        events in proptest::collection::vec(event(), 1..64),
        gather_us in prop_oneof![Just(0u64), 1u64..2_000],
        batch in 1usize..8,
        spin_us in 0u64..1_000,
    ) {
        let gather = Duration::from_micros(gather_us);
        let spin = Duration::from_micros(spin_us);
        let mut model = Model::default();
        for event in &events {
            model.apply(event);
            let view = GatherView {
                gather,
                batch,
                waiting: model.waiting,
                urgent: model.urgent,
                room_waiters: model.room_waiters,
                worker_done: model.worker_done,
                hurried: model.hurried,
            };
            prop_assert_eq!(gathers(&view), model.gathers(gather, batch), "gather after {:?}", event);
            prop_assert_eq!(
                after_nap(model.napped, model.hurried, spin),
                model.rung(spin),
                "ladder after {:?}",
                event
            );
            let (checked, parked) = model.newest.map_or((false, false), |n| (n.0, n.1));
            let need = needed(model.room_waiters, parked, checked);
            prop_assert_eq!(need, model.needed(), "need after {:?}", event);
            let newest = model.newest.map(|(_, _, running)| (need, running));
            prop_assert_eq!(
                defers(gather, model.worker_done, newest),
                model.defers(gather),
                "defer after {:?}",
                event
            );
        }
    }
}

/// The ladder's fixed points, spelled out: a wait nobody needs naps through the window and then
/// blocks; a hurry at any time turns it into polling for at least the spin.
#[test]
fn the_ladder_naps_then_blocks_and_a_hurry_polls() {
    let spin = Duration::from_micros(50);
    assert_eq!(after_nap(Duration::ZERO, false, spin), Rung::Nap);
    assert_eq!(after_nap(NAP, false, spin), Rung::Block);
    assert_eq!(after_nap(NAP, true, spin), Rung::Poll(spin));
    assert_eq!(after_nap(Duration::ZERO, true, spin), Rung::Poll(NAP));
}

/// By default a needed wait polls as long as a hurried nap would from the start of its wait (a
/// wait somebody needs from the outset must not hand its wake to the device's block sooner than
/// one hurried later): a future awaiting a 50 us kernel was woken by the block, 22 us late,
/// while the default spin was 50 us.
#[test]
fn by_default_a_needed_wait_polls_through_the_nap_window() {
    let spin = cuhal_scheduler::CompletionOptions::DEFAULT_SPIN;
    assert!(spin >= NAP, "{spin:?} < {NAP:?}");
    assert_eq!(after_nap(Duration::ZERO, true, spin), Rung::Poll(spin));
}
