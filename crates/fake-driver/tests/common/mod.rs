//! Shared by the fake driver's tests: a private copy of the built library, steered through
//! its exported control functions.
#![allow(dead_code)] // each test file uses a different part

use std::ffi::{CString, c_char, c_int};
use std::fs;
use std::path::PathBuf;

use libloading::Library;

/// The library cargo built for this package, next to the test executable.
pub fn built_library() -> PathBuf {
    cuhal_fake_driver::harness::FakeDriver::built_library().unwrap_or_else(|e| panic!("{e}"))
}

/// The last `cuGetProcAddress` request for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// 1 for `cuGetProcAddress`, 2 for `cuGetProcAddress_v2`.
    pub via: c_int,
    pub cuda_version: c_int,
    pub flags: u64,
}

/// One private instance of the fake driver: a copy of the library under a unique name, so
/// its settings are its own (the dynamic loader shares one instance per file).
pub struct Fake {
    pub path: PathBuf,
    control: Library,
}

impl Fake {
    /// A plain copy: both resolvers present.
    pub fn new(test: &str) -> Fake {
        Fake::copy(test, &[])
    }

    /// A copy without `cuGetProcAddress_v2`, like a driver older than CUDA 12.0.
    pub fn without_v2(test: &str) -> Fake {
        Fake::copy(test, &["cuGetProcAddress_v2"])
    }

    /// A copy with neither resolver: not a usable CUDA driver.
    pub fn without_resolvers(test: &str) -> Fake {
        Fake::copy(test, &["cuGetProcAddress_v2", "cuGetProcAddress"])
    }

    /// Copies the built library, renaming the given exports so `dlsym` cannot find them.
    ///
    /// An export's name lives in the dynamic string table (and the static one) as a
    /// NUL-terminated string; changing its last character in place keeps every offset and
    /// size valid, and the symbol hash no longer matches the original name, so the loader
    /// reports it missing, exactly as for a library built without it.
    fn copy(test: &str, remove: &[&str]) -> Fake {
        let mut bytes = fs::read(built_library()).expect("read the built fake driver");
        for symbol in remove {
            let pattern = format!("{symbol}\0").into_bytes();
            let renamed = rename_all(&mut bytes, &pattern);
            assert!(
                renamed > 0,
                "{symbol} not found in the fake driver's symbol tables"
            );
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-driver");
        fs::create_dir_all(&dir).expect("create the scratch directory");
        let path = dir.join(format!("libcuda-{test}-{}.so", std::process::id()));
        fs::write(&path, bytes).expect("write the fake driver copy");
        // SAFETY: the fake driver's initializers (Rust's standard ones) have no preconditions.
        let control = unsafe { Library::new(&path) }.expect("open the fake driver copy");
        Fake { path, control }
    }

    /// Whether `dlsym` finds `name` in this copy.
    pub fn exports(&self, name: &str) -> bool {
        let name = CString::new(name).unwrap();
        // SAFETY: only the symbol's presence is checked; the pointer is never used.
        unsafe { self.control.get::<*const ()>(name.as_bytes_with_nul()) }.is_ok()
    }

    fn control<T: Copy>(&self, name: &[u8]) -> T {
        // SAFETY: every caller names a control function of src/control.rs with `T` its exact
        // signature; the pointer is used only while `self.control` keeps the library loaded.
        unsafe {
            *self
                .control
                .get::<T>(name)
                .expect("control function exported")
        }
    }

    /// `cuGetProcAddress` will report `name` missing.
    pub fn hide(&self, name: &str) {
        let f: unsafe extern "C" fn(*const c_char) -> c_int = self.control(b"cuhal_fake_hide\0");
        let name = CString::new(name).unwrap();
        // SAFETY: `name` is NUL-terminated and outlives the call.
        assert_eq!(unsafe { f(name.as_ptr()) }, 0);
    }

    /// The implemented function `name` will return `code`.
    pub fn fail(&self, name: &str, code: i32) {
        let f: unsafe extern "C" fn(*const c_char, c_int) -> c_int =
            self.control(b"cuhal_fake_fail\0");
        let name = CString::new(name).unwrap();
        // SAFETY: `name` is NUL-terminated and outlives the call.
        assert_eq!(unsafe { f(name.as_ptr(), code) }, 0);
    }

    pub fn set_driver_version(&self, version: i32) {
        let f: extern "C" fn(c_int) = self.control(b"cuhal_fake_set_driver_version\0");
        f(version);
    }

    pub fn set_device_count(&self, count: i32) {
        let f: extern "C" fn(c_int) = self.control(b"cuhal_fake_set_device_count\0");
        f(count);
    }

    /// How often `name` was requested, and the last request.
    pub fn requested(&self, name: &str) -> (i32, Option<Request>) {
        let f: unsafe extern "C" fn(*const c_char, *mut c_int, *mut c_int, *mut u64) -> c_int =
            self.control(b"cuhal_fake_requested\0");
        let name = CString::new(name).unwrap();
        let mut r = Request {
            via: 0,
            cuda_version: 0,
            flags: u64::MAX,
        };
        // SAFETY: `name` is NUL-terminated; the out-pointers are valid locals.
        let count = unsafe { f(name.as_ptr(), &mut r.via, &mut r.cuda_version, &mut r.flags) };
        (count, (count > 0).then_some(r))
    }

    /// Requests made through `cuGetProcAddress` (1) or `cuGetProcAddress_v2` (2).
    pub fn request_count(&self, via: i32) -> i32 {
        let f: extern "C" fn(c_int) -> c_int = self.control(b"cuhal_fake_request_count\0");
        f(via)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // Unlinking a mapped library is fine; the mapping stays valid.
        let _ = fs::remove_file(&self.path);
    }
}

/// Replaces the last byte before the NUL of every occurrence of `pattern` (a name plus NUL)
/// with `X`; returns how many were renamed.
fn rename_all(bytes: &mut [u8], pattern: &[u8]) -> usize {
    let mut count = 0;
    let mut i = 0;
    while i + pattern.len() <= bytes.len() {
        // Match whole names only: the byte before must end the previous string.
        if bytes[i..].starts_with(pattern) && (i == 0 || bytes[i - 1] == 0) {
            bytes[i + pattern.len() - 2] = b'X';
            count += 1;
            i += pattern.len();
        } else {
            i += 1;
        }
    }
    count
}
