//! Resident queues on a device (a queue the GPU drives: see the `cuhal-resident` crate): opt-in
//! through [`Device::open_resident_queue`], and refused there with
//! [`Error::ResidentUnavailable`] naming what is missing. The device-side scheduler kernel and
//! device-launch instantiation of graph command buffers are not built yet, so today every
//! device refuses; the host half (ring, semaphore slots, refusals, failure, shutdown) is built
//! and tested on the crate's CPU model. Opening one changes nothing on the device's other
//! queues.

use std::convert::Infallible;

use cuhal_resident::ResidentOptions;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::resident_missing::{RESIDENT_MIN_DRIVER, ResidentMissing};

/// A resident queue on a device. It cannot be made yet: [`Device::open_resident_queue`] always
/// returns [`Error::ResidentUnavailable`] until the device-side scheduler is built.
pub struct ResidentQueue {
    unbuilt: Infallible,
}

impl ResidentQueue {
    /// The queue's label.
    pub fn label(&self) -> &str {
        match self.unbuilt {}
    }
}

impl Device {
    /// Opens a resident queue (opt-in; the device's other queues are unaffected). Today this
    /// is always [`Error::ResidentUnavailable`], listing what is missing on this device and
    /// driver: at least the device-side scheduler kernel, which is not built yet.
    pub fn open_resident_queue(&self, options: &ResidentOptions) -> Result<ResidentQueue> {
        let _ = options;
        let found = self.context().api().driver_version();
        let mut missing = Vec::new();
        if found < RESIDENT_MIN_DRIVER {
            missing.push(ResidentMissing::DriverVersion {
                found,
                needed: RESIDENT_MIN_DRIVER,
            });
        }
        missing.push(ResidentMissing::DeviceLaunchInstantiation);
        missing.push(ResidentMissing::SchedulerKernel);
        Err(Error::ResidentUnavailable { missing })
    }
}
