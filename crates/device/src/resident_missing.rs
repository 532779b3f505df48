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
    /// Instantiating graph command buffers for device launch
    /// (`cuGraphInstantiateWithParams` with `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`) is not
    /// built.
    DeviceLaunchInstantiation,
    /// The scheduler kernel that reads the ring on the device is not built, nor validated on a
    /// GPU.
    SchedulerKernel,
}

impl fmt::Display for ResidentMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResidentMissing::DriverVersion { found, needed } => write!(
                f,
                "driver version {found} (device graph launch needs {needed} or later)"
            ),
            ResidentMissing::DeviceLaunchInstantiation => {
                f.write_str("device-launch instantiation of graph command buffers (not built yet)")
            }
            ResidentMissing::SchedulerKernel => {
                f.write_str("the device-side scheduler kernel (not built yet)")
            }
        }
    }
}
