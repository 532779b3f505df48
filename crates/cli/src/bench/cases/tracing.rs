//! Case 6, tracing overhead: case 4's graph replay with tracing at COARSE and at FINE, against
//! the same replay with tracing off, all through cuhal (the raw driver has no tracing to
//! compare with). Reported, with no goal.

use anyhow::Result;

use super::{Env, progress};
use crate::bench::report::{Comparison, Goal, Report};

/// Runs case 6.
pub fn run(_env: &Env<'_>, report: &mut Report) -> Result<()> {
    progress("case 6 (tracing): needs cuhal's Device API");
    for level in ["COARSE", "FINE"] {
        report.comparisons.push(
            Comparison::new(
                "6",
                format!(
                    "tracing {level}: case 4 graph replay, traced (floor column: the same replay untraced)"
                ),
                None,
                None,
                Goal::Report,
            )
            .note(super::CUHAL_PENDING),
        );
    }
    Ok(())
}
