//! Case 3, device-side dependency: B on one queue waits for A on another; the GPU gap between
//! A's end and B's start.
//!
//! Both kernels stamp their start and end with `%globaltimer` into device memory; the gap is
//! `B.start - A.end`, one GPU clock, no host in it. A spins long enough (`A_NS`) that B and its
//! wait are queued before A ends, so the gap is the GPU's own dependency resolution. A's end is
//! dithered by a pseudo-random extra spin so a coarse timer cannot bias the mean (see
//! `gpu::ptx`); when the timer steps coarser than `FINE_TIMER_NS`, the comparison is judged on
//! means, whose precision does not depend on the step.
//!
//! Floor: two raw non-blocking streams, `cuEventRecord` on the first after A,
//! `cuStreamWaitEvent` on the second before B. Reference: A and B back to back on one stream.

use anyhow::Result;

use super::{Env, progress, summarize};
use crate::bench::gpu::SpinRecord;
use crate::bench::gpu::raw::{Event, Stream, SyncMode, launch};
use crate::bench::report::{Center, Comparison, Goal, Report};

/// A's spin: far longer than the host needs to queue B behind it.
pub const A_NS: u64 = 30_000;
/// Upper bound of A's extra SM cycles (about 30 us at the H200's clock: many timer steps).
pub const JITTER_CYCLES: u64 = 65_536;
/// Samples per variant (warm-up on top).
pub const SAMPLES: usize = 2_000;
/// The goal: cuhal at most the floor plus this.
pub const GOAL_ADDED_NS: f64 = 500.0;
/// A timer step at or below this is fine enough to judge medians.
pub const FINE_TIMER_NS: u64 = 100;

/// Where B runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// On a second stream, after an event wait.
    CrossStream,
    /// Right behind A on the same stream.
    SameStream,
}

/// Runs case 3.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SAMPLES);
    let warm = env.scaled(100);
    progress(&format!("case 3 (dependency): floor, {n} samples"));
    let mut cross = measure(env, Placement::CrossStream, warm, n)?;
    progress(&format!(
        "case 3 (dependency): same-stream reference, {n} samples"
    ));
    let mut same = measure(env, Placement::SameStream, warm, n)?;
    let cross = summarize("case 3 floor", &mut cross)?;
    let same = summarize("case 3 same stream", &mut same)?;
    report.measured(
        "3",
        "floor: GPU gap A end -> B start, two streams + event",
        cross,
    );
    report.measured(
        "3",
        "reference: GPU gap A end -> B start, same stream",
        same,
    );
    let mut c = Comparison::new(
        "3",
        "dependency: B on queue 2 waits for A's signal on queue 1; GPU gap A end -> B start",
        None,
        Some(cross),
        Goal::AddedAtMost(GOAL_ADDED_NS),
    )
    .note(super::CUHAL_PENDING);
    if env.timer.step_ns > FINE_TIMER_NS {
        c.center = Center::Mean;
        report.notes.push(format!(
            "case 3: %globaltimer steps by {} ns on this GPU, so gaps are judged on means of \
             dithered samples (medians are rounded to the step)",
            env.timer.step_ns
        ));
    }
    report.comparisons.push(c);
    Ok(())
}

fn measure(env: &Env<'_>, placement: Placement, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let s1 = Stream::new(&gpu.ctx)?;
    let s2 = Stream::new(&gpu.ctx)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin)?;
    let mut rec_a = SpinRecord::new(gpu)?;
    let mut rec_b = SpinRecord::new(gpu)?;
    let mut gaps = Vec::with_capacity(n);
    for i in 0..warm + n {
        let (mut a, _) = rec_a.next(A_NS, 0, JITTER_CYCLES);
        let (mut b, _) = rec_b.next(0, 0, 0);
        launch(api, gpu.kernels.spin, s1.raw(), &mut a)?;
        match placement {
            Placement::CrossStream => {
                // SAFETY: live event and streams.
                api.check("cuEventRecord", unsafe {
                    (api.cuEventRecord)(event.raw(), s1.raw())
                })?;
                // SAFETY: as above.
                api.check("cuStreamWaitEvent", unsafe {
                    (api.cuStreamWaitEvent)(s2.raw(), event.raw(), 0)
                })?;
                launch(api, gpu.kernels.spin, s2.raw(), &mut b)?;
            }
            Placement::SameStream => launch(api, gpu.kernels.spin, s1.raw(), &mut b)?,
        }
        s2.sync()?;
        s1.sync()?;
        let ta = rec_a.read("case 3 kernel A")?;
        let tb = rec_b.read("case 3 kernel B")?;
        if i >= warm {
            gaps.push(tb.start as f64 - ta.end as f64);
        }
    }
    Ok(gaps)
}
