//! A host thread that sees a kernel's end.
//!
//! Wake latency is the time from a kernel's end to the return of the host thread waiting for it.
//! The kernel's end is a GPU clock reading and the return a host one, and the two clocks are not
//! aligned. Instead of aligning them, the `spin` kernel's last act is a store to mapped host
//! memory, and this thread spins on that word and stamps the host clock the moment it changes.
//! Both ends of the interval are then on the host's monotonic clock. The stamp trails the
//! kernel's true end by one GPU-to-host write (well under a microsecond), the same for every
//! variant measured, so differences between variants are exact and absolute figures are a
//! little low.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::raw::MappedFlags;
use crate::clock::Clock;

/// How much later than its limit the observer thread may report, before `seen` gives up on it:
/// a busy host can keep a runnable thread off a core for tens of milliseconds.
const OBSERVER_GRACE: Duration = Duration::from_secs(2);
/// How long the observer waits for one flag before giving up (a kernel that never ran).
const FLAG_TIMEOUT: Duration = Duration::from_secs(5);

/// The word a kernel writes and the observer watches.
pub trait FlagWord: Send + Sync + 'static {
    /// The word, as the host sees it.
    fn word(&self) -> &AtomicU32;
}

impl FlagWord for MappedFlags {
    fn word(&self) -> &AtomicU32 {
        self.flag(0)
    }
}

struct Shared {
    flags: Arc<dyn FlagWord>,
    clock: Clock,
    timeout: Duration,
    /// The flag value the next kernel will write; 0 while idle.
    target: AtomicU32,
    /// The last target seen, and when.
    seen: AtomicU32,
    seen_at: AtomicU64,
    stop: AtomicBool,
}

/// The observer thread; stops and joins on drop.
pub struct FlagObserver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// `seen_at` when the flag never came.
const TIMED_OUT: u64 = u64::MAX;

impl FlagObserver {
    /// Starts watching `flag`.
    pub fn start(flag: Arc<dyn FlagWord>, clock: Clock) -> Result<Self> {
        Self::start_with_timeout(flag, clock, FLAG_TIMEOUT)
    }

    /// As [`FlagObserver::start`], giving up on a value after `timeout`.
    pub fn start_with_timeout(
        flags: Arc<dyn FlagWord>,
        clock: Clock,
        timeout: Duration,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            flags,
            clock,
            timeout,
            target: AtomicU32::new(0),
            seen: AtomicU32::new(0),
            seen_at: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("bench-observer".into())
            .spawn(move || watch(&s))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Arms the observer for the kernel that will write `value`. Call before launching it.
    pub fn expect(&self, value: u32) {
        self.shared.target.store(value, Ordering::Release);
    }

    /// When the host saw `value` written (on the shared clock). Waits for the observer.
    pub fn seen(&self, value: u32) -> Result<u64> {
        let begin = Instant::now();
        loop {
            if self.shared.seen.load(Ordering::Acquire) == value {
                let at = self.shared.seen_at.load(Ordering::Relaxed);
                if at == TIMED_OUT {
                    bail!("the spin kernel's flag {value} never reached the host");
                }
                return Ok(at);
            }
            // Twice the observer's own limit, plus room for a loaded machine to schedule it.
            if begin.elapsed() > self.shared.timeout * 2 + OBSERVER_GRACE {
                bail!("the flag observer did not report flag {value}");
            }
            std::hint::spin_loop();
        }
    }
}

fn watch(s: &Shared) {
    let flag = s.flags.word();
    let mut done = 0u32;
    while !s.stop.load(Ordering::Relaxed) {
        let target = s.target.load(Ordering::Acquire);
        if target == done {
            std::hint::spin_loop();
            continue;
        }
        let begin = Instant::now();
        let at = loop {
            if flag.load(Ordering::Acquire) == target {
                break s.clock.now_ns();
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            if begin.elapsed() > s.timeout {
                break TIMED_OUT;
            }
            std::hint::spin_loop();
        };
        s.seen_at.store(at, Ordering::Relaxed);
        s.seen.store(target, Ordering::Release);
        done = target;
    }
}

impl Drop for FlagObserver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl FlagWord for AtomicU32 {
        fn word(&self) -> &AtomicU32 {
            self
        }
    }

    #[test]
    fn stamps_each_value_when_it_is_written() {
        let word = Arc::new(AtomicU32::new(0));
        let clock = Clock::new();
        let obs = FlagObserver::start(word.clone(), clock).unwrap();
        for value in 1..=3u32 {
            obs.expect(value);
            std::thread::sleep(Duration::from_millis(2));
            let before = clock.now_ns();
            word.store(value, Ordering::Release);
            let at = obs.seen(value).unwrap();
            let after = clock.now_ns();
            assert!(at >= before && at <= after, "{before} <= {at} <= {after}");
        }
    }

    #[test]
    fn a_value_never_written_is_an_error_not_a_hang() {
        let word = Arc::new(AtomicU32::new(0));
        let obs = FlagObserver::start_with_timeout(word, Clock::new(), Duration::from_millis(20))
            .unwrap();
        obs.expect(7);
        let e = obs.seen(7).unwrap_err().to_string();
        assert!(e.contains("never reached"), "{e}");
    }
}
