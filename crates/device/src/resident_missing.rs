//! [`ResidentMissing`]: what a device, driver or build lacks for a resident queue, named in
//! [`Error::ResidentUnavailable`](crate::Error::ResidentUnavailable).

use std::fmt;

/// The first driver version with device graph launch (CUDA 12.0).
pub const RESIDENT_MIN_DRIVER: i32 = 12000;

/// One thing a resident queue needs that this device, driver or build does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResidentMissing {
    /// The driver predates device graph launch.
    DriverVersion {
        /// `cuDriverGetVersion`'s answer (0 if it could not say).
        found: i32,
        /// [`RESIDENT_MIN_DRIVER`].
        needed: i32,
    },
    /// cuhal has no scheduler kernel for this architecture (its cubins cover sm_80 and later).
    SchedulerKernel {
        /// The device's architecture, `sm_XY`.
        architecture: String,
    },
    /// The driver lacks a function the resident queue calls.
    DriverFunction(&'static str),
    /// The scheduler kernel could not be loaded or its graph not instantiated for device launch
    /// (the driver's error).
    SchedulerLoad(String),
}

impl fmt::Display for ResidentMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResidentMissing::DriverVersion { found, needed } => write!(
                f,
                "driver version {found} (device graph launch needs {needed} or later)"
            ),
            ResidentMissing::SchedulerKernel { architecture } => write!(
                f,
                "a scheduler kernel for {architecture} (cuhal's cubins cover sm_80 and later)"
            ),
            ResidentMissing::DriverFunction(name) => write!(f, "the driver function {name}"),
            ResidentMissing::SchedulerLoad(error) => {
                write!(
                    f,
                    "a scheduler kernel the driver loads for device launch ({error})"
                )
            }
        }
    }
}
