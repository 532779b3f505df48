//! Per-function call counters and injected faults.
//!
//! A fault makes calls `first..=last` of one function (counted from the library's load, from 1)
//! return a chosen `CUresult` instead of running. Faults come from `CUHAL_FAKE_FAIL` (see
//! [`FAIL_ENV`]) and from the control functions (`cuhal_fake_fail`, `cuhal_fake_fail_calls`),
//! which count from the call after the current one, so a test can say "the 3rd cuEventQuery
//! from now on fails with CUDA_ERROR_ILLEGAL_ADDRESS, and every one after it".

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// Functions that fail, comma-separated: `name=code` (every call), `name=code@N` (the Nth call
/// only) or `name=code@N..` (the Nth call and every later one).
pub const FAIL_ENV: &str = "CUHAL_FAKE_FAIL";

/// Calls `first..=last` (or every call from `first`, if `last` is `None`) return `code`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The first failing call number (1 is the first call ever made).
    pub first: u64,
    /// The last failing call number; `None` for every later call.
    pub last: Option<u64>,
    /// The `CUresult` returned.
    pub code: c_int,
}

impl Fault {
    fn covers(&self, call: u64) -> bool {
        call >= self.first && self.last.is_none_or(|last| call <= last)
    }
}

/// The counters and the faults of one loaded instance.
#[derive(Debug, Default)]
pub struct Faults {
    calls: HashMap<String, u64>,
    faults: HashMap<String, Fault>,
}

impl Faults {
    fn from_env() -> Self {
        let mut faults = Faults::default();
        if let Ok(list) = std::env::var(FAIL_ENV) {
            for entry in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match parse(entry) {
                    Some((name, fault)) => {
                        faults.faults.insert(name.to_owned(), fault);
                    }
                    None => eprintln!(
                        "cuhal-fake-driver: ignoring malformed {FAIL_ENV} entry {entry:?}"
                    ),
                }
            }
        }
        faults
    }

    /// How many times `name` has been called.
    pub fn calls(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }

    /// Makes the `nth` call of `name` from now (1: the next one) and the `count - 1` after it
    /// return `code`; `count` 0 means every later call. Replaces any earlier fault of `name`;
    /// `code` 0 (success) removes it.
    pub fn inject(&mut self, name: &str, nth: u64, count: u64, code: c_int) {
        if code == 0 {
            self.faults.remove(name);
            return;
        }
        let first = self.calls(name) + nth.max(1);
        let last = (count > 0).then(|| first + count - 1);
        self.faults
            .insert(name.to_owned(), Fault { first, last, code });
    }

    /// Removes every fault.
    pub fn clear(&mut self) {
        self.faults.clear();
    }
}

/// Parses `name=code`, `name=code@N` or `name=code@N..`.
fn parse(entry: &str) -> Option<(&str, Fault)> {
    let (name, rest) = entry.split_once('=')?;
    let name = name.trim();
    let (code, calls) = match rest.split_once('@') {
        Some((code, calls)) => (code, Some(calls.trim())),
        None => (rest, None),
    };
    let code = code.trim().parse().ok()?;
    let (first, last) = match calls {
        None => (1, None),
        Some(calls) => match calls.strip_suffix("..") {
            Some(first) => (first.parse().ok()?, None),
            None => {
                let n = calls.parse().ok()?;
                (n, Some(n))
            }
        },
    };
    (!name.is_empty() && first >= 1).then_some((name, Fault { first, last, code }))
}

/// The instance's counters and faults, created from the environment on first use.
pub fn faults() -> MutexGuard<'static, Faults> {
    static FAULTS: OnceLock<Mutex<Faults>> = OnceLock::new();
    FAULTS
        .get_or_init(|| Mutex::new(Faults::from_env()))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Counts a call of `name`; returns the injected code if this call is to fail.
pub(crate) fn on_call(name: &'static str) -> Option<c_int> {
    let mut faults = faults();
    let count = faults.calls.entry(name.to_owned()).or_insert(0);
    *count += 1;
    let call = *count;
    faults
        .faults
        .get(name)
        .filter(|f| f.covers(call))
        .map(|f| f.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_into_call_ranges() {
        let every = Fault {
            first: 1,
            last: None,
            code: 700,
        };
        assert_eq!(parse("cuEventQuery=700"), Some(("cuEventQuery", every)));
        let third = Fault {
            first: 3,
            last: Some(3),
            code: 2,
        };
        assert_eq!(parse(" cuMemAlloc = 2@3"), Some(("cuMemAlloc", third)));
        let onward = Fault {
            first: 3,
            last: None,
            code: 2,
        };
        assert_eq!(parse("cuMemAlloc=2@3.."), Some(("cuMemAlloc", onward)));
        for bad in ["cuInit", "=3", "cuInit=x", "cuInit=3@0", "cuInit=3@x.."] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn injected_faults_count_from_the_next_call() {
        let mut f = Faults::default();
        f.calls.insert("cuEventQuery".into(), 10);
        f.inject("cuEventQuery", 2, 3, 700);
        let fault = f.faults["cuEventQuery"];
        let failing: Vec<u64> = (9..16).filter(|&c| fault.covers(c)).collect();
        assert_eq!(failing, [12, 13, 14]);
        f.inject("cuEventQuery", 1, 0, 999);
        assert!(f.faults["cuEventQuery"].covers(11) && f.faults["cuEventQuery"].covers(1 << 40));
        f.inject("cuEventQuery", 1, 0, 0);
        assert!(f.faults.is_empty());
    }
}
