//! Process CPU time, all threads together (`getrusage(RUSAGE_SELF)`): what a case costs the
//! host's cores, beside the wall time one thread sees. A completion thread that spins while work
//! flows shows up here and nowhere else.

/// CPU time (user + system) the process has used so far, in nanoseconds; `None` where the call
/// is not available.
pub fn process_cpu_ns() -> Option<u64> {
    imp::process_cpu_ns()
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod imp {
    use std::ffi::{c_int, c_long};

    /// `struct timeval` on 64-bit Linux.
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Timeval {
        sec: c_long,
        usec: c_long,
    }

    /// `struct rusage` on 64-bit Linux: two `timeval`s, then fourteen `long` counters.
    #[repr(C)]
    #[derive(Default)]
    struct Rusage {
        utime: Timeval,
        stime: Timeval,
        counters: [c_long; 14],
    }

    const RUSAGE_SELF: c_int = 0;

    // The C library std links anyway.
    unsafe extern "C" {
        fn getrusage(who: c_int, usage: *mut Rusage) -> c_int;
    }

    pub fn process_cpu_ns() -> Option<u64> {
        let mut usage = Rusage::default();
        // SAFETY: `usage` is a writable `struct rusage` with the layout of 64-bit Linux.
        if unsafe { getrusage(RUSAGE_SELF, &mut usage) } != 0 {
            return None;
        }
        let ns = |t: Timeval| (t.sec as u64) * 1_000_000_000 + (t.usec as u64) * 1_000;
        Some(ns(usage.utime) + ns(usage.stime))
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod imp {
    pub fn process_cpu_ns() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn cpu_time_grows_with_work() {
        let before = process_cpu_ns().expect("getrusage works on Linux");
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
