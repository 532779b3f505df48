//! cudarc streams joined to cuhal queue timelines, both ways, through events.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};
use cuhal::{Device, ExportedEvent, Queue, Semaphore, SemaphoreValues, Timeout};
use cuhal_sys::PrimaryContext;

use crate::error::{Error, Result};

/// Fails unless `theirs` is the context `ours` is (the device's primary context).
pub(crate) fn same_context(
    ours: &PrimaryContext,
    theirs: &Arc<CudaContext>,
    what: &'static str,
) -> Result<()> {
    if theirs.cu_ctx().addr() == ours.raw().addr() {
        Ok(())
    } else {
        Err(Error::OtherContext {
            what,
            ordinal: theirs.ordinal(),
            device: ours.ordinal(),
        })
    }
}

/// cudarc streams on cuhal queues.
pub trait QueueExt {
    /// Makes the queue wait, on the device, for everything enqueued on `stream` so far, then
    /// signals `signals` (once `waits` are reached): whatever waits on them, on any queue, runs
    /// after that cudarc work, with no host round trip.
    ///
    /// One driver call beyond the queue operation's own: `cuEventRecord` of an event of the
    /// device's on `stream` (see [`cuhal::Queue::wait_stream`]). A stream of another context
    /// than the device's primary context is [`Error::OtherContext`].
    fn wait_cudarc_stream(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        stream: &CudaStream,
    ) -> Result<()>;
}

impl QueueExt for Queue {
    fn wait_cudarc_stream(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        same_context(self.context(), stream.context(), "stream")?;
        // SAFETY: `stream` is borrowed, so its CUstream is live for the call, and it is of this
        // queue's context (checked above).
        unsafe { self.wait_stream(waits, signals, stream.cu_stream().cast()) }?;
        Ok(())
    }
}

/// cuhal timepoints for cudarc streams.
pub trait DeviceExt {
    /// Makes `stream` wait, on the device, until `semaphore` reaches `value`: cudarc work
    /// enqueued on it afterwards runs after the cuhal work that signals it.
    ///
    /// At most one driver call, `cuStreamWaitEvent` on the signalling submission's completion
    /// event (none when the value is already reached). If that submission is not issued yet
    /// (its own waits are pending), this waits on the host until it is, up to `timeout`, as
    /// [`Device::export_timepoint`] does; it never waits for the GPU.
    fn cudarc_stream_wait(
        &self,
        stream: &CudaStream,
        semaphore: &Semaphore,
        value: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<()>;
}

impl DeviceExt for Device {
    fn cudarc_stream_wait(
        &self,
        stream: &CudaStream,
        semaphore: &Semaphore,
        value: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<()> {
        // SAFETY: `stream` is borrowed, so its CUstream is live for the call; CUDA lets a
        // stream of any context wait on the event.
        unsafe { self.stream_wait_value(stream.cu_stream().cast(), semaphore, value, timeout) }?;
        Ok(())
    }
}

/// The exported timepoint's event as cudarc's driver bindings type it, for
/// `cudarc::driver::result::stream::wait_event` (or any raw cudarc call): the same `CUevent`
/// as [`ExportedEvent::raw`], valid while `exported` lives.
pub fn cudarc_event(exported: &ExportedEvent) -> sys::CUevent {
    exported.raw().cast()
}
