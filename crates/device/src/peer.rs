//! Several devices in one process: opening a set of GPUs and enabling peer access between them.
//!
//! Each GPU is one [`Device`] on its primary context. Nothing else is shared: semaphores are
//! host objects, so a queue of one device waits for a semaphore another device's queue signals
//! exactly as it waits for one of its own queues (`cuStreamWaitEvent` accepts an event of any
//! context), on the device, with no host round trip.
//!
//! Peer access is enabled in both directions between every pair the driver allows
//! (`cuDeviceCanAccessPeer`), so copies between the devices' buffers go over the link. It stays
//! enabled for the life of the primary contexts: they are shared with any other user of the
//! runtime API in the process, which expects the same.

use cuhal_sys::cu;
use cuhal_sys::{CUresult, PeerLink};

use crate::device::{Device, DeviceOptions, Driver};
use crate::error::{Error, Result};

impl Driver {
    /// Opens every device of `ordinals` (distinct; any subset of the driver's devices, in any
    /// order) with the same options, then enables peer access between every pair that allows
    /// it. Entry `i` of the result is the device of `ordinals[i]`.
    pub fn open_many(&self, ordinals: &[i32], options: DeviceOptions) -> Result<Vec<Device>> {
        for (i, ordinal) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(ordinal) {
                return Err(Error::InvalidArgument(format!(
                    "device {ordinal} is listed twice"
                )));
            }
        }
        let devices = ordinals
            .iter()
            .map(|&ordinal| self.open(ordinal, options.clone()))
            .collect::<Result<Vec<_>>>()?;
        for a in &devices {
            for b in &devices {
                if a.info().ordinal != b.info().ordinal {
                    a.enable_peer_access(b)?;
                }
            }
        }
        Ok(devices)
    }

    /// Opens every device the driver sees (see [`Driver::open_many`]).
    pub fn open_all(&self, options: DeviceOptions) -> Result<Vec<Device>> {
        let count = cuhal_sys::device_count(self.api())?;
        let ordinals: Vec<i32> = (0..count).collect();
        self.open_many(&ordinals, options)
    }

    /// The link between every ordered pair of distinct devices (peer access, native atomics,
    /// performance rank, and the link kind they imply).
    pub fn topology(&self) -> Result<Vec<PeerLink>> {
        Ok(cuhal_sys::topology(self.api())?)
    }
}

impl Device {
    /// Lets this device's kernels and copies reach `peer`'s memory directly
    /// (`cuCtxEnablePeerAccess` from this device's context). Returns whether peer access is on:
    /// `false` where the driver does not allow it (copies then go through host memory). Enabling
    /// it again is not an error.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<bool> {
        let (me, other) = (self.info().ordinal, peer.info().ordinal);
        if me == other {
            return Err(Error::InvalidArgument(
                "a device cannot be its own peer".into(),
            ));
        }
        let context = self.context();
        let api = context.api();
        let mut allowed = 0;
        // SAFETY: `allowed` is a valid out-pointer; both handles are this driver's devices.
        unsafe {
            cu!(
                api,
                cuDeviceCanAccessPeer(&mut allowed, context.device(), peer.context().device())
            )
        }?;
        if allowed == 0 {
            return Ok(false);
        }
        let _bound = context.enter()?;
        // SAFETY: this device's context is current; the peer's context is a live primary
        // context (retained by `peer`); the flags must be 0.
        match unsafe { cu!(api, cuCtxEnablePeerAccess(peer.context().raw(), 0)) } {
            Err(e) if e.result() != Some(CUresult::ERROR_PEER_ACCESS_ALREADY_ENABLED) => {
                return Err(e.into());
            }
            _ => {}
        }
        // Buffers come from the peer's memory pool, which the context's peer access does not
        // open: the pool itself must let this device in.
        peer.shared.memory.grant_access(context.device())?;
        self.note_peer(other);
        Ok(true)
    }
}
