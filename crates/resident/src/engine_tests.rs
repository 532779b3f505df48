//! The device engine's host side on a CPU stand-in for the scheduler kernel: the poller mirrors
//! completion words it did not write, a sick device loses the queue, shutdown fails what can
//! never run (also when the device never writes a word), a failed launch names the device's
//! failure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuhal_semaphore::{Failure, NoEvent, Semaphore};

use crate::memory::{DescriptorCell, HostMemory, RingHeader, SharedMemory};
use crate::refusal::{ExecutableKind, Launchable, NodeKind};
use crate::slots::{Completion, SlotState, SlotTable};
use crate::{DeviceScheduler, Error, ResidentOptions, ResidentQueue};

type Sem = Semaphore<NoEvent>;
const LONG: Duration = Duration::from_secs(10);

/// The memory, shared by the queue and the stand-in device.
struct Mapped(Arc<HostMemory>);

// SAFETY: forwards to the one `HostMemory`, whose only ring is the queue's.
unsafe impl SharedMemory for Mapped {
    fn header(&self) -> &RingHeader {
        self.0.header()
    }
    fn descriptors(&self) -> &[DescriptorCell] {
        self.0.descriptors()
    }
    fn completions(&self) -> &[crate::sync::AtomicU64] {
        self.0.completions()
    }
    fn slots(&self) -> &[crate::sync::AtomicU64] {
        self.0.slots()
    }
}

/// A CPU stand-in for the scheduler kernel: a thread that consumes the ring as the kernel does
/// and writes completion words, never calling into the queue.
struct Device {
    memory: Arc<HostMemory>,
    control: AtomicU64,
    stuck: AtomicBool,
    sick: Mutex<Option<Failure>>,
    fail_launch_of: Option<u64>,
    launched: AtomicU64,
    /// Descriptors whose completion word is written.
    finished: AtomicU64,
    quit: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Runs only once rung after `asleep` was set (a chain that ended unseen).
    asleep: AtomicBool,
    /// Rings to ignore (lost wake-ups).
    deaf: AtomicU64,
    rings: AtomicU64,
    /// Called when the queue stops the device (the test's check of what is still alive).
    on_stop: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl Device {
    fn new(memory: &Arc<HostMemory>, fail_launch_of: Option<u64>) -> Arc<Self> {
        let device = Arc::new(Device {
            memory: memory.clone(),
            control: AtomicU64::new(0),
            stuck: AtomicBool::new(false),
            sick: Mutex::new(None),
            fail_launch_of,
            launched: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            quit: AtomicBool::new(false),
            thread: Mutex::new(None),
            asleep: AtomicBool::new(false),
            deaf: AtomicU64::new(0),
            rings: AtomicU64::new(0),
            on_stop: Mutex::new(None),
        });
        let d = device.clone();
        *device.thread.lock().unwrap() = Some(std::thread::spawn(move || {
            while !d.quit.load(Ordering::SeqCst) {
                let idle = d.stuck.load(Ordering::SeqCst) || d.asleep.load(Ordering::SeqCst);
                if idle || !d.step() {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }));
        device
    }

    /// Finishes the ring's head if it can, as the kernel does.
    fn step(&self) -> bool {
        let m = &self.memory;
        let capacity = m.descriptors().len() as u64;
        let produced = m.header().produced.0.load(Ordering::Acquire);
        let consumed = m.header().consumed.0.load(Ordering::Acquire);
        if produced == consumed {
            return false;
        }
        // SAFETY: `consumed < produced`: the producer wrote the cell before publishing it and
        // writes it again only after `consumed` passes it (below).
        let d = unsafe { m.descriptors()[(consumed % capacity) as usize].0.read() };
        let mut state = SlotState::Reached;
        for wait in d.waits() {
            match SlotTable::state(&m.slots()[wait.slot as usize], wait.value) {
                SlotState::Failed => state = SlotState::Failed,
                SlotState::Pending if state == SlotState::Reached => state = SlotState::Pending,
                _ => {}
            }
        }
        let control = self.control.load(Ordering::SeqCst);
        let completion = match state {
            SlotState::Failed => Completion::WaitFailed,
            SlotState::Pending if control == 0 => return false,
            SlotState::Pending if control == 2 => Completion::Lost,
            SlotState::Pending => Completion::Shutdown,
            SlotState::Reached if self.fail_launch_of == Some(consumed) => Completion::LaunchFailed,
            SlotState::Reached => {
                self.launched.fetch_add(1, Ordering::SeqCst);
                Completion::Done
            }
        };
        for signal in d.signals() {
            let word = &m.slots()[signal.slot as usize];
            if completion == Completion::Done {
                SlotTable::publish(word, signal.value);
            } else {
                SlotTable::fail(word);
            }
        }
        // As the kernel: `consumed` first, then the completion word.
        m.header().consumed.0.store(consumed + 1, Ordering::Release);
        m.completions()[(consumed % capacity) as usize]
            .store(completion.encode(consumed), Ordering::Release);
        self.finished.store(consumed + 1, Ordering::SeqCst);
        true
    }
}

impl DeviceScheduler for Device {
    fn ring(&self) -> Result<(), Failure> {
        self.rings.fetch_add(1, Ordering::SeqCst);
        let deaf = self.deaf.load(Ordering::SeqCst);
        if deaf > 0 {
            self.deaf.store(deaf - 1, Ordering::SeqCst);
        } else {
            self.asleep.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
    fn stop(&self, lost: bool) {
        if let Some(check) = self.on_stop.lock().unwrap().as_ref() {
            check();
        }
        self.control
            .store(if lost { 2 } else { 1 }, Ordering::SeqCst);
        // As a stream synchronize: until every descriptor's completion word is written (not
        // only `consumed`, which the device advances first).
        let m = &self.memory;
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.stuck.load(Ordering::SeqCst)
            && m.header().produced.0.load(Ordering::Acquire) != self.finished.load(Ordering::SeqCst)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    fn restart_stalled(&self) -> Result<(), Failure> {
        self.ring()
    }
    fn health(&self) -> Result<(), Failure> {
        self.sick.lock().unwrap().clone().map_or(Ok(()), Err)
    }
    fn launch_failure(&self, sequence: u64) -> Option<Failure> {
        (self.fail_launch_of == Some(sequence))
            .then(|| Failure::msg(format!("the device could not launch {sequence}")))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
    }
}

struct Exe;
impl Launchable for Exe {
    fn kind(&self) -> ExecutableKind {
        ExecutableKind::Graph
    }
    fn nodes(&self) -> &[NodeKind] {
        &[NodeKind::Kernel]
    }
    fn handle(&self) -> u64 {
        1
    }
}

fn queue(capacity: usize, fail_launch_of: Option<u64>) -> (ResidentQueue<NoEvent>, Arc<Device>) {
    let mut options = ResidentOptions::new("device-engine");
    options.capacity = capacity;
    options.slots = 8;
    let memory = Arc::new(HostMemory::new(capacity, 8).unwrap());
    let device = Device::new(&memory, fail_launch_of);
    let queue =
        ResidentQueue::with_device(options, Box::new(Mapped(memory)), device.clone()).unwrap();
    (queue, device)
}

fn stop(device: &Device) {
    device.quit.store(true, Ordering::SeqCst);
    if let Some(t) = device.thread.lock().unwrap().take() {
        t.join().unwrap();
    }
}

#[test]
fn the_poller_mirrors_completion_words_through_a_full_ring() {
    let (queue, device) = queue(4, None);
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let done = Sem::new(0);
    queue.bind(&done).unwrap();
    for value in 1..=200 {
        queue.submit(&[], &[(&done, value)], &exe, 0).unwrap();
    }
    done.wait(200, LONG).unwrap();
    let stats = queue.shutdown();
    assert_eq!(
        (
            stats.submitted,
            stats.retired,
            stats.launched,
            stats.retained
        ),
        (200, 200, 200, 0)
    );
    assert_eq!(device.launched.load(Ordering::SeqCst), 200);
    stop(&device);
}

#[test]
fn a_sick_device_loses_the_queue_and_fails_what_is_outstanding() {
    let (queue, device) = queue(16, None);
    device.stuck.store(true, Ordering::SeqCst);
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let done = Sem::new(0);
    queue.bind(&done).unwrap();
    for value in 1..=3 {
        queue.submit(&[], &[(&done, value)], &exe, 0).unwrap();
    }
    *device.sick.lock().unwrap() = Some(Failure::msg("the device fell off the bus"));
    let error = done.wait(1, LONG).unwrap_err();
    assert!(error.to_string().contains("fell off the bus"), "{error}");
    let deadline = Instant::now() + LONG;
    while queue.stats().retained > 0 {
        assert!(
            Instant::now() < deadline,
            "outstanding submissions never retired"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(queue.lost().is_some());
    assert!(matches!(
        queue.submit(&[], &[(&done, 9)], &exe, 0),
        Err(Error::Lost(_))
    ));
    drop(queue);
    stop(&device);
}

#[test]
fn shutdown_fails_what_waits_and_runs_what_is_ready() {
    let (queue, device) = queue(16, None);
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let (never, done, ran) = (Sem::new(0), Sem::new(0), Sem::new(0));
    for s in [&never, &done, &ran] {
        queue.bind(s).unwrap();
    }
    queue.submit(&[], &[(&ran, 1)], &exe, 0).unwrap();
    queue
        .submit(&[(&never, 1)], &[(&done, 1)], &exe, 0)
        .unwrap();
    let stats = queue.shutdown();
    ran.wait(1, LONG).unwrap();
    let error = done.wait(1, LONG).unwrap_err();
    assert!(error.to_string().contains("shut down"), "{error}");
    assert_eq!(stats.failed_at_shutdown, 1);
    assert_eq!(stats.retained, 0);
    stop(&device);
}

#[test]
fn shutdown_of_a_device_that_never_answers_still_fails_everything() {
    let (queue, device) = queue(16, None);
    device.stuck.store(true, Ordering::SeqCst);
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let done = Sem::new(0);
    queue.bind(&done).unwrap();
    queue.submit(&[], &[(&done, 1)], &exe, 0).unwrap();
    queue.submit(&[], &[(&done, 2)], &exe, 0).unwrap();
    let started = Instant::now();
    let stats = queue.shutdown();
    assert!(started.elapsed() < LONG);
    assert!(done.wait(1, LONG).is_err());
    assert_eq!((stats.failed, stats.retained), (2, 0));
    stop(&device);
}

#[test]
fn a_failed_device_launch_fails_its_signals_with_the_device_failure() {
    let (queue, device) = queue(16, Some(1));
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let (first, second, third) = (Sem::new(0), Sem::new(0), Sem::new(0));
    for s in [&first, &second, &third] {
        queue.bind(s).unwrap();
    }
    queue.submit(&[], &[(&first, 1)], &exe, 0).unwrap();
    queue.submit(&[], &[(&second, 1)], &exe, 0).unwrap();
    queue.submit(&[], &[(&third, 1)], &exe, 0).unwrap();
    first.wait(1, LONG).unwrap();
    let error = second.wait(1, LONG).unwrap_err();
    assert!(error.to_string().contains("could not launch 1"), "{error}");
    third.wait(1, LONG).unwrap();
    drop(queue);
    stop(&device);
}

#[test]
fn a_stalled_device_is_restarted_by_the_poller() {
    let (queue, device) = queue(16, None);
    // The chain has ended unseen, and the submission's own ring is lost.
    device.asleep.store(true, Ordering::SeqCst);
    device.deaf.store(1, Ordering::SeqCst);
    let exe: Arc<dyn Launchable> = Arc::new(Exe);
    let done = Sem::new(0);
    queue.bind(&done).unwrap();
    queue.submit(&[], &[(&done, 1)], &exe, 0).unwrap();
    done.wait(1, LONG).unwrap();
    assert!(
        device.rings.load(Ordering::SeqCst) >= 2,
        "the poller never restarted it"
    );
    drop(queue);
    stop(&device);
}

/// An executable that counts how many of it are alive.
struct Counted(Arc<AtomicU64>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
impl Launchable for Counted {
    fn kind(&self) -> ExecutableKind {
        ExecutableKind::Graph
    }
    fn nodes(&self) -> &[NodeKind] {
        &[NodeKind::Kernel]
    }
    fn handle(&self) -> u64 {
        2
    }
}

#[test]
fn a_loss_stops_the_device_before_it_releases_what_the_device_may_launch() {
    let (queue, device) = queue(16, None);
    device.stuck.store(true, Ordering::SeqCst);
    let live = Arc::new(AtomicU64::new(0));
    let alive_at_stop = Arc::new(AtomicU64::new(u64::MAX));
    {
        let (live, alive_at_stop) = (live.clone(), alive_at_stop.clone());
        *device.on_stop.lock().unwrap() = Some(Box::new(move || {
            let _ = alive_at_stop.compare_exchange(
                u64::MAX,
                live.load(Ordering::SeqCst),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }));
    }
    let done = Sem::new(0);
    queue.bind(&done).unwrap();
    for value in 1..=3 {
        live.fetch_add(1, Ordering::SeqCst);
        let exe: Arc<dyn Launchable> = Arc::new(Counted(live.clone()));
        queue.submit(&[], &[(&done, value)], &exe, 0).unwrap();
    }
    *device.sick.lock().unwrap() = Some(Failure::msg("lost"));
    assert!(done.wait(3, LONG).is_err());
    let deadline = Instant::now() + LONG;
    while live.load(Ordering::SeqCst) > 0 {
        assert!(
            Instant::now() < deadline,
            "the executables were never released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        alive_at_stop.load(Ordering::SeqCst),
        3,
        "the device was stopped after the executables it may launch were released"
    );
    drop(queue);
    stop(&device);
}
