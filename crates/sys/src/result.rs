//! `CUresult`: the driver's status code, as a newtype with named constants.

use std::fmt;

/// A CUDA driver status code (`CUresult` in `cuda.h`).
///
/// A newtype rather than a Rust enum because the driver may return codes newer than this table;
/// an enum would make such a value undefined behaviour.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CUresult(pub i32);

macro_rules! results {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {
        impl CUresult {
            $($(#[$doc])* pub const $name: CUresult = CUresult($value);)*

            /// The constant's name as spelled in `cuda.h` (`CUDA_ERROR_...`), when this table knows it.
            ///
            /// Works without a driver; [`crate::DriverApi::error_name`] asks the driver itself.
            pub const fn known_name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(concat!("CUDA_", stringify!($name))),)*
                    _ => None,
                }
            }
        }
    };
}

results! {
    /// The call succeeded.
    SUCCESS = 0;
    /// A parameter was invalid.
    ERROR_INVALID_VALUE = 1;
    /// The device ran out of memory.
    ERROR_OUT_OF_MEMORY = 2;
    /// `cuInit` has not been called.
    ERROR_NOT_INITIALIZED = 3;
    /// The driver is shutting down.
    ERROR_DEINITIALIZED = 4;
    /// The driver found no CUDA device.
    ERROR_NO_DEVICE = 100;
    /// The device ordinal or handle is invalid.
    ERROR_INVALID_DEVICE = 101;
    /// The module image is invalid.
    ERROR_INVALID_IMAGE = 200;
    /// No current context, or the context is invalid.
    ERROR_INVALID_CONTEXT = 201;
    /// No binary in the module fits this GPU.
    ERROR_NO_BINARY_FOR_GPU = 209;
    /// An uncorrectable ECC error was detected.
    ERROR_ECC_UNCORRECTABLE = 214;
    /// PTX failed to compile.
    ERROR_INVALID_PTX = 218;
    /// The PTX JIT compiler is not available.
    ERROR_JIT_COMPILER_NOT_FOUND = 221;
    /// The PTX ISA version is newer than the driver supports.
    ERROR_UNSUPPORTED_PTX_VERSION = 222;
    /// A handle was invalid.
    ERROR_INVALID_HANDLE = 400;
    /// The operation is not valid in the object's current state.
    ERROR_ILLEGAL_STATE = 401;
    /// A named symbol (kernel, global) was not found.
    ERROR_NOT_FOUND = 500;
    /// Asynchronous work has not completed yet (not an error for queries).
    ERROR_NOT_READY = 600;
    /// A kernel accessed an illegal address; the context is lost.
    ERROR_ILLEGAL_ADDRESS = 700;
    /// The launch asked for more resources (registers, threads, shared memory) than available.
    ERROR_LAUNCH_OUT_OF_RESOURCES = 701;
    /// A kernel ran too long; the context is lost.
    ERROR_LAUNCH_TIMEOUT = 702;
    /// Peer access is already enabled.
    ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;
    /// Peer access has not been enabled.
    ERROR_PEER_ACCESS_NOT_ENABLED = 705;
    /// The context has been destroyed.
    ERROR_CONTEXT_IS_DESTROYED = 709;
    /// A device-side assert fired; the context is lost.
    ERROR_ASSERT = 710;
    /// The device's call stack overflowed; the context is lost.
    ERROR_HARDWARE_STACK_ERROR = 714;
    /// A kernel executed an illegal instruction; the context is lost.
    ERROR_ILLEGAL_INSTRUCTION = 715;
    /// A kernel made a misaligned access; the context is lost.
    ERROR_MISALIGNED_ADDRESS = 716;
    /// A kernel used an invalid address space; the context is lost.
    ERROR_INVALID_ADDRESS_SPACE = 717;
    /// A kernel's program counter became invalid; the context is lost.
    ERROR_INVALID_PC = 718;
    /// A kernel failed (for example it executed `trap`); the context is lost.
    ERROR_LAUNCH_FAILED = 719;
    /// The operation is not permitted.
    ERROR_NOT_PERMITTED = 800;
    /// The operation is not supported on this system or device.
    ERROR_NOT_SUPPORTED = 801;
    /// The operation is not permitted while a stream is capturing.
    ERROR_STREAM_CAPTURE_UNSUPPORTED = 900;
    /// The stream's capture was invalidated by an earlier error (or a forbidden call).
    ERROR_STREAM_CAPTURE_INVALIDATED = 901;
    /// Two independent captures were merged.
    ERROR_STREAM_CAPTURE_MERGE = 902;
    /// The capture was not begun in this stream.
    ERROR_STREAM_CAPTURE_UNMATCHED = 903;
    /// A stream forked from the capture was not joined back before it ended.
    ERROR_STREAM_CAPTURE_UNJOINED = 904;
    /// The capture would depend on work outside it (a wait on an event recorded elsewhere).
    ERROR_STREAM_CAPTURE_ISOLATION = 905;
    /// The capture would implicitly depend on the legacy default stream.
    ERROR_STREAM_CAPTURE_IMPLICIT = 906;
    /// The event was last recorded in a capture and cannot be used that way.
    ERROR_CAPTURED_EVENT = 907;
    /// A thread-local capture was touched from another thread.
    ERROR_STREAM_CAPTURE_WRONG_THREAD = 908;
    /// The driver does not know what went wrong.
    ERROR_UNKNOWN = 999;
}

impl CUresult {
    /// Whether the call succeeded.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Whether this error is "sticky": it loses the context, and every later call in that
    /// context fails with it. A device reports itself lost on one of these.
    pub const fn is_sticky(self) -> bool {
        matches!(
            self.0,
            214 | 700 | 702 | 709 | 710 | 714 | 715 | 716 | 717 | 718 | 719
        )
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.known_name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_table() {
        assert_eq!(CUresult::SUCCESS.known_name(), Some("CUDA_SUCCESS"));
        assert_eq!(
            CUresult::ERROR_LAUNCH_FAILED.known_name(),
            Some("CUDA_ERROR_LAUNCH_FAILED")
        );
        assert_eq!(CUresult(123_456).known_name(), None);
        assert_eq!(
            format!("{}", CUresult::ERROR_INVALID_PTX),
            "CUDA_ERROR_INVALID_PTX (218)"
        );
        assert_eq!(format!("{:?}", CUresult(4242)), "CUresult(4242)");
    }

    #[test]
    fn sticky_errors_are_the_context_losing_ones() {
        assert!(CUresult::ERROR_ILLEGAL_ADDRESS.is_sticky());
        assert!(CUresult::ERROR_LAUNCH_FAILED.is_sticky());
        assert!(!CUresult::ERROR_INVALID_VALUE.is_sticky());
        assert!(!CUresult::ERROR_NOT_READY.is_sticky());
        assert!(!CUresult::SUCCESS.is_sticky());
    }
}
