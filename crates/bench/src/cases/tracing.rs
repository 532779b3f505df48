//! Case 6, tracing overhead: case 4's replay (a 100-dispatch graph command buffer, submit +
//! host wait) through cuhal with tracing at COARSE and at FINE, beside the same replay with
//! tracing off, measured in the same run. The raw driver has no tracing, so the "floor" column
//! here is cuhal untraced. Goals: COARSE at most 1.03x and FINE at most 1.2x the untraced
//! replay; the notes say where FINE got its times (CUPTI activity records, or events when CUPTI
//! could not be had) and the zone counts show that tracing recorded and collected what it should.

use anyhow::{Result, bail};
use cuhal::{CommandBufferMode, Verbosity};

use super::replay::{REPLAYS, cuhal_replay};
use super::{Env, progress, summarize};
use crate::report::{Comparison, Goal, Report};

/// Runs case 6.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    progress(&format!("case 6 (tracing): untraced replay, {n} replays"));
    let mut off = cuhal_replay(env, CommandBufferMode::Graph, Verbosity::Off, warm, n)?;
    let off = summarize("case 6 untraced", &mut off.samples)?;
    report.measured("6", "cuhal graph replay, tracing off", off);
    for verbosity in [Verbosity::Coarse, Verbosity::Fine] {
        progress(&format!(
            "case 6 (tracing): tracing {verbosity:?}, {n} replays"
        ));
        let mut traced = cuhal_replay(env, CommandBufferMode::Graph, verbosity, warm, n)?;
        let zones = traced.zones;
        if zones.recorded == 0 || zones.collected == 0 {
            bail!(
                "case 6: tracing {verbosity:?} recorded {} and collected {} zones: it did not trace",
                zones.recorded,
                zones.collected
            );
        }
        let summary = summarize("case 6 traced", &mut traced.samples)?;
        report.measured(
            "6",
            format!("cuhal graph replay, tracing {verbosity:?}"),
            summary,
        );
        report.comparisons.push(
            Comparison::new(
                "6",
                format!(
                    "tracing {verbosity:?}: case 4 graph replay, traced (floor column: the same replay untraced)"
                ),
                Some(summary),
                Some(off),
                Goal::RatioAtMost(if verbosity == Verbosity::Fine { 1.2 } else { 1.03 }),
            )
            .note(format!(
                "tracing {verbosity:?}: {} zones recorded, {} collected ({} from CUPTI activity records), \
                 {} dropped over {} replays; FINE times from {:?}{}",
                zones.recorded,
                zones.collected,
                zones.activity_zones,
                zones.dropped,
                warm + n,
                zones.fine_source,
                zones
                    .cupti_unavailable
                    .map(|r| format!(" (CUPTI unavailable: {r})"))
                    .unwrap_or_default(),
            )),
        );
    }
    Ok(())
}
