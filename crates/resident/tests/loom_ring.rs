//! loom models of every lock-free hand-over of the resident ring, each explored up to
//! `LOOM_MAX_PREEMPTIONS` preemptions:
//!
//! - the ring itself, wrapping a ring of two: a descriptor the producer publishes is read whole
//!   and in order by the consumer (loom's cell reports a read racing a write), and a full ring
//!   is never overwritten;
//! - the ring with its completion words and the host's mirror, the host gating room on what it
//!   retired (as the queue does): a completion word is read for its own submission only;
//! - the doorbell: two submitters racing the consumer's idle exit, restarts done as the crate
//!   does them (the winning ringer spawns a consumer): one consumer at a time, no work stranded;
//! - a host-pushed slot value waking a consumer that went idle on the wait (the slot listener's
//!   ring);
//! - a failed consumer start giving the doorbell back while another submitter rings;
//! - the slot table: signals (`fetch_max`) and a failure racing a reader: values never go back,
//!   a failure is never lost or overwritten, and a reached value carries what was written
//!   before it;
//! - the host mirror's retiring, two threads at once (an exiting consumer and its successor):
//!   each submission finished once and in order, `retired` never going back, nothing written
//!   left unretired;
//! - the slot listener hand-off: waits for different values sharing a slot's listener, racing a
//!   host signal: every reached wait's value is pushed, and no wait is left without a listener;
//! - a device scheduler's chains: two submitters ringing (`ChainStarter`) while a chain exits
//!   idle (`chain_try_exit`, the kernel's steps), chains run one after another as a stream runs
//!   them: no work stranded, and every chain started is one that ends.
//!
//! Built and run only with `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it).
#![cfg(loom)]

#[path = "../../semaphore/tests/common/loom.rs"]
mod common;

use common::model;
use cuhal_resident::{
    ChainStarter, Completion, Consumer, Descriptor, Doorbell, FAILED, Full, HostMemory, MAX_WAITS,
    RetireQueue, SharedMemory, SlotGate, SlotState, SlotTable, SlotValue, chain_try_exit, split,
};
use cuhal_semaphore::{Listener, NoEvent, Semaphore, SemaphoreId, SemaphoreOptions};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread::{self, JoinHandle};

/// The descriptor at the ring's head, once the producer has published one.
fn next_head(consumer: &Consumer<HostMemory>) -> Descriptor {
    loop {
        match consumer.peek().unwrap() {
            Some(d) => return d,
            None => thread::yield_now(),
        }
    }
}

/// Descriptor `i` with every field set from `i`, so that a torn or stale copy differs somewhere.
fn descriptor(i: u64) -> Descriptor {
    let mut d = Descriptor {
        sequence: 0,
        executable: 100 + i,
        bindings: 200 + i,
        wait_count: 1 + i as u32,
        signal_count: 2 + i as u32,
        flags: 300 + i,
        reserved: [400 + i, 500 + i, 600 + i],
        ..Descriptor::default()
    };
    for (k, w) in d.waits.iter_mut().enumerate() {
        *w = SlotValue {
            value: 1000 * i + k as u64,
            slot: k as u32,
            reserved: i as u32,
        };
    }
    for (k, s) in d.signals.iter_mut().enumerate() {
        *s = SlotValue {
            value: 2000 * i + k as u64,
            slot: (MAX_WAITS + k) as u32,
            reserved: i as u32,
        };
    }
    d
}

/// What the consumer must read for sequence `i`: the descriptor with its sequence filled in.
fn expected(i: u64) -> Descriptor {
    Descriptor {
        sequence: i,
        ..descriptor(i)
    }
}

/// Four descriptors through a ring of two (it wraps twice): each is read whole, in order, with
/// its own sequence; `Full` leaves the producer's count as it was, and the push after it takes
/// the same sequence; a peek repeated before `advance` reads the same descriptor.
#[test]
fn ring_wraps_whole_and_in_order() {
    const COUNT: u64 = 4;
    model("resident::ring_wraps_whole_and_in_order", || {
        let (mut producer, mut consumer) = split(HostMemory::new(2, 0).unwrap()).unwrap();
        let writer = thread::spawn(move || {
            for i in 0..COUNT {
                loop {
                    match producer.try_push(descriptor(i)) {
                        Ok(sequence) => {
                            assert_eq!(sequence, i);
                            assert_eq!(producer.produced(), i + 1);
                            break;
                        }
                        Err(Full { capacity }) => {
                            assert_eq!(capacity, 2);
                            assert_eq!(producer.produced(), i, "a refused push publishes nothing");
                            assert!(i >= 2, "a ring of two refuses only its third push");
                            thread::yield_now();
                        }
                    }
                }
            }
        });
        for i in 0..COUNT {
            let d = next_head(&consumer);
            assert_eq!(d, expected(i));
            assert_eq!(
                consumer.peek().unwrap(),
                Some(d),
                "the head stays until advance"
            );
            assert!(consumer.advance());
            assert_eq!(consumer.consumed(), i + 1);
        }
        writer.join().unwrap();
        assert_eq!(consumer.peek().unwrap(), None);
        assert!(!consumer.advance());
    });
}

/// Four submissions through a ring of two with completion words (each word used twice), the host
/// gating room on the submissions it retired (as the queue's `has_room` does) and retiring them
/// from the words in order, as the mirror does. The consumer advances, then writes the word (the
/// model scheduler's `step`; written before the advance, a retire could pass `consumed`). The
/// host never meets `Full` when it counted room (retired never passes consumed), and a word is
/// read as the submission's own only once the consumer wrote it (the previous lap's word decodes
/// to none).
#[test]
fn completion_words_retire_in_order() {
    const COUNT: u64 = 4;
    model("resident::completion_words_retire_in_order", || {
        let (mut producer, mut consumer) = split(HostMemory::new(2, 0).unwrap()).unwrap();
        let memory = producer.shared_memory();
        let host = thread::spawn(move || {
            let mut retired = 0u64;
            let retire = |retired: &mut u64, produced: u64| {
                while *retired < produced {
                    let word =
                        memory.completions()[(*retired % 2) as usize].load(Ordering::Acquire);
                    match Completion::decode(word, *retired) {
                        Some(completion) => {
                            assert_eq!(completion, Completion::Done);
                            *retired += 1;
                        }
                        None => break,
                    }
                }
            };
            for i in 0..COUNT {
                loop {
                    retire(&mut retired, producer.produced());
                    if producer.produced() - retired < 2 {
                        assert_eq!(producer.try_push(descriptor(i)), Ok(i));
                        break;
                    }
                    thread::yield_now();
                }
            }
            while retired < COUNT {
                retire(&mut retired, COUNT);
                if retired < COUNT {
                    thread::yield_now();
                }
            }
        });
        for i in 0..COUNT {
            let d = next_head(&consumer);
            assert_eq!(d, expected(i));
            assert!(consumer.advance());
            consumer.complete(d.sequence, Completion::Done.encode(d.sequence));
        }
        host.join().unwrap();
    });
}

/// The ring's consumer end, handed from one consumer thread to the next by the doorbell alone:
/// loom's cell reports two threads using it without the doorbell ordering them.
struct Exclusive(UnsafeCell<Consumer<HostMemory>>);

// SAFETY: only the doorbell's holder touches the cell (what the models check).
unsafe impl Sync for Exclusive {}

/// A resident queue reduced to its lock-free parts: the ring (the producer under its lock, as
/// `ResidentQueue::submit` holds it), the doorbell, the slot words, and the consumer threads the
/// ringers start (`Shared::start_consumer`: the new handle replaces the previous one, which is
/// joined).
struct Queue {
    producer: Mutex<cuhal_resident::Producer<HostMemory>>,
    consumer: Exclusive,
    memory: std::sync::Arc<HostMemory>,
    doorbell: Doorbell,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Threads holding the consumer (between winning the doorbell and handing it back).
    holders: AtomicUsize,
    /// Descriptors consumed.
    taken: AtomicUsize,
}

impl Queue {
    fn new(capacity: usize, slots: usize) -> Arc<Self> {
        let (producer, consumer) = split(HostMemory::new(capacity, slots).unwrap()).unwrap();
        Arc::new(Queue {
            memory: producer.shared_memory(),
            producer: Mutex::new(producer),
            consumer: Exclusive(UnsafeCell::new(consumer)),
            doorbell: Doorbell::new(),
            thread: Mutex::new(None),
            holders: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
        })
    }

    /// `ResidentQueue::submit`: publish under the producer lock, then ring, and start a consumer
    /// if this ring won the doorbell.
    fn submit(queue: &Arc<Self>, d: Descriptor) {
        queue.producer.lock().unwrap().try_push(d).unwrap();
        if queue.doorbell.ring() {
            Queue::start_consumer(queue);
        }
    }

    /// `Shared::start_consumer`.
    fn start_consumer(queue: &Arc<Self>) {
        let handle = {
            let queue = queue.clone();
            thread::spawn(move || queue.run_consumer())
        };
        let previous = queue.thread.lock().unwrap().replace(handle);
        if let Some(previous) = previous {
            previous.join().unwrap();
        }
    }

    /// `Shared::run_consumer` with an idle exit of zero: every idle look at the ring tries to
    /// exit. A descriptor is taken when its waits (slot, value) are reached.
    fn run_consumer(&self) {
        self.hold();
        loop {
            let seen = self.doorbell.seen();
            let progressed = self.consumer.0.with_mut(|c| {
                // SAFETY: this thread holds the doorbell (checked by `hold` and by loom's cell).
                let consumer = unsafe { &mut *c };
                let Some(d) = consumer.peek().unwrap() else {
                    return false;
                };
                let ready = d.waits().iter().all(|w| {
                    SlotTable::state(&self.memory.slots()[w.slot as usize], w.value)
                        == SlotState::Reached
                });
                if ready {
                    assert!(consumer.advance());
                    self.taken.fetch_add(1, Ordering::SeqCst);
                }
                ready
            });
            if progressed {
                continue;
            }
            self.holders.fetch_sub(1, Ordering::SeqCst);
            if self.doorbell.try_exit(seen) {
                return;
            }
            self.hold();
        }
    }

    /// Takes the consumer: nobody else may hold it.
    fn hold(&self) {
        assert_eq!(
            self.holders.fetch_add(1, Ordering::SeqCst),
            0,
            "two consumers at once"
        );
    }

    /// `ResidentQueue::join_consumers`.
    fn join_consumers(&self) {
        loop {
            let handle = self.thread.lock().unwrap().take();
            match handle {
                Some(handle) => handle.join().unwrap(),
                None => return,
            }
        }
    }

    /// Descriptors the consumer end has taken (no consumer may run).
    fn consumed(&self) -> u64 {
        // SAFETY: every consumer thread was joined.
        self.consumer.0.with(|c| unsafe { &*c }.consumed())
    }
}

/// A descriptor with no waits.
fn ready(i: u64) -> Descriptor {
    Descriptor {
        executable: i,
        ..Descriptor::default()
    }
}

/// Two submitters (a thread publishing one descriptor, the main one two in turn), each ringing
/// after its publish, against the consumers they start exiting idle (up to three starts): exactly
/// one consumer holds the ring at a time (the counter, and loom's cell, which needs the doorbell
/// to order one holder's last use before the next one's first), and once the submitters and every
/// consumer are joined, all three descriptors were consumed (no work stranded) and the doorbell
/// is free.
#[test]
fn the_doorbell_strands_nothing() {
    model("resident::the_doorbell_strands_nothing", || {
        let queue = Queue::new(3, 0);
        let other = {
            let queue = queue.clone();
            thread::spawn(move || Queue::submit(&queue, ready(1)))
        };
        Queue::submit(&queue, ready(2));
        Queue::submit(&queue, ready(3));
        other.join().unwrap();
        queue.join_consumers();
        assert_eq!(queue.taken.load(Ordering::SeqCst), 3, "work stranded");
        assert_eq!(queue.consumed(), 3);
        assert_eq!(queue.holders.load(Ordering::SeqCst), 0);
        assert!(!queue.doorbell.is_running());
    });
}

/// A submission waiting on a slot the host pushes (the slot listener's `on_slot_notice`: raise
/// the slot, then ring) against the consumer that found the wait pending and is exiting: the
/// consumer sees the value, or the notice starts a successor that does. The submission always
/// runs.
#[test]
fn a_pushed_slot_value_wakes_the_consumer() {
    model("resident::a_pushed_slot_value_wakes_the_consumer", || {
        let queue = Queue::new(1, 1);
        let notice = {
            let queue = queue.clone();
            thread::spawn(move || {
                SlotTable::publish(&queue.memory.slots()[0], 1);
                if queue.doorbell.ring() {
                    Queue::start_consumer(&queue);
                }
            })
        };
        let mut d = ready(1);
        d.wait_count = 1;
        d.waits[0] = SlotValue {
            value: 1,
            slot: 0,
            reserved: 0,
        };
        Queue::submit(&queue, d);
        notice.join().unwrap();
        queue.join_consumers();
        assert_eq!(
            queue.taken.load(Ordering::SeqCst),
            1,
            "the woken wait was stranded"
        );
        assert_eq!(queue.consumed(), 1);
        assert!(!queue.doorbell.is_running());
    });
}

/// A ringer that won the doorbell but could not start a consumer (`Shared::start_consumer`'s
/// spawn error) gives the doorbell back while another submitter rings: the doorbell is left
/// free, so the next ring starts a consumer (the other submission waits for it, as documented;
/// it is never left behind a flag that nobody holds).
#[test]
fn a_failed_start_gives_the_doorbell_back() {
    model("resident::a_failed_start_gives_the_doorbell_back", || {
        let doorbell = Arc::new(Doorbell::new());
        let other = {
            let doorbell = doorbell.clone();
            thread::spawn(move || doorbell.ring())
        };
        let won = doorbell.ring();
        if won {
            doorbell.give_back();
        }
        let other_won = other.join().unwrap();
        if other_won {
            doorbell.give_back();
        }
        assert!(won || other_won, "the first ring finds the doorbell free");
        assert!(!doorbell.is_running(), "the doorbell is held by nobody");
        assert!(doorbell.ring(), "the next ring starts a consumer");
    });
}

/// A slot raised by two writers, one of which then fails it, against a reader: the word never
/// goes back, once failed it stays failed (a later `publish` does not overwrite the failure),
/// and a reader that sees a value (or the failure) also sees what its writer wrote before
/// publishing it (the release half of `publish` and `fail`).
#[test]
fn slot_values_rise_and_failures_stay() {
    model("resident::slot_values_rise_and_failures_stay", || {
        let slot = Arc::new(AtomicU64::new(0));
        let failed_why = Arc::new(Exclusive64(UnsafeCell::new(0)));
        let raised_by = Arc::new(Exclusive64(UnsafeCell::new(0)));
        let failer = {
            let (slot, failed_why) = (slot.clone(), failed_why.clone());
            thread::spawn(move || {
                SlotTable::publish(&slot, 1);
                // SAFETY: read only by a reader that saw the failure below.
                failed_why.0.with_mut(|p| unsafe { *p = 7 });
                SlotTable::fail(&slot);
            })
        };
        let raiser = {
            let (slot, raised_by) = (slot.clone(), raised_by.clone());
            thread::spawn(move || {
                SlotTable::publish(&slot, 2);
                // SAFETY: read only by a reader that saw the value 3.
                raised_by.0.with_mut(|p| unsafe { *p = 9 });
                SlotTable::publish(&slot, 3);
            })
        };
        let mut last = 0;
        for _ in 0..2 {
            let word = slot.load(Ordering::Acquire);
            assert!(
                word >= last,
                "the slot went back from {last:#x} to {word:#x}"
            );
            if last == FAILED {
                assert_eq!(word, FAILED, "a failure was overwritten");
            }
            assert!(word == FAILED || word <= 3, "a stray word {word:#x}");
            last = word;
            match SlotTable::state(&slot, 3) {
                SlotState::Failed => {
                    assert_eq!(
                        slot.load(Ordering::Acquire),
                        FAILED,
                        "a failure was overwritten"
                    );
                    last = FAILED;
                    // SAFETY: the failure was seen (acquire), so the write before it happened
                    // before this read.
                    assert_eq!(failed_why.0.with(|p| unsafe { *p }), 7);
                }
                SlotState::Reached => {
                    // SAFETY: the value 3 was seen (acquire), as above.
                    assert_eq!(raised_by.0.with(|p| unsafe { *p }), 9);
                }
                SlotState::Pending => {}
            }
        }
        failer.join().unwrap();
        raiser.join().unwrap();
        assert_eq!(slot.load(Ordering::Acquire), FAILED, "the failure was lost");
        assert_eq!(SlotTable::state(&slot, 3), SlotState::Failed);
    });
}

/// A word written before a publish (the models' payloads).
struct Exclusive64(UnsafeCell<u64>);

// SAFETY: written once before a release, read after the matching acquire.
unsafe impl Sync for Exclusive64 {}

/// Not a completion word of any sequence the models use.
const NOT_DONE: u64 = u64::MAX;

#[test]
fn concurrent_retires_finish_each_once_in_order() {
    // The consumer writes completion words 0 and 1, retiring after each (as `step` does); the
    // previous consumer, exiting, retires at the same time. Every entry is finished exactly once,
    // in sequence order (so a semaphore two submissions signal never goes back, and a failure
    // is never overtaken by a later success), `retired` never goes back, and nothing written is
    // left unretired once both returned.
    model("concurrent_retires_finish_each_once_in_order", || {
        let queue = Arc::new(RetireQueue::<u64>::new());
        queue.lock().extend([0, 1]);
        let words: Arc<[AtomicU64; 2]> =
            Arc::new([AtomicU64::new(NOT_DONE), AtomicU64::new(NOT_DONE)]);
        let finished = Arc::new(Mutex::new(Vec::new()));
        let retired = Arc::new(AtomicU64::new(0));
        let retire = {
            let (queue, words, finished, retired) = (
                queue.clone(),
                words.clone(),
                finished.clone(),
                retired.clone(),
            );
            move || {
                queue.retire(
                    |&sequence| {
                        let word = words[sequence as usize].load(Ordering::Acquire);
                        Completion::decode(word, sequence)
                    },
                    |batch| {
                        for (sequence, completion) in batch.drain(..) {
                            assert_eq!(completion, Completion::Done);
                            finished.lock().unwrap().push(sequence);
                            let before = retired.fetch_max(sequence + 1, Ordering::AcqRel);
                            assert!(before <= sequence, "retired went back or twice");
                        }
                    },
                )
            }
        };
        let exiting = {
            let retire = retire.clone();
            thread::spawn(move || retire())
        };
        let consumer = {
            let (words, retire) = (words.clone(), retire.clone());
            thread::spawn(move || {
                for sequence in 0..2u64 {
                    words[sequence as usize]
                        .store(Completion::Done.encode(sequence), Ordering::Release);
                    retire();
                }
            })
        };
        exiting.join().unwrap();
        consumer.join().unwrap();
        assert_eq!(
            *finished.lock().unwrap(),
            vec![0, 1],
            "finished out of order or twice"
        );
        assert!(
            queue.lock().is_empty(),
            "a written completion was left unretired"
        );
        assert_eq!(retired.load(Ordering::Acquire), 2);
    });
}

/// The slot listener as the queue has it: a notice pushes the value through the gate.
struct GateListener {
    gate: SlotGate,
    word: AtomicU64,
    semaphore: Semaphore<NoEvent>,
    this: std::sync::Mutex<Option<std::sync::Weak<GateListener>>>,
}

impl Listener<NoEvent> for GateListener {
    fn notify(&self, _semaphore: SemaphoreId, key: u64) {
        let this = self.this.lock().unwrap().clone();
        let Some(this) = this.and_then(|weak| weak.upgrade()) else {
            return;
        };
        let listener: std::sync::Arc<dyn Listener<NoEvent>> = this;
        self.gate
            .notice(&self.word, &self.semaphore, &listener, key);
    }
}

fn gate_listener() -> (
    std::sync::Arc<GateListener>,
    std::sync::Arc<dyn Listener<NoEvent>>,
) {
    let listener = std::sync::Arc::new(GateListener {
        gate: SlotGate::new(),
        word: AtomicU64::new(0),
        semaphore: Semaphore::with_options(0, SemaphoreOptions::new().without_event_queries()),
        this: std::sync::Mutex::new(None),
    });
    *listener.this.lock().unwrap() = Some(std::sync::Arc::downgrade(&listener));
    let dynamic: std::sync::Arc<dyn Listener<NoEvent>> = listener.clone();
    (listener, dynamic)
}

#[test]
fn every_pushed_wait_reaches_its_slot() {
    // Two waits share the slot's listener (one for 2, one for 1) while a host thread signals 1:
    // once all are done, the slot holds 1 (the wait for 1 is not left to the listener for 2),
    // and the listener hand-off leaves no wait without a listener: signalling 2 pushes 2.
    model("every_pushed_wait_reaches_its_slot", || {
        let (gate, listener) = gate_listener();
        let waits: Vec<_> = [2u64, 1]
            .into_iter()
            .map(|value| {
                let (gate, listener) = (gate.clone(), listener.clone());
                thread::spawn(move || {
                    gate.gate
                        .push(&gate.word, &gate.semaphore, value, &listener, 0)
                })
            })
            .collect();
        let signal = {
            let gate = gate.clone();
            thread::spawn(move || gate.semaphore.advance_to(1).unwrap())
        };
        for wait in waits {
            wait.join().unwrap();
        }
        signal.join().unwrap();
        assert_eq!(
            gate.word.load(Ordering::Acquire),
            1,
            "a reached wait was not pushed"
        );
        gate.semaphore.advance_to(2).unwrap();
        assert_eq!(
            gate.word.load(Ordering::Acquire),
            2,
            "a wait was left without a listener"
        );
        assert_eq!(gate.semaphore.listener_count(), 0);
        *gate.this.lock().unwrap() = None;
    });
}

/// Two submitters each publish one item and ring while the device's stream runs the chains
/// they start, one after another; a chain takes items until it finds none, then tries to exit.
#[test]
fn device_chains_never_strand_work() {
    model("device chains never strand work", || {
        let rings = Arc::new(AtomicU64::new(0));
        let exits = Arc::new(AtomicU64::new(0));
        let produced = Arc::new(AtomicU64::new(0));
        let consumed = Arc::new(AtomicU64::new(0));
        let requested = Arc::new(AtomicU64::new(0));
        let hosts_done = Arc::new(AtomicUsize::new(0));
        let starter = Arc::new(ChainStarter::new());
        let hosts: Vec<JoinHandle<()>> = (0..2)
            .map(|_| {
                let (rings, exits, produced) = (rings.clone(), exits.clone(), produced.clone());
                let (requested, hosts_done, starter) =
                    (requested.clone(), hosts_done.clone(), starter.clone());
                thread::spawn(move || {
                    produced.fetch_add(1, Ordering::SeqCst);
                    starter
                        .ring(&rings, &exits, || {
                            requested.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                    hosts_done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        let stream = {
            let (rings, exits, produced, consumed) = (
                rings.clone(),
                exits.clone(),
                produced.clone(),
                consumed.clone(),
            );
            let (requested, hosts_done) = (requested.clone(), hosts_done.clone());
            thread::spawn(move || {
                let mut ran = 0;
                loop {
                    if ran < requested.load(Ordering::SeqCst) {
                        ran += 1;
                        loop {
                            let seen = rings.load(Ordering::SeqCst);
                            let taken = consumed.load(Ordering::SeqCst);
                            if taken < produced.load(Ordering::SeqCst) {
                                consumed.store(taken + 1, Ordering::SeqCst);
                                continue;
                            }
                            if chain_try_exit(&rings, &exits, seen) {
                                break;
                            }
                        }
                    } else if hosts_done.load(Ordering::SeqCst) == 2
                        && ran == requested.load(Ordering::SeqCst)
                    {
                        break;
                    } else {
                        thread::yield_now();
                    }
                }
            })
        };
        for host in hosts {
            host.join().unwrap();
        }
        stream.join().unwrap();
        assert_eq!(consumed.load(Ordering::SeqCst), 2, "work was stranded");
        assert_eq!(exits.load(Ordering::SeqCst), starter.starts());
    });
}
