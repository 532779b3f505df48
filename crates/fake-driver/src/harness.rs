//! Test-side handle on a private instance of the fake: find the built library, copy it, open
//! it, and steer it through its control functions.
//!
//! The dynamic loader shares one instance per file, so each [`FakeDriver`] copies the built
//! library to a fresh path: tests running in parallel then each have their own devices,
//! objects, counters and faults. Hand [`FakeDriver::path`] to `cuhal_sys::DriverApi::load_from`
//! (or put it in `CUHAL_CUDA_LIBRARY`); the loader then opens this same instance.

use std::ffi::{CString, c_char, c_int};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::Library;

use crate::control::{Counts, GraphLaunch};

/// Why a private instance could not be made.
#[derive(Debug)]
pub enum Error {
    /// The built library is not next to the running executable.
    NotBuilt {
        /// The file name looked for.
        name: String,
        /// Where it was looked for.
        searched: Vec<PathBuf>,
    },
    /// Copying the library failed.
    Copy(PathBuf, std::io::Error),
    /// Opening the copy, or finding a control function in it, failed.
    Load(PathBuf, libloading::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotBuilt { name, searched } => write!(
                f,
                "{name} was not built in {searched:?}: depend on cuhal-fake-driver (a \
                 dev-dependency builds its cdylib next to the test executables)"
            ),
            Error::Copy(path, e) => write!(f, "copying the fake driver to {}: {e}", path.display()),
            Error::Load(path, e) => write!(f, "opening the fake driver {}: {e}", path.display()),
        }
    }
}

impl std::error::Error for Error {}

type NameFn = unsafe extern "C" fn(*const c_char) -> i64;

/// The control functions of one instance, resolved once.
struct Controls {
    hide: unsafe extern "C" fn(*const c_char) -> c_int,
    fail_calls: unsafe extern "C" fn(*const c_char, u64, u64, c_int) -> c_int,
    clear_faults: extern "C" fn(),
    calls: NameFn,
    launches: NameFn,
    counts: unsafe extern "C" fn(*mut Counts) -> c_int,
    set_driver_version: extern "C" fn(c_int),
    set_device_count: extern "C" fn(c_int),
    set_timing: extern "C" fn(u64, u64),
    finish_work: extern "C" fn(),
    elapsed_not_ready: extern "C" fn() -> u64,
    graph_launches: unsafe extern "C" fn(*mut GraphLaunch, usize) -> i64,
    clear_graph_launches: extern "C" fn(),
}

/// A private copy of the fake driver, loaded and steerable. Dropping it deletes the copy
/// (loaded mappings stay valid).
pub struct FakeDriver {
    path: PathBuf,
    controls: Controls,
    // Last: the function pointers above point into it.
    _library: Library,
}

impl FakeDriver {
    /// The cdylib cargo built, next to the running executable: a test binary and the library
    /// both live in `target/<profile>/deps`, an example one directory below the library.
    pub fn built_library() -> Result<PathBuf, Error> {
        let name = format!(
            "{}cuhal_fake_driver{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut searched = vec![dir.clone()];
        if let Some(parent) = dir.parent() {
            searched.push(parent.to_path_buf());
            searched.push(parent.join("deps"));
        }
        searched
            .iter()
            .map(|d| d.join(&name))
            .find(|p| p.exists())
            .ok_or(Error::NotBuilt { name, searched })
    }

    /// A fresh instance: a copy of the built library in the temporary directory, named after
    /// `tag`, the process and a counter.
    pub fn private(tag: &str) -> Result<Self, Error> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let source = Self::built_library()?;
        let dir = std::env::temp_dir().join("cuhal-fake-driver");
        let path = dir.join(format!(
            "libcuda-{tag}-{}-{}.so",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::copy(&source, &path))
            .map_err(|e| Error::Copy(path.clone(), e))?;
        Self::open(path)
    }

    /// Opens the instance at `path` (a copy the caller made).
    pub fn open(path: PathBuf) -> Result<Self, Error> {
        let load = |e| Error::Load(path.clone(), e);
        // SAFETY: the fake's initializers are Rust's standard ones, without preconditions.
        let library = unsafe { Library::new(&path) }.map_err(load)?;
        // SAFETY: each name is a control function of `control.rs` and each type its exact
        // signature; the pointers are kept only as long as `library`, which the struct owns.
        let controls = unsafe {
            Controls {
                hide: *library.get(b"cuhal_fake_hide\0").map_err(load)?,
                fail_calls: *library.get(b"cuhal_fake_fail_calls\0").map_err(load)?,
                clear_faults: *library.get(b"cuhal_fake_clear_faults\0").map_err(load)?,
                calls: *library.get(b"cuhal_fake_calls\0").map_err(load)?,
                launches: *library.get(b"cuhal_fake_launches\0").map_err(load)?,
                counts: *library.get(b"cuhal_fake_counts\0").map_err(load)?,
                set_driver_version: *library
                    .get(b"cuhal_fake_set_driver_version\0")
                    .map_err(load)?,
                set_device_count: *library
                    .get(b"cuhal_fake_set_device_count\0")
                    .map_err(load)?,
                set_timing: *library.get(b"cuhal_fake_set_timing\0").map_err(load)?,
                finish_work: *library.get(b"cuhal_fake_finish_work\0").map_err(load)?,
                elapsed_not_ready: *library
                    .get(b"cuhal_fake_elapsed_not_ready\0")
                    .map_err(load)?,
                graph_launches: *library.get(b"cuhal_fake_graph_launches\0").map_err(load)?,
                clear_graph_launches: *library
                    .get(b"cuhal_fake_clear_graph_launches\0")
                    .map_err(load)?,
            }
        };
        Ok(Self {
            path,
            controls,
            _library: library,
        })
    }

    /// The library file to load.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Calls `f` with `name` as a C string; names with a NUL cannot be driver names, and get
    /// `default`.
    fn with_name<T>(name: &str, default: T, f: impl FnOnce(*const c_char) -> T) -> T {
        match CString::new(name) {
            Ok(name) => f(name.as_ptr()),
            Err(_) => default,
        }
    }

    /// `cuGetProcAddress` will report `name` missing.
    pub fn hide(&self, name: &str) {
        // SAFETY: the pointer is a NUL-terminated string that outlives the call.
        Self::with_name(name, 0, |n| unsafe { (self.controls.hide)(n) });
    }

    /// Every call of `name` from now on returns `code` (0: stop failing).
    pub fn fail(&self, name: &str, code: i32) {
        self.fail_calls(name, 1, 0, code);
    }

    /// The `nth` call of `name` from now (1: the next) and the `count - 1` after it return
    /// `code`; `count` 0: every later call. Replaces an earlier fault of `name`.
    pub fn fail_calls(&self, name: &str, nth: u64, count: u64, code: i32) {
        // SAFETY: the pointer is a NUL-terminated string that outlives the call.
        Self::with_name(name, 0, |n| unsafe {
            (self.controls.fail_calls)(n, nth, count, code)
        });
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        (self.controls.clear_faults)();
    }

    /// How many times `name` has been called.
    pub fn calls(&self, name: &str) -> u64 {
        // SAFETY: the pointer is a NUL-terminated string that outlives the call.
        Self::with_name(name, 0, |n| unsafe { (self.controls.calls)(n) }).max(0) as u64
    }

    /// How many times kernels named `name` were launched.
    pub fn launches(&self, name: &str) -> u64 {
        // SAFETY: the pointer is a NUL-terminated string that outlives the call.
        Self::with_name(name, 0, |n| unsafe { (self.controls.launches)(n) }).max(0) as u64
    }

    /// What is alive in the instance now.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        // SAFETY: `counts` is a valid, writable `Counts`.
        unsafe { (self.controls.counts)(&mut counts) };
        counts
    }

    /// Sets the version `cuDriverGetVersion` reports.
    pub fn set_driver_version(&self, version: i32) {
        (self.controls.set_driver_version)(version);
    }

    /// Sets the number of devices.
    pub fn set_device_count(&self, count: i32) {
        (self.controls.set_device_count)(count);
    }

    /// Makes device work take time on the model clock (see [`crate::stream::Timing`]): each
    /// kernel or graph launch keeps its stream busy for `launch`; a stream that waits on the
    /// device for an event not yet complete goes on `cross_stream` after it. Events then
    /// complete after they are recorded, as on a GPU. Zero and zero: synchronous again.
    pub fn set_timing(&self, launch: std::time::Duration, cross_stream: std::time::Duration) {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        (self.controls.set_timing)(ns(launch), ns(cross_stream));
    }

    /// Every `cuGraphLaunch` since the instance was loaded or
    /// [`clear_graph_launches`](Self::clear_graph_launches), in call order: the executable, the stream, and whether
    /// the executable was then still running, or had been patched while running, on another
    /// stream (on the model clock of [`set_timing`](Self::set_timing)).
    pub fn graph_launches(&self) -> Vec<GraphLaunch> {
        // SAFETY: a null pointer with capacity 0 only counts.
        let total = unsafe { (self.controls.graph_launches)(std::ptr::null_mut(), 0) };
        let mut launches = vec![GraphLaunch::default(); usize::try_from(total).unwrap_or(0)];
        // SAFETY: `launches` has room for `launches.len()` entries.
        let written =
            unsafe { (self.controls.graph_launches)(launches.as_mut_ptr(), launches.len()) };
        launches.truncate(usize::try_from(written).unwrap_or(0));
        launches
    }

    /// Forgets the graph launches recorded so far.
    pub fn clear_graph_launches(&self) {
        (self.controls.clear_graph_launches)();
    }

    /// Completes all work now (every recorded event complete, every stream idle), whatever the
    /// timing said: with a long [`set_timing`](Self::set_timing) launch, work stays in flight
    /// until this.
    pub fn finish_work(&self) {
        (self.controls.finish_work)();
    }

    /// How many `cuEventElapsedTime` calls so far found one of their events not complete yet
    /// (the driver answers `CUDA_ERROR_NOT_READY`; compute-sanitizer reports each as an API
    /// error, so cuhal queries events before asking for their times).
    pub fn elapsed_not_ready(&self) -> u64 {
        (self.controls.elapsed_not_ready)()
    }
}

impl Drop for FakeDriver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl fmt::Debug for FakeDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeDriver")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
