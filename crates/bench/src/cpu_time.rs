//! Process CPU time, all threads together (`CLOCK_PROCESS_CPUTIME_ID`): what a case costs the
//! host's cores, beside the wall time one thread sees. A completion thread that spins while work
//! flows shows up here and nowhere else. Also the calling thread's own clock
//! (`CLOCK_THREAD_CPUTIME_ID`), and every thread's time from `/proc`, split by role (the
//! submitting thread, cuhal's completion and issue threads, the rest).

/// CPU time (user + system) the process has used so far, in nanoseconds; `None` where the call
/// is not available.
pub fn process_cpu_ns() -> Option<u64> {
    imp::process_cpu_ns()
}

/// CPU time (user + system) the calling thread has used so far, in nanoseconds; `None` where
/// the call is not available.
pub fn thread_cpu_ns() -> Option<u64> {
    imp::thread_cpu_ns()
}

/// CPU time per thread of the process, from `/proc/self/task/*/schedstat` (nanoseconds on the
/// CPU) and `comm` (the thread's name, cut to 15 bytes): where a case's process CPU time went.
/// Empty where `/proc` cannot be read.
pub fn threads_cpu_ns() -> Vec<ThreadCpu> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut threads = Vec::new();
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let path = task.path();
        let ns = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let name = std::fs::read_to_string(path.join("comm"))
            .map(|n| n.trim_end().to_owned())
            .unwrap_or_default();
        if let Some(ns) = ns {
            threads.push(ThreadCpu { tid, name, ns });
        }
    }
    threads
}

/// One thread's CPU time so far.
#[derive(Debug, Clone)]
pub struct ThreadCpu {
    /// The thread's id.
    pub tid: u32,
    /// Its name (`comm`).
    pub name: String,
    /// Nanoseconds it has run.
    pub ns: u64,
}

/// The calling thread's id, as `/proc/self/task` names it (`None` without `/proc`).
#[cfg(test)]
pub fn current_tid() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// CPU time between two [`threads_cpu_ns`] readings, in nanoseconds, summed by role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleCpu {
    /// The thread named as the submitting one.
    pub submitting: u64,
    /// cuhal's completion threads (`*-complete`, cut to `*-comple` by the kernel).
    pub completion: u64,
    /// cuhal's issue workers (`*-issue`).
    pub issue: u64,
    /// Every other thread (the driver's among them).
    pub other: u64,
}

/// Where the CPU time between two [`threads_cpu_ns`] readings went: the thread `tid` (the
/// submitting one), cuhal's completion threads, its issue workers, and every other thread;
/// threads that started between the readings count from zero.
pub fn cpu_by_role(before: &[ThreadCpu], after: &[ThreadCpu], tid: Option<u32>) -> RoleCpu {
    let mut roles = RoleCpu::default();
    for thread in after {
        let start = before
            .iter()
            .find(|t| t.tid == thread.tid)
            .map_or(0, |t| t.ns);
        let spent = thread.ns.saturating_sub(start);
        let role = if Some(thread.tid) == tid {
            &mut roles.submitting
        } else if thread.name.ends_with("-comple") || thread.name.ends_with("-complete") {
            &mut roles.completion
        } else if thread.name.ends_with("-issue") {
            &mut roles.issue
        } else {
            &mut roles.other
        };
        *role += spent;
    }
    roles
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod imp {
    use std::ffi::{c_int, c_long};

    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Timespec {
        sec: c_long,
        nsec: c_long,
    }

    // The CPU-time clocks count nanoseconds run (the scheduler's own tally). `getrusage`'s
    // user and system times can advance by whole ticks (4 ms seen on a 250 Hz kernel), too
    // coarse for a turn of a few milliseconds.
    const CLOCK_PROCESS_CPUTIME_ID: c_int = 2;
    const CLOCK_THREAD_CPUTIME_ID: c_int = 3;

    // The C library std links anyway.
    unsafe extern "C" {
        fn clock_gettime(clock: c_int, time: *mut Timespec) -> c_int;
    }

    pub fn process_cpu_ns() -> Option<u64> {
        cpu_ns(CLOCK_PROCESS_CPUTIME_ID)
    }

    pub fn thread_cpu_ns() -> Option<u64> {
        cpu_ns(CLOCK_THREAD_CPUTIME_ID)
    }

    fn cpu_ns(clock: c_int) -> Option<u64> {
        let mut time = Timespec::default();
        // SAFETY: `time` is a writable `struct timespec` with the layout of 64-bit Linux.
        if unsafe { clock_gettime(clock, &mut time) } != 0 {
            return None;
        }
        Some((time.sec as u64) * 1_000_000_000 + time.nsec as u64)
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod imp {
    pub fn process_cpu_ns() -> Option<u64> {
        None
    }

    pub fn thread_cpu_ns() -> Option<u64> {
        None
    }
}

/// Held by every test that measures process CPU time, which the other tests of the binary
/// (running in parallel) would add to.
#[cfg(test)]
pub(crate) static CPU_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until the calling thread has run `ns` more nanoseconds of CPU (10 s at most), as
    /// `/proc` counts it: the figure `cpu_by_role` reads.
    fn spin_cpu(ns: u64) {
        let tid = current_tid();
        let mine = || {
            threads_cpu_ns()
                .into_iter()
                .find(|t| Some(t.tid) == tid)
                .map_or(0, |t| t.ns)
        };
        let start = mine();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        while mine() - start < ns {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the thread's CPU time never grew"
            );
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_by_role_tells_the_threads_apart() {
        let _serial = CPU_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        const SPIN: u64 = 3_000_000;
        let before = threads_cpu_ns();
        let tid = current_tid();
        assert!(tid.is_some(), "/proc/thread-self names the thread");
        // Each thread spins, says so, and lives on until released: a thread's CPU time is only
        // readable while it exists.
        let (spun_tx, spun_rx) = std::sync::mpsc::channel::<()>();
        let release = std::sync::Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = ["cuhal0.0-complete", "cuhal0.0-issue", "driver"]
            .into_iter()
            .map(|name| {
                let spun = spun_tx.clone();
                let release = release.clone();
                std::thread::Builder::new()
                    .name(name.to_owned())
                    .spawn(move || {
                        spin_cpu(SPIN);
                        spun.send(()).unwrap();
                        release.wait();
                    })
                    .unwrap()
            })
            .collect();
        spin_cpu(SPIN);
        for _ in 0..3 {
            spun_rx.recv().unwrap();
        }
        let roles = cpu_by_role(&before, &threads_cpu_ns(), tid);
        release.wait();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(roles.submitting >= SPIN, "{roles:?}");
        assert!(roles.completion >= SPIN, "{roles:?}");
        assert!(roles.issue >= SPIN, "{roles:?}");
        assert!(roles.other >= SPIN, "{roles:?}");
    }

    /// The calling thread's clock counts its own work and not another thread's, which the
    /// process clock does count.
    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn thread_cpu_counts_the_calling_thread_only() {
        let _serial = CPU_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        const SPIN: u64 = 5_000_000;
        let thread_before = thread_cpu_ns().expect("the CPU-time clocks work on Linux");
        let process_before = process_cpu_ns().expect("the CPU-time clocks work on Linux");
        std::thread::spawn(|| spin_cpu(SPIN)).join().unwrap();
        let thread_between = thread_cpu_ns().unwrap();
        let process_between = process_cpu_ns().unwrap();
        assert!(process_between - process_before >= SPIN);
        assert!(
            thread_between - thread_before < SPIN,
            "the other thread's {SPIN} ns counted here: {} ns",
            thread_between - thread_before
        );
        spin_cpu(SPIN);
        assert!(thread_cpu_ns().unwrap() - thread_between >= SPIN);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn cpu_time_grows_with_work() {
        let _serial = CPU_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let before = process_cpu_ns().expect("the CPU-time clocks work on Linux");
        // Spin until 2 ms of CPU time show (on a loaded machine that takes longer than 2 ms of
        // wall time); a reading that never moves fails after 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        loop {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let spent = process_cpu_ns().unwrap() - before;
            if spent >= 2_000_000 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "10 s of spinning counted {spent} ns of CPU time"
            );
        }
    }
}
