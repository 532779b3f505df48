//! The benchmark cases, one module each; every case measures its raw-driver floor and its cuhal
//! figure in this process, with the same kernels and the same repetitions: one after the other,
//! or (cases 1, 5 and 9) in turns through the same stretch of time.

pub mod bindings;
pub mod chain;
pub mod collectives;
pub mod decoder;
pub mod dependency;
pub mod library;
pub mod pdl;
pub mod raw_cupti;
pub mod replay;
pub mod round_trip;
pub mod scheduler;
pub mod signal;
pub mod submit;
pub mod tracing;
pub mod wait_async;
pub mod waiter;
pub mod wake;

use crate::clock::Clock;
use crate::gpu::{Gpu, TimerResolution};
use crate::stats::Summary;

use anyhow::{Result, anyhow};

/// What every GPU case gets.
pub struct Env<'a> {
    /// The device, its context current on this thread, the kernels loaded.
    pub gpu: &'a Gpu,
    /// The clock every stamp of the run is taken on.
    pub clock: Clock,
    /// A smoke run: about a tenth of the repetitions.
    pub quick: bool,
    /// `%globaltimer`'s measured resolution.
    pub timer: TimerResolution,
}

impl Env<'_> {
    /// `full` repetitions, or a tenth of them (at least 10) for `--quick`.
    pub fn scaled(&self, full: usize) -> usize {
        scaled(self.quick, full)
    }

    /// Runs `run` `warm + n` times and returns the last `n` runs' wall times in nanoseconds,
    /// each taken on the run's clock around one call.
    pub fn time(
        &self,
        warm: usize,
        n: usize,
        mut run: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        let mut samples = Vec::with_capacity(n);
        for i in 0..warm + n {
            let t0 = self.clock.now_ns();
            run()?;
            let t1 = self.clock.now_ns();
            if i >= warm {
                samples.push((t1 - t0) as f64);
            }
        }
        Ok(samples)
    }
}

/// `full`, or a tenth of it (at least 10) when `quick`.
pub fn scaled(quick: bool, full: usize) -> usize {
    if quick { (full / 10).max(10) } else { full }
}

/// Runs `rounds` rounds in which each of `N` sides takes one turn, `turn(round, side,
/// samples)` with that side's samples to append to, who goes first rotating from round to round,
/// so that the host's drift within a run falls on every side alike (`docs/decisions/bench.md`).
/// Returns each side's samples (room for `capacity` each is made up front).
pub fn in_turns<const N: usize>(
    rounds: usize,
    capacity: usize,
    mut turn: impl FnMut(usize, usize, &mut Vec<f64>) -> Result<()>,
) -> Result<[Vec<f64>; N]> {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(capacity));
    for round in 0..rounds {
        for k in 0..N {
            let side = (round + k) % N;
            turn(round, side, &mut samples[side])?;
        }
    }
    Ok(samples)
}

/// One line of progress on stderr (stdout carries the report).
pub fn progress(text: &str) {
    eprintln!("cuhal bench: {text}");
}

/// Summarizes samples that must exist: an empty or broken set is an error naming `what`.
pub fn summarize(what: &str, samples: &mut [f64]) -> Result<Summary> {
    Summary::of(samples).ok_or_else(|| anyhow!("{what}: no valid samples"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_runs_a_tenth_but_never_almost_nothing() {
        assert_eq!(scaled(false, 10_000), 10_000);
        assert_eq!(scaled(true, 10_000), 1_000);
        assert_eq!(scaled(true, 50), 10);
        assert!(summarize("x", &mut []).is_err());
        assert_eq!(summarize("x", &mut [2.0, 1.0, 3.0]).unwrap().median, 2.0);
    }
}
