//! The fake's settings and its record of symbol requests.
//!
//! Settings start from these environment variables, read once when the library is first
//! used:
//!
//! | variable | meaning | example |
//! |---|---|---|
//! | `CUHAL_FAKE_HIDE` | names `cuGetProcAddress` reports missing | `cuGraphLaunch,cuStreamGetId` |
//! | `CUHAL_FAKE_FAIL` | functions that return an error code (see [`crate::faults`]) | `cuInit=100,cuEventQuery=700@5..` |
//! | `CUHAL_FAKE_DRIVER_VERSION` | what `cuDriverGetVersion` reports | `13000` |
//! | `CUHAL_FAKE_DEVICES` | how many devices there are | `2` |
//! | `CUHAL_FAKE_NO_PEER_ACCESS` | devices cannot reach each other's memory (any value) | `1` |
//!
//! Malformed entries are reported on stderr and ignored: a driver must not panic.

use std::sync::{Mutex, MutexGuard, OnceLock};

/// Names `cuGetProcAddress` reports missing (comma-separated).
pub const HIDE_ENV: &str = "CUHAL_FAKE_HIDE";
pub use crate::faults::FAIL_ENV;
/// When set (to anything), no device has peer access to another.
pub const NO_PEER_ACCESS_ENV: &str = "CUHAL_FAKE_NO_PEER_ACCESS";
/// The CUDA version `cuDriverGetVersion` reports.
pub const DRIVER_VERSION_ENV: &str = "CUHAL_FAKE_DRIVER_VERSION";
/// The number of devices.
pub const DEVICES_ENV: &str = "CUHAL_FAKE_DEVICES";

/// The version reported when none is configured: CUDA 13.0, as on the project's H200.
pub const DEFAULT_DRIVER_VERSION: i32 = 13000;

/// Which resolver a request came through.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// `cuGetProcAddress` (CUDA 11.3 to 12.x signature, no status out-parameter).
    V1 = 1,
    /// `cuGetProcAddress_v2` (CUDA 12.0 and later).
    V2 = 2,
}

/// One call to a `cuGetProcAddress` form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The symbol asked for.
    pub name: String,
    /// The `cudaVersion` argument.
    pub cuda_version: i32,
    /// The `flags` argument.
    pub flags: u64,
    /// The resolver called.
    pub via: Via,
}

/// Everything the fake is told and remembers.
#[derive(Debug, Default)]
pub struct State {
    /// Names reported missing.
    pub hidden: Vec<String>,
    /// `cuDriverGetVersion`'s answer.
    pub driver_version: i32,
    /// `cuDeviceGetCount`'s answer.
    pub device_count: i32,
    /// Whether peer access is switched off between every pair of devices.
    pub no_peer_access: bool,
    /// Whether `cuInit` has succeeded.
    pub initialized: bool,
    /// Every resolution request, in order.
    pub requests: Vec<Request>,
}

impl State {
    fn from_env() -> Self {
        let mut state = State {
            driver_version: DEFAULT_DRIVER_VERSION,
            device_count: 1,
            ..State::default()
        };
        if let Ok(list) = std::env::var(HIDE_ENV) {
            state.hidden = names(&list).map(str::to_owned).collect();
        }
        if let Ok(text) = std::env::var(DRIVER_VERSION_ENV) {
            match text.trim().parse() {
                Ok(v) => state.driver_version = v,
                Err(_) => warn(DRIVER_VERSION_ENV, &text),
            }
        }
        state.no_peer_access = std::env::var_os(NO_PEER_ACCESS_ENV).is_some();
        if let Ok(text) = std::env::var(DEVICES_ENV) {
            match text.trim().parse() {
                Ok(n) if n >= 0 => state.device_count = n,
                _ => warn(DEVICES_ENV, &text),
            }
        }
        state
    }

    /// Whether `name` is hidden from `cuGetProcAddress`.
    pub fn is_hidden(&self, name: &str) -> bool {
        self.hidden.iter().any(|h| h == name)
    }
}

fn names(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn warn(var: &str, entry: &str) {
    eprintln!("cuhal-fake-driver: ignoring malformed {var} entry {entry:?}");
}

/// The instance's state, created from the environment on first use.
pub fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    // A poisoned lock only means a holder panicked; the data is still consistent enough for
    // a test double, and panicking here would abort the host process.
    STATE
        .get_or_init(|| Mutex::new(State::from_env()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
