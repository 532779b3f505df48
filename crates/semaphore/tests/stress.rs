//! Stress: 16 threads, 100k signals and waits in total, under a watchdog; no hang, no leak.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::bounded;
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};
use cuhal_semaphore::{Error, Failure, Semaphore, SemaphoreOptions, Timeout, wait_all, wait_any};

type Sem = Semaphore<FlagEvent>;

const SEMAPHORES: usize = 8;
const SIGNALLERS: usize = 8;
const WAITERS: usize = 8;
/// Per thread: 8 x 6250 signals + 8 x 6250 waits = 100k operations.
const OPS: u64 = 6250;
/// How far ahead of its value a signaller records a device signal.
const AHEAD: u64 = 4;

/// A small deterministic generator, so a failure can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn semaphores() -> Vec<Sem> {
    let options = SemaphoreOptions::new().with_event_spin(Duration::from_micros(5));
    (0..SEMAPHORES)
        .map(|_| Sem::with_options(0, options))
        .collect()
}

/// Advances one semaphore through 1..=OPS the way a completion thread does, recording a device
/// signal a few values ahead and completing it a little before the value is reached, so host
/// waiters sometimes get there first through the event.
fn signaller(sem: Sem, live: LiveCounter, seed: u64) -> Result<(), Error> {
    let mut rng = XorShift(seed);
    let mut recorded: Vec<(u64, FlagEvent)> = Vec::new();
    for value in 1..=OPS {
        if value.is_multiple_of(AHEAD) {
            let event = FlagEvent::counted(&live);
            sem.record_device_signal(value + AHEAD, event.clone())?;
            recorded.push((value + AHEAD, event));
        }
        recorded.retain(|(at, event)| {
            if *at <= value + 1 {
                event.complete();
                false
            } else {
                true
            }
        });
        sem.advance_to(value)?;
        if rng.next().is_multiple_of(64) {
            thread::yield_now();
        }
    }
    Ok(())
}

/// Waits for values that rise with its progress, in every flavour of wait.
fn waiter(sems: Vec<Sem>, seed: u64) -> Result<(), Error> {
    let mut rng = XorShift(seed);
    for k in 0..OPS {
        let target = k + 1;
        let a = (rng.next() % SEMAPHORES as u64) as usize;
        let b = (rng.next() % SEMAPHORES as u64) as usize;
        match rng.next() % 5 {
            0 => sems[a].wait(target, Timeout::Infinite)?,
            1 => wait_all(&[(&sems[a], target), (&sems[b], target)], Timeout::Infinite)?,
            2 => {
                wait_any(&[(&sems[a], target), (&sems[b], target)], Timeout::Infinite)?;
            }
            3 => match sems[a].wait(target, Duration::from_micros(50)) {
                Ok(()) | Err(Error::Timeout) => {}
                Err(e) => return Err(e),
            },
            _ => drop(sems[a].device_wait_event(target)),
        }
        let value = sems[a].query()?;
        assert!(value <= OPS);
    }
    Ok(())
}

#[test]
fn sixteen_threads_hundred_thousand_operations() {
    bounded(Duration::from_secs(60), || {
        let live = LiveCounter::new();
        let sems = semaphores();
        let start = Arc::new(Barrier::new(SIGNALLERS + WAITERS));
        let mut handles = Vec::new();
        for (i, sem) in sems.iter().enumerate().take(SIGNALLERS) {
            let (sem, live, start) = (sem.clone(), live.clone(), start.clone());
            handles.push(thread::spawn(move || {
                start.wait();
                signaller(sem, live, 0x9e37_79b9 + i as u64)
            }));
        }
        for i in 0..WAITERS {
            let (sems, start) = (sems.clone(), start.clone());
            handles.push(thread::spawn(move || {
                start.wait();
                waiter(sems, 0x85eb_ca6b + i as u64)
            }));
        }
        for h in handles {
            h.join().unwrap().unwrap();
        }
        let beyond_the_end = (1..=OPS)
            .filter(|v| v.is_multiple_of(AHEAD) && v + AHEAD > OPS)
            .count();
        for sem in &sems {
            assert_eq!(sem.query().unwrap(), OPS);
            assert_eq!(sem.waiter_count(), 0);
            assert_eq!(
                sem.timepoint_count(),
                beyond_the_end,
                "only timepoints above the final value are held"
            );
        }
        assert_eq!(live.live(), SEMAPHORES * beyond_the_end);
        drop(sems);
        assert_eq!(live.live(), 0, "every event released");
    });
}

#[test]
fn failure_in_the_middle_wakes_everyone() {
    bounded(Duration::from_secs(60), || {
        let live = LiveCounter::new();
        let sems = semaphores();
        let start = Arc::new(Barrier::new(SIGNALLERS + WAITERS + 1));
        let mut handles = Vec::new();
        for sem in sems.iter().take(SIGNALLERS) {
            let (sem, live, start) = (sem.clone(), live.clone(), start.clone());
            handles.push(thread::spawn(move || {
                start.wait();
                // Stop at 1/4 so waiters are left hanging on values nobody will signal.
                for value in 1..=OPS / 4 {
                    if value.is_multiple_of(AHEAD) {
                        sem.record_device_signal(value + AHEAD, FlagEvent::counted(&live))?;
                    }
                    sem.advance_to(value)?;
                }
                Ok(())
            }));
        }
        for i in 0..WAITERS {
            let (sems, start) = (sems.clone(), start.clone());
            handles.push(thread::spawn(move || {
                start.wait();
                waiter(sems, 0x27d4_eb2f + i as u64)
            }));
        }
        start.wait();
        thread::sleep(Duration::from_millis(50));
        let failure = Failure::msg("device lost");
        for sem in &sems {
            sem.fail(failure.clone());
        }
        let mut failed = 0;
        for h in handles {
            match h.join().unwrap() {
                Ok(()) => {}
                Err(Error::Failed(f)) => {
                    assert!(f.ptr_eq(&failure));
                    failed += 1;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(
            failed >= WAITERS,
            "every waiter ends with the failure (got {failed})"
        );
        drop(sems);
        assert_eq!(live.live(), 0, "every event released");
    });
}
