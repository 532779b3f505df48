//! The one error type of the device crate, wrapping each layer's own.

use std::fmt;

use cuhal_semaphore::Failure;

use crate::lost::DeviceLost;

/// Errors from the device, its queues and everything they compose.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// Loading the driver or a driver call failed.
    Driver(cuhal_sys::Error),
    /// Recording or issuing commands, allocating buffers or loading executables failed.
    Command(cuhal_command::Error),
    /// A semaphore operation or wait failed (including a failure that reached it).
    Semaphore(cuhal_semaphore::Error),
    /// A queue refused a submission (it is lost, or could not start).
    Queue(cuhal_scheduler::Error),
    /// Tracing could not be set up.
    Trace(std::sync::Arc<cuhal_trace::Error>),
    /// The device is lost: a sticky error poisoned its context. Every later call returns this.
    Lost(Failure),
    /// No device with this ordinal.
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices there are.
        count: i32,
    },
    /// An argument is outside what the operation accepts.
    InvalidArgument(String),
    /// Resident queues are not available on this device and driver: what is missing.
    ResidentUnavailable {
        /// Everything missing, each named.
        missing: Vec<crate::resident_missing::ResidentMissing>,
    },
    /// A resident queue refused a submission or a command buffer (with its typed
    /// [`Refusal`](cuhal_resident::Refusal)), or was lost, shut down or full.
    Resident(cuhal_resident::Error),
    /// NCCL could not be loaded, or one of its calls failed (with NCCL's message).
    Nccl(cuhal_sys::NcclError),
    /// Not every rank of a communicator joined within the caller's timeout; this process's
    /// ranks were aborted (`ncclCommAbort`).
    JoinTimeout {
        /// The communicator's timeout.
        timeout: std::time::Duration,
    },
    /// A collective did not finish within its communicator's timeout (a peer that never
    /// arrived): the communicator was aborted (`ncclCommAbort`) and fails everything after.
    CollectiveTimeout {
        /// The communicator's timeout.
        timeout: std::time::Duration,
        /// Whether it was waiting to be issued (inside NCCL) or to complete on the devices.
        stage: &'static str,
    },
    /// The local ranks' parts of one collective disagree (on what they do, the element count,
    /// data type, reduction, root or a send's pairing): nothing was issued, no semaphore was
    /// signalled or failed, and the communicator goes on working. Each value is that rank's
    /// value of the first field that differs (see [`crate::PartField`]).
    CollectiveMismatch {
        /// The rank (of the communicator) whose part the other's is compared with.
        rank: i32,
        /// Its value.
        value: crate::PartField,
        /// The rank whose part differs.
        other_rank: i32,
        /// Its value (of the same field).
        other_value: crate::PartField,
    },
    /// A buffer, command buffer or host buffer given to a queue belongs to another device.
    WrongDevice {
        /// What it was (e.g. "fill target", "command buffer").
        what: &'static str,
    },
    /// The device had no memory for an allocation (`CUDA_ERROR_OUT_OF_MEMORY`), after what the
    /// pool held back was returned to it.
    OutOfDeviceMemory {
        /// What needed the memory (`"buffer"`, `"alloca"`).
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The driver's error.
        cuda: cuhal_sys::Error,
    },
    /// A buffer was used after [`crate::Queue::dealloca`] released it.
    Deallocated {
        /// What it was used as (e.g. "fill target").
        what: &'static str,
    },
    /// The driver said an event completed (its blocking wait returned) but a query of it then
    /// reported it incomplete.
    EventNotComplete {
        /// The wait that returned.
        after: &'static str,
    },
    /// A foreign pointer is not device memory: the driver does not know it (`memory_type`
    /// `None`: plain host memory, or nothing at all), or reports another memory type (pinned
    /// host memory is `CU_MEMORYTYPE_HOST`, 1).
    NotDeviceMemory {
        /// The address given.
        ptr: u64,
        /// The `CUmemorytype` the driver reported, if it knew the address.
        memory_type: Option<u32>,
    },
    /// A foreign pointer is device memory of another device.
    OtherDevice {
        /// The address given.
        ptr: u64,
        /// The device the memory lives on.
        owner: i32,
        /// The device it was offered to.
        device: i32,
    },
    /// A foreign pointer belongs to another context of this device, not its primary context.
    OtherContext {
        /// The address given.
        ptr: u64,
    },
    /// A foreign range runs past the end of the allocation that holds its first byte.
    PastAllocation {
        /// The address given.
        ptr: u64,
        /// The length given.
        len: usize,
        /// Where the allocation starts.
        allocation_start: u64,
        /// Its size in bytes.
        allocation_size: usize,
    },
}

impl Error {
    /// The failure carried by a lost device or queue, or by a failed semaphore.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Lost(f) => Some(f),
            Error::Queue(e) => e.failure(),
            Error::Semaphore(cuhal_semaphore::Error::Failed(f)) => Some(f),
            _ => None,
        }
    }

    /// The driver error at the root of this error, if any (looking through failures, tracing
    /// errors and device losses).
    pub fn cuda(&self) -> Option<&cuhal_sys::Error> {
        match self {
            Error::Driver(e) | Error::OutOfDeviceMemory { cuda: e, .. } => Some(e),
            Error::Command(e) => e.cuda(),
            Error::Trace(e) => match &**e {
                cuhal_trace::Error::Driver(e) => Some(e),
                _ => None,
            },
            _ => self.failure().and_then(cuda_of_failure),
        }
    }

    /// Why CUPTI could not be used, when this error is a device or queue refusing to start
    /// because its tracing asked for CUPTI explicitly ([`crate::CuptiChoice::Required`], or a
    /// required library or API) and could not have it: for instance
    /// [`CuptiError::SubscriberTaken`](cuhal_trace::cupti::CuptiError::SubscriberTaken) while
    /// another profiler or compute-sanitizer holds CUPTI's one subscriber.
    pub fn cupti(&self) -> Option<&cuhal_trace::cupti::CuptiError> {
        match self {
            Error::Trace(e) => match &**e {
                cuhal_trace::Error::Cupti(e) => Some(e),
                _ => None,
            },
            _ => None,
        }
    }

    /// The device loss this error reports, if it is one (directly, or as the failure of a queue
    /// or semaphore that the loss reached).
    pub fn device_lost(&self) -> Option<&DeviceLost> {
        self.lost_failure()
            .and_then(|failure| failure.downcast_ref::<DeviceLost>())
    }

    /// The failure of a device loss carried by this error.
    pub(crate) fn lost_failure(&self) -> Option<&Failure> {
        match self {
            Error::Lost(failure) => Some(failure),
            _ => self
                .failure()
                .filter(|f| f.downcast_ref::<DeviceLost>().is_some()),
        }
    }
}

/// The driver error inside a failure created by this crate, if it holds one.
pub fn cuda_of_failure(failure: &Failure) -> Option<&cuhal_sys::Error> {
    if let Some(lost) = failure.downcast_ref::<DeviceLost>() {
        return Some(lost.cuda());
    }
    if let Some(e) = failure.downcast_ref::<cuhal_sys::Error>() {
        return Some(e);
    }
    if let Some(e) = failure.downcast_ref::<Error>() {
        return e.cuda();
    }
    failure
        .downcast_ref::<cuhal_command::Error>()
        .and_then(cuhal_command::Error::cuda)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver(e) => write!(f, "{e}"),
            Error::Command(e) => write!(f, "{e}"),
            Error::Semaphore(e) => write!(f, "{e}"),
            Error::Queue(e) => write!(f, "{e}"),
            // The trace crate's errors already say they are about tracing.
            Error::Trace(e) => write!(f, "{e}"),
            Error::Lost(failure) => write!(f, "the device is lost: {failure}"),
            Error::NoSuchDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal}: the driver sees {count}")
            }
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::ResidentUnavailable { missing } => {
                f.write_str("resident queues are not available on this device/driver; missing:")?;
                for (i, what) in missing.iter().enumerate() {
                    write!(f, "{} {what}", if i == 0 { "" } else { ";" })?;
                }
                Ok(())
            }
            Error::Resident(e) => write!(f, "resident queue: {e}"),
            Error::Nccl(e) => write!(f, "{e}"),
            Error::JoinTimeout { timeout } => write!(
                f,
                "not every rank joined the NCCL communicator within {timeout:?} (a peer never \
                 arrived?); this process's ranks were aborted"
            ),
            Error::CollectiveTimeout { timeout, stage } => write!(
                f,
                "a collective was still {stage} after the communicator's timeout of {timeout:?} \
                 (a peer never arrived?); the communicator was aborted"
            ),
            Error::CollectiveMismatch {
                rank,
                value,
                other_rank,
                other_value,
            } => write!(
                f,
                "the parts of a collective disagree on the {}: rank {rank} has {value}, rank \
                 {other_rank} has {other_value}; nothing was issued",
                value.name()
            ),
            Error::OutOfDeviceMemory { what, bytes, cuda } => {
                write!(
                    f,
                    "the device has no memory for the {what} ({bytes} bytes): {cuda}"
                )
            }
            Error::WrongDevice { what } => write!(
                f,
                "the {what} belongs to another device than the queue it was given to"
            ),
            Error::Deallocated { what } => write!(
                f,
                "the {what} was released by queue dealloca: it may not be used by new work"
            ),
            Error::EventNotComplete { after } => write!(
                f,
                "a completion event was still incomplete after {after} returned"
            ),
            Error::NotDeviceMemory {
                ptr,
                memory_type: None,
            } => write!(
                f,
                "{ptr:#x} is not CUDA device memory: the driver does not know the address \
                 (host memory?)"
            ),
            Error::NotDeviceMemory {
                ptr,
                memory_type: Some(t),
            } => write!(
                f,
                "{ptr:#x} is not device memory: the driver reports memory type {t}{}",
                if *t == cuhal_sys::CU_MEMORYTYPE_HOST {
                    " (host)"
                } else {
                    ""
                }
            ),
            Error::OtherDevice { ptr, owner, device } => write!(
                f,
                "{ptr:#x} is memory of device {owner}, not of device {device}"
            ),
            Error::OtherContext { ptr } => write!(
                f,
                "{ptr:#x} belongs to another context than the device's primary context"
            ),
            Error::PastAllocation {
                ptr,
                len,
                allocation_start,
                allocation_size,
            } => write!(
                f,
                "{len} bytes at {ptr:#x} run past the allocation that holds them \
                 ({allocation_size} bytes at {allocation_start:#x})"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver(e) | Error::OutOfDeviceMemory { cuda: e, .. } => Some(e),
            Error::Command(e) => Some(e),
            Error::Semaphore(e) => Some(e),
            Error::Queue(e) => Some(e),
            Error::Trace(e) => Some(&**e),
            Error::Lost(f) => Some(f),
            Error::Nccl(e) => Some(e),
            Error::Resident(e) => Some(e),
            _ => None,
        }
    }
}

impl Error {
    /// `error` as [`Error::OutOfDeviceMemory`] for `bytes` of `what` when the driver ran out of
    /// memory, else as it is.
    pub(crate) fn allocating(what: &'static str, bytes: usize) -> impl Fn(Error) -> Error {
        move |error| match error {
            Error::Driver(cuda)
                if cuda.result() == Some(cuhal_sys::CUresult::ERROR_OUT_OF_MEMORY) =>
            {
                Error::OutOfDeviceMemory { what, bytes, cuda }
            }
            other => other,
        }
    }
}

impl From<cuhal_sys::Error> for Error {
    fn from(e: cuhal_sys::Error) -> Self {
        Error::Driver(e)
    }
}
impl From<cuhal_sys::NcclError> for Error {
    fn from(e: cuhal_sys::NcclError) -> Self {
        Error::Nccl(e)
    }
}
impl From<cuhal_command::Error> for Error {
    fn from(e: cuhal_command::Error) -> Self {
        Error::Command(e)
    }
}
impl From<cuhal_semaphore::Error> for Error {
    fn from(e: cuhal_semaphore::Error) -> Self {
        Error::Semaphore(e)
    }
}
impl From<cuhal_scheduler::Error> for Error {
    fn from(e: cuhal_scheduler::Error) -> Self {
        Error::Queue(e)
    }
}
impl From<cuhal_trace::Error> for Error {
    fn from(e: cuhal_trace::Error) -> Self {
        Error::Trace(std::sync::Arc::new(e))
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
