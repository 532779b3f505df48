//! Case 6, tracing overhead: case 4's replay (a 100-dispatch graph command buffer, submit +
//! host wait) through cuhal with tracing at COARSE and at FINE, beside the same replay with
//! tracing off, measured in the same run. The raw driver has no tracing, so the "floor" column
//! here is cuhal untraced. Goals: COARSE at most 1.03x and FINE at most 1.2x the untraced
//! replay; the notes say where FINE got its times (CUPTI activity records, or events when CUPTI
//! could not be had) and the zone counts show that tracing recorded and collected what it should.
//!
//! The raw CUPTI floor: the raw graph replay of case 4 (`cuGraphLaunch`, record, sync) with the
//! activity kinds FINE uses enabled through raw CUPTI calls and no cuhal at all, beside the same
//! raw replay with CUPTI off; once more with a `cuptiActivityFlushAll` after every replay. What
//! the first costs is CUPTI's own price for timing every kernel: FINE cannot be cheaper. It runs
//! after COARSE (which never loads CUPTI) and before FINE.
//!
//! Sampled FINE: the same replay with FINE sampling one replay in 16 and one in 64
//! ([`FineSampling::OneIn`]): CUPTI's activity kinds are enabled around the sampled replays'
//! issue only, the others are traced as COARSE is. What the rows measure is the amortized cost
//! against the untraced replay; goal: at most 1.05x at 1 in 64 (1 in 16 is reported). The
//! notes give the replays sampled and not, to show the rate held.
//!
//! Stamped FINE: the same chain with every `step` dispatched as `step_stamped`, which times
//! itself through the zone-stamp ABI (`cuhal_zone_stamp.cuh`), untraced (a null slot: what the
//! stamps cost a kernel that is not traced) and at FINE (every replay, every kernel a zone from
//! its own `%globaltimer` readings; CUPTI off, which stamped kernels do not need), both against
//! the unstamped replay untraced; goal: FINE at most 1.05x. They run right after COARSE,
//! before anything in the process uses CUPTI, whose cost stays with every later replay.

use anyhow::{Result, bail};
use cuhal::{CommandBufferMode, DeviceOptions, FineSampling, Verbosity};

use super::raw_cupti::RawCupti;
use super::replay::CHAIN;
use super::replay::{REPLAYS, ZoneCounts, cuhal_replay, cuhal_replay_sampled, graph_floor_with};
use super::{Env, progress, summarize};
use crate::report::{Comparison, Goal, Report};
use crate::stats::Summary;

/// Runs case 6.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    progress(&format!("case 6 (tracing): untraced replay, {n} replays"));
    let mut off = cuhal_replay(env, CommandBufferMode::Graph, Verbosity::Off, warm, n)?;
    let off = summarize("case 6 untraced", &mut off.samples)?;
    report.measured("6", "cuhal graph replay, tracing off", off);
    let mut cupti_on = None;
    for verbosity in [Verbosity::Coarse, Verbosity::Fine] {
        if verbosity == Verbosity::Fine {
            // Before CUPTI is first used: once its kinds were on, every later replay in the
            // process pays for them (`probes/cupti_residue.cu`), stamped ones too.
            stamped_rows(env, report, off, warm, n)?;
            cupti_on = raw_cupti_floor(env, report, warm, n)?;
        }
        progress(&format!(
            "case 6 (tracing): tracing {verbosity:?}, {n} replays"
        ));
        let mut traced = cuhal_replay(env, CommandBufferMode::Graph, verbosity, warm, n)?;
        let zones = traced.zones;
        ensure_traced(&format!("tracing {verbosity:?}"), &zones)?;
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
        if verbosity == Verbosity::Fine
            && let Some(raw) = cupti_on
        {
            report.comparisons.push(
                Comparison::new(
                    "6",
                    "tracing Fine against the raw CUPTI floor (floor column: raw graph replay, CUPTI activity on)",
                    Some(summary),
                    Some(raw),
                    Goal::Report,
                )
                .note(
                    "what cuhal adds to CUPTI's own cost: its untraced overhead over the raw \
                     replay (case 4) plus FINE's correlation and collection",
                ),
            );
        }
    }
    sampled_rows(env, report, off, warm, n)
}

/// The stamped rows (see the module documentation), and one more with a ring of one slot,
/// which no command buffer of the chain fits: every submission binds the discard region (the
/// same address each time, so nothing is patched) and nothing is read back. What it saves
/// against the FINE row is what the ring's regions cost.
fn stamped_rows(
    env: &Env<'_>,
    report: &mut Report,
    off: Summary,
    warm: usize,
    n: usize,
) -> Result<()> {
    let ring = DeviceOptions::default().trace_stamp_slots;
    for (verbosity, slots, goal, what) in [
        (Verbosity::Off, ring, Goal::Report, ""),
        (Verbosity::Fine, ring, Goal::RatioAtMost(1.05), ""),
        (
            Verbosity::Fine,
            1,
            Goal::Report,
            ", a ring of 1 slot (stamps dropped)",
        ),
    ] {
        progress(&format!(
            "case 6 (tracing): stamped kernels, tracing {verbosity:?}{what}, {n} replays"
        ));
        let mut traced = cuhal_replay_sampled(
            env,
            CommandBufferMode::Graph,
            verbosity,
            FineSampling::Every,
            Some(slots),
            warm,
            n,
        )?;
        let zones = traced.zones;
        let kernels = (warm + n) as u64 * u64::from(CHAIN);
        if verbosity == Verbosity::Fine && slots == ring && zones.stamp_zones != kernels {
            bail!(
                "stamped FINE: {} zones from stamps for {kernels} kernels ({} dropped)",
                zones.stamp_zones,
                zones.dropped
            );
        }
        let summary = summarize("case 6 stamped", &mut traced.samples)?;
        report.measured(
            "6",
            format!("cuhal graph replay, stamped kernels, tracing {verbosity:?}{what}"),
            summary,
        );
        report.comparisons.push(
            Comparison::new(
                "6",
                format!(
                    "tracing {verbosity:?}{what}, kernels stamped: case 4 graph replay (floor column: unstamped, untraced)"
                ),
                Some(summary),
                Some(off),
                goal,
            )
            .note(format!(
                "stamped, tracing {verbosity:?}{what}: {} zones from the kernels' stamps, {} collected, \
                 {} dropped over {} replays",
                zones.stamp_zones,
                zones.collected,
                zones.dropped,
                warm + n,
            )),
        );
    }
    Ok(())
}

/// The sampled FINE rows (see the module documentation): 1 in 16 reported, 1 in 64 against
/// its goal.
fn sampled_rows(
    env: &Env<'_>,
    report: &mut Report,
    off: Summary,
    warm: usize,
    n: usize,
) -> Result<()> {
    for (one_in, goal) in [(16u32, Goal::Report), (64, Goal::RatioAtMost(1.05))] {
        progress(&format!(
            "case 6 (tracing): tracing Fine sampled 1 in {one_in}, {n} replays"
        ));
        let mut traced = cuhal_replay_sampled(
            env,
            CommandBufferMode::Graph,
            Verbosity::Fine,
            FineSampling::OneIn(one_in),
            None,
            warm,
            n,
        )?;
        let zones = traced.zones;
        ensure_traced(&format!("FINE sampled 1 in {one_in}"), &zones)?;
        let summary = summarize("case 6 sampled", &mut traced.samples)?;
        report.measured(
            "6",
            format!("cuhal graph replay, tracing Fine sampled 1 in {one_in}"),
            summary,
        );
        report.comparisons.push(
            Comparison::new(
                "6",
                format!(
                    "tracing Fine sampled 1 in {one_in}: case 4 graph replay, amortized (floor column: the same replay untraced)"
                ),
                Some(summary),
                Some(off),
                goal,
            )
            .note(format!(
                "sampled {} and unsampled {} replays of {}; {} zones collected ({} from CUPTI \
                 activity records), {} dropped; FINE times from {:?}{}",
                zones.sampled_replays,
                zones.unsampled_replays,
                warm + n,
                zones.collected,
                zones.activity_zones,
                zones.dropped,
                zones.fine_source,
                zones
                    .cupti_unavailable
                    .map(|r| format!(" (CUPTI unavailable: {r}; sampling has no effect)"))
                    .unwrap_or_default(),
            )),
        );
    }
    Ok(())
}

/// The raw CUPTI floor rows (see the module documentation); returns the replay with CUPTI on.
/// CUPTI that cannot be had is a note in the report, not a failure: FINE then falls back to
/// events and says so below.
fn raw_cupti_floor(
    env: &Env<'_>,
    report: &mut Report,
    warm: usize,
    n: usize,
) -> Result<Option<Summary>> {
    progress(&format!(
        "case 6 (tracing): raw graph replay, CUPTI off, {n} replays"
    ));
    let mut plain = graph_floor_with(env, warm, n, || Ok(()))?;
    let plain = summarize("case 6 raw replay", &mut plain)?;
    report.measured("6", "raw graph replay, CUPTI off", plain);
    let cupti = match RawCupti::enable() {
        Ok(cupti) => cupti,
        Err(e) => {
            report.comparisons.push(
                Comparison::new(
                    "6",
                    "raw CUPTI floor: raw graph replay with CUPTI's kernel, memcpy and memset activity on",
                    None,
                    Some(plain),
                    Goal::Report,
                )
                .note(format!("CUPTI could not be enabled: {e:#}")),
            );
            return Ok(None);
        }
    };
    let before = RawCupti::records();
    progress(&format!(
        "case 6 (tracing): raw graph replay, CUPTI on, {n} replays"
    ));
    let mut on = graph_floor_with(env, warm, n, || Ok(()))?;
    let on = summarize("case 6 raw CUPTI", &mut on)?;
    progress(&format!(
        "case 6 (tracing): raw graph replay, CUPTI on and flushed per replay, {n} replays"
    ));
    let mut flushed = graph_floor_with(env, warm, n, || cupti.flush())?;
    let flushed = summarize("case 6 raw CUPTI flushed", &mut flushed)?;
    drop(cupti);
    let records = RawCupti::records() - before;
    report.measured("6", "raw graph replay, CUPTI activity on", on);
    report.measured(
        "6",
        "raw graph replay, CUPTI activity on, cuptiActivityFlushAll per replay",
        flushed,
    );
    report.comparisons.push(
        Comparison::new(
            "6",
            "raw CUPTI floor: raw graph replay with CUPTI's kernel, memcpy and memset activity on (floor column: CUPTI off)",
            Some(on),
            Some(plain),
            Goal::RatioAtMost(1.2),
        )
        .note(format!(
            "no cuhal; {records} activity records over {} replays of {CHAIN} kernels; if this misses \
             1.2x, FINE's goal is bounded by CUPTI itself",
            2 * (warm + n)
        )),
    );
    report.comparisons.push(Comparison::new(
        "6",
        "raw CUPTI floor with cuptiActivityFlushAll(0) after every replay (floor column: CUPTI off)",
        Some(flushed),
        Some(plain),
        Goal::Report,
    ));
    Ok(Some(on))
}

/// Fails the case when a traced run `what` recorded or collected no zones: it did not trace.
fn ensure_traced(what: &str, zones: &ZoneCounts) -> Result<()> {
    if zones.recorded == 0 || zones.collected == 0 {
        bail!(
            "case 6: {what} recorded {} and collected {} zones: it did not trace",
            zones.recorded,
            zones.collected
        );
    }
    Ok(())
}
