//! [`FineSource`]: where a context's FINE command zones get their times, and the opening of
//! the CUPTI session that [`CuptiChoice`] asks for (falling back to timing events, said once
//! per process). The context does this once at creation; `activity` reads the session.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::config::CuptiChoice;
use crate::Error;
use crate::cupti::{CuptiError, CuptiSession};

/// Where a context's FINE command zones get their times.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum FineSource {
    /// Not FINE: no command zones.
    #[default]
    None,
    /// Timing events around each command.
    Events,
    /// CUPTI activity records.
    Cupti,
}

/// Says once per process why FINE tracing fell back to events.
fn report_fallback(error: &CuptiError) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        eprintln!("cuhal: FINE tracing uses timing events, not CUPTI: {error}");
    }
}

/// Opens the CUPTI session `choice` asks for: one whose activity kinds are gated by windows
/// when `sampled` ([`CuptiSession::acquire_sampled`]), else enabled for its life.
/// `Ok(Err(reason))`: fell back to events.
pub(crate) fn open_cupti(
    choice: &CuptiChoice,
    sampled: bool,
) -> Result<Result<Arc<CuptiSession>, &'static str>, Error> {
    let acquire = |path: Option<&std::path::Path>| {
        if sampled {
            CuptiSession::acquire_sampled(path)
        } else {
            CuptiSession::acquire(path)
        }
    };
    let (result, required) = match choice {
        CuptiChoice::Off => return Ok(Err("turned off")),
        CuptiChoice::Auto => (acquire(None), false),
        CuptiChoice::Required => (acquire(None), true),
        CuptiChoice::Library { path, required } => (acquire(Some(path)), *required),
        CuptiChoice::Api { api, required } => (
            if sampled {
                CuptiSession::acquire_sampled_with(*api)
            } else {
                CuptiSession::acquire_with(*api)
            },
            *required,
        ),
    };
    match result {
        Ok(session) => Ok(Ok(session)),
        Err(e) if required => Err(Error::Cupti(e)),
        Err(e) => {
            report_fallback(&e);
            Ok(Err(e.reason()))
        }
    }
}
