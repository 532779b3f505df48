//! NCCL, loaded at run time like the driver.
//!
//! [`NcclApi::load`] opens, in order: the path the caller gives, else the path in
//! [`NCCL_LIBRARY_ENV`], else `libnccl.so.2` and `libnccl.so` through the loader's search path.
//! Every symbol comes from `dlsym` (NCCL has no resolver of its own), the version is read with
//! `ncclGetVersion` and checked against [`NCCL_MIN_VERSION`], and any failure is a typed
//! [`NcclError`]: a process without NCCL loads the driver and runs everything else unchanged.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::fmt;
use std::path::PathBuf;

use libloading::Library;

use crate::CUstream;
use crate::error::LoadAttempt;

/// The environment variable naming the NCCL library to load when no path is given.
pub const NCCL_LIBRARY_ENV: &str = "CUHAL_NCCL_LIBRARY";

/// Library names tried, in order, when neither a path nor [`NCCL_LIBRARY_ENV`] is given.
pub const NCCL_DEFAULT_LIBRARIES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// The oldest NCCL accepted (2.18.0, as `ncclGetVersion` encodes it): the first with every
/// entry point of [`NcclApi`] (`ncclCommGetAsyncError`, `ncclGetLastError`, send/recv, graph
/// capture of every collective) in the form declared here.
pub const NCCL_MIN_VERSION: i32 = 21800;

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclInProgress`: a nonblocking call has not finished.
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `ncclUniqueId`: 128 opaque bytes that rank 0 makes and every rank passes to init.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The id's bytes (NCCL_UNIQUE_ID_BYTES).
    pub internal: [u8; 128],
}

impl fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NcclUniqueId(..)")
    }
}

/// `ncclDataType_t`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclDataType {
    /// `ncclInt8`.
    I8 = 0,
    /// `ncclUint8`.
    U8 = 1,
    /// `ncclInt32`.
    I32 = 2,
    /// `ncclUint32`.
    U32 = 3,
    /// `ncclInt64`.
    I64 = 4,
    /// `ncclUint64`.
    U64 = 5,
    /// `ncclFloat16`.
    F16 = 6,
    /// `ncclFloat32`.
    F32 = 7,
    /// `ncclFloat64`.
    F64 = 8,
    /// `ncclBfloat16`.
    BF16 = 9,
}

impl NcclDataType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NcclDataType::I8 | NcclDataType::U8 => 1,
            NcclDataType::F16 | NcclDataType::BF16 => 2,
            NcclDataType::I32 | NcclDataType::U32 | NcclDataType::F32 => 4,
            NcclDataType::I64 | NcclDataType::U64 | NcclDataType::F64 => 8,
        }
    }
}

/// `ncclRedOp_t` (the built-in operations).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclRedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg`.
    Avg = 4,
}

/// Why NCCL could not be used, or what a call of it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NcclError {
    /// No candidate library could be opened.
    NotFound {
        /// Every path tried, with the loader's reason.
        tried: Vec<LoadAttempt>,
    },
    /// The library lacks a symbol this table needs.
    MissingSymbol {
        /// The symbol.
        symbol: &'static str,
        /// The library.
        library: String,
    },
    /// The library is older than [`NCCL_MIN_VERSION`].
    TooOld {
        /// Its version (`ncclGetVersion`'s encoding, e.g. 22805 for 2.28.5).
        version: i32,
        /// The library.
        library: String,
    },
    /// A call returned an error.
    Call {
        /// The function.
        call: &'static str,
        /// Its `ncclResult_t`.
        result: NcclResult,
        /// NCCL's name for the result (`ncclGetErrorString`) and, where the communicator had
        /// one, its last error message (`ncclGetLastError`).
        message: String,
    },
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NcclError::NotFound { tried } => {
                write!(f, "NCCL not found (tried")?;
                for attempt in tried {
                    write!(f, " {}: {};", attempt.path, attempt.reason)?;
                }
                write!(f, " set {NCCL_LIBRARY_ENV} or pass a path to load another)")
            }
            NcclError::MissingSymbol { symbol, library } => {
                write!(f, "{library} has no {symbol}: not a usable NCCL")
            }
            NcclError::TooOld { version, library } => write!(
                f,
                "{library} is NCCL {}, older than the {} cuhal needs",
                format_nccl_version(*version),
                format_nccl_version(NCCL_MIN_VERSION)
            ),
            NcclError::Call {
                call,
                result,
                message,
            } => write!(f, "{call} failed with ncclResult_t {result}: {message}"),
        }
    }
}

impl std::error::Error for NcclError {}

/// `2.28.5` for 22805 (NCCL 2.9 and later encode major*10000 + minor*100 + patch).
pub fn format_nccl_version(version: i32) -> String {
    format!(
        "{}.{}.{}",
        version / 10000,
        (version % 10000) / 100,
        version % 100
    )
}

macro_rules! nccl_api {
    ($( $(#[$doc:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        /// NCCL's function table. Fields are NCCL's entry points; calling one is `unsafe`: the
        /// caller upholds that function's contract from NCCL's documentation. The table keeps
        /// the library loaded for as long as it lives.
        #[allow(non_snake_case)]
        pub struct NcclApi {
            $( $(#[$doc])* pub $name: unsafe extern "C" fn($($ty),*) -> NcclResult, )*
            /// `ncclGetErrorString(result)`.
            pub ncclGetErrorString: unsafe extern "C" fn(NcclResult) -> *const c_char,
            /// `ncclGetLastError(comm)`.
            pub ncclGetLastError: unsafe extern "C" fn(NcclComm) -> *const c_char,
            version: i32,
            path: String,
            _library: Library,
        }

        impl NcclApi {
            #[allow(non_snake_case)]
            fn resolve(library: Library, path: String) -> Result<Self, NcclError> {
                macro_rules! symbol {
                    ($sym:ident, $t:ty) => {{
                        // SAFETY: the symbol's type is its declaration in nccl.h; the pointer is
                        // copied out while `library` lives and `library` moves into the table.
                        match unsafe { library.get::<$t>(concat!(stringify!($sym), "\0").as_bytes()) } {
                            Ok(f) => *f,
                            Err(_) => {
                                return Err(NcclError::MissingSymbol {
                                    symbol: stringify!($sym),
                                    library: path,
                                })
                            }
                        }
                    }};
                }
                $( let $name = symbol!($name, unsafe extern "C" fn($($ty),*) -> NcclResult); )*
                let ncclGetErrorString = symbol!(ncclGetErrorString, unsafe extern "C" fn(NcclResult) -> *const c_char);
                let ncclGetLastError = symbol!(ncclGetLastError, unsafe extern "C" fn(NcclComm) -> *const c_char);
                let mut api = Self {
                    $($name,)*
                    ncclGetErrorString,
                    ncclGetLastError,
                    version: 0,
                    path,
                    _library: library,
                };
                // SAFETY: `api.version` is a valid out-pointer.
                let r = unsafe { (api.ncclGetVersion)(&mut api.version) };
                if r != NCCL_SUCCESS || api.version < NCCL_MIN_VERSION {
                    return Err(NcclError::TooOld {
                        version: if r == NCCL_SUCCESS { api.version } else { 0 },
                        library: api.path.clone(),
                    });
                }
                Ok(api)
            }
        }
    };
}

nccl_api! {
    /// `ncclGetVersion(&version)`.
    fn ncclGetVersion(version: *mut c_int);
    /// `ncclGetUniqueId(&id)`.
    fn ncclGetUniqueId(id: *mut NcclUniqueId);
    /// `ncclCommInitRank(&comm, nranks, id, rank)`: the current device becomes `rank`'s.
    fn ncclCommInitRank(comm: *mut NcclComm, nranks: c_int, id: NcclUniqueId, rank: c_int);
    /// `ncclCommInitAll(comms, ndev, devlist)`: one communicator per device of this process.
    fn ncclCommInitAll(comms: *mut NcclComm, ndev: c_int, devlist: *const c_int);
    /// `ncclCommDestroy(comm)`: waits for the communicator's work, then frees it.
    fn ncclCommDestroy(comm: NcclComm);
    /// `ncclCommAbort(comm)`: stops the communicator's work at once and frees it.
    fn ncclCommAbort(comm: NcclComm);
    /// `ncclCommGetAsyncError(comm, &error)`: an error the communicator met in the background.
    fn ncclCommGetAsyncError(comm: NcclComm, error: *mut NcclResult);
    /// `ncclGroupStart()`.
    fn ncclGroupStart();
    /// `ncclGroupEnd()`.
    fn ncclGroupEnd();
    /// `ncclAllReduce(send, recv, count, type, op, comm, stream)`.
    fn ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclComm, stream: CUstream);
    /// `ncclAllGather(send, recv, send_count, type, comm, stream)`.
    fn ncclAllGather(send: *const c_void, recv: *mut c_void, send_count: usize, datatype: NcclDataType, comm: NcclComm, stream: CUstream);
    /// `ncclReduceScatter(send, recv, recv_count, type, op, comm, stream)`.
    fn ncclReduceScatter(send: *const c_void, recv: *mut c_void, recv_count: usize, datatype: NcclDataType, op: NcclRedOp, comm: NcclComm, stream: CUstream);
    /// `ncclBroadcast(send, recv, count, type, root, comm, stream)`.
    fn ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: NcclComm, stream: CUstream);
    /// `ncclReduce(send, recv, count, type, op, root, comm, stream)`.
    fn ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: NcclDataType, op: NcclRedOp, root: c_int, comm: NcclComm, stream: CUstream);
    /// `ncclSend(send, count, type, peer, comm, stream)`.
    fn ncclSend(send: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclComm, stream: CUstream);
    /// `ncclRecv(recv, count, type, peer, comm, stream)`.
    fn ncclRecv(recv: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: NcclComm, stream: CUstream);
}

impl NcclApi {
    /// Loads NCCL from `path` if given, else from [`NCCL_LIBRARY_ENV`] if set, else from
    /// [`NCCL_DEFAULT_LIBRARIES`] through the loader's search path; checks the version.
    pub fn load(path: Option<PathBuf>) -> Result<Self, NcclError> {
        let candidates: Vec<PathBuf> = match path {
            Some(path) => vec![path],
            None => match std::env::var_os(NCCL_LIBRARY_ENV) {
                Some(path) if !path.is_empty() => vec![PathBuf::from(path)],
                _ => NCCL_DEFAULT_LIBRARIES.iter().map(PathBuf::from).collect(),
            },
        };
        let mut tried = Vec::new();
        for path in candidates {
            // SAFETY: opening NCCL runs its initializers, which have no preconditions.
            match unsafe { Library::new(&path) } {
                Ok(library) => {
                    // NCCL is never unloaded: `ncclGetUniqueId` starts the bootstrap root's
                    // thread and communicators start proxy threads, and these outlive every
                    // handle (the root serves other processes' ranks after the id's maker has
                    // dropped its table). Unloading the code under them crashes the process
                    // and leaves the other ranks waiting. A second handle that is never closed
                    // keeps the library's reference count above zero.
                    // SAFETY: the library is already open, so its initializers do not run
                    // again; the handle is forgotten, never used.
                    if let Ok(resident) = unsafe { Library::new(&path) } {
                        std::mem::forget(resident);
                    }
                    return Self::resolve(library, path.display().to_string());
                }
                Err(e) => tried.push(LoadAttempt {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }),
            }
        }
        Err(NcclError::NotFound { tried })
    }

    /// The library's version (`ncclGetVersion`: 22805 for 2.28.5).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The library loaded.
    pub fn library_path(&self) -> &str {
        &self.path
    }

    /// `Ok(())` for `ncclSuccess`, else an [`NcclError::Call`] with NCCL's name for the result
    /// and, if `comm` is not null, the communicator's last error message.
    ///
    /// # Safety
    /// `comm` is null or a live communicator of this library.
    pub unsafe fn check(
        &self,
        call: &'static str,
        result: NcclResult,
        comm: NcclComm,
    ) -> Result<(), NcclError> {
        if result == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        Err(unsafe { self.error(call, result, comm) })
    }

    /// `Ok(())` for `ncclSuccess`, else an [`NcclError::Call`] with NCCL's name for the result
    /// and the calling thread's last error message; what [`nccl!`](crate::nccl) checks with.
    ///
    /// No communicator is passed for the message: NCCL keeps its last error per thread and
    /// ignores the communicator `ncclGetLastError` takes (documented as unused, may be null),
    /// and a call that failed because another thread aborted the communicator meanwhile must not
    /// hand NCCL the freed handle.
    #[inline]
    pub fn check_call(&self, call: &'static str, result: NcclResult) -> Result<(), NcclError> {
        // SAFETY: a null communicator is always valid for `check`.
        unsafe { self.check(call, result, std::ptr::null_mut()) }
    }

    /// Builds the [`NcclError::Call`] for a failed `call`.
    ///
    /// # Safety
    /// `comm` is null or a live communicator of this library.
    #[cold]
    pub unsafe fn error(
        &self,
        call: &'static str,
        result: NcclResult,
        comm: NcclComm,
    ) -> NcclError {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let mut message = unsafe { text((self.ncclGetErrorString)(result)) };
        if !comm.is_null() {
            // SAFETY: `comm` is a live communicator (the caller's contract); ncclGetLastError
            // returns a string that stays valid until the communicator's next error.
            let last = unsafe { text((self.ncclGetLastError)(comm)) };
            if !last.is_empty() {
                message.push_str(": ");
                message.push_str(&last);
            }
        }
        NcclError::Call {
            call,
            result,
            message,
        }
    }
}

/// A NUL-terminated string NCCL returned (empty for null).
///
/// # Safety
/// `text` is null or NUL-terminated and valid for the call.
unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

impl fmt::Debug for NcclApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclApi")
            .field("library", &self.path)
            .field("version", &format_nccl_version(self.version))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_print_as_nccl_does() {
        assert_eq!(format_nccl_version(22805), "2.28.5");
        assert_eq!(format_nccl_version(NCCL_MIN_VERSION), "2.18.0");
    }

    #[test]
    fn a_missing_library_is_a_typed_error_naming_the_variable() {
        let error = NcclApi::load(Some(PathBuf::from("/nonexistent/libnccl.so.2"))).unwrap_err();
        assert!(matches!(&error, NcclError::NotFound { tried } if tried.len() == 1));
        let text = error.to_string();
        assert!(
            text.contains("/nonexistent/libnccl.so.2") && text.contains(NCCL_LIBRARY_ENV),
            "{text}"
        );
    }

    #[test]
    fn element_sizes() {
        assert_eq!(NcclDataType::BF16.size(), 2);
        assert_eq!(NcclDataType::F64.size(), 8);
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
    }
}
