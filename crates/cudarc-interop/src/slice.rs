//! cudarc slices lent to cuhal queues, their stream ordering honoured both ways.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use cuhal::{Buffer, BufferRange, Device, Queue, Semaphore, SemaphoreValues, Timeout};

use crate::error::{Error, Result};
use crate::stream::{DeviceExt, QueueExt, same_context};

/// A cudarc slice's memory lent to cuhal: a [`Buffer`] over it for queue operations, command
/// buffers and binding tables, and the cudarc stream through which the two runtimes order
/// their uses of it.
///
/// Lending ([`SliceLoan::lend_mut`], [`SliceLoan::lend`]) makes the cudarc stream wait for
/// the slice's last cudarc uses (cudarc's own event tracking, as for any use of the slice on
/// that stream), then makes the `ready` signals wait for the stream, so that cuhal work waiting
/// on them runs after those uses. Giving it back ([`SliceLoan::give_back`]) makes the stream
/// wait for a semaphore value signalled after cuhal's last use, then lets cudarc record the
/// slice's use on the stream, so that cudarc's later uses of the slice, on any stream, run
/// after cuhal's.
///
/// Dropping a loan that was not given back still lets cudarc record the use, but then cudarc's
/// later uses are not ordered after cuhal's work.
pub struct SliceLoan<'a> {
    buffer: Arc<Buffer>,
    device: &'a Device,
    stream: &'a CudaStream,
    /// cudarc's record of the slice's use on `stream`; taken (and so made) once the stream
    /// waits for cuhal's work.
    record: Option<SyncOnDrop<'a>>,
}

impl<'a> SliceLoan<'a> {
    /// Lends `slice` to cuhal for reading and writing: `stream` first waits for the slice's
    /// last cudarc reads and writes, then `queue` signals `ready` once everything enqueued on
    /// `stream` so far is done, on the device.
    ///
    /// `stream` is the cudarc stream the crossing goes through: usually the slice's own
    /// (`slice.stream()`). With cudarc's event tracking off (or a context with one stream),
    /// cudarc orders nothing itself, and it must be the stream the slice's cudarc work goes on.
    ///
    /// Driver calls: cudarc's own waits for the slice's events (as for any use of the slice on
    /// `stream`), then one `cuEventRecord` on `stream`, then the queue's wait; no allocation
    /// of device memory and no pointer query.
    ///
    /// # Safety
    /// cuhal must be done with the memory before cudarc frees it. The buffer ([`Self::buffer`])
    /// and every handle to it (a command buffer recorded with it; a binding table only holds
    /// it until its submission completes) must be gone, and every cuhal use of it ordered
    /// before the slice's free: [`Self::give_back`] orders the uses signalled by its value, or
    /// the caller waits for them on the host, before the slice is dropped.
    pub unsafe fn lend_mut<T, S: DevicePtrMut<T>>(
        device: &'a Device,
        queue: &Queue,
        slice: &'a mut S,
        stream: &'a CudaStream,
        ready: &SemaphoreValues<'_>,
    ) -> Result<Self> {
        let bytes = check(device, queue, &*slice, stream)?;
        let (ptr, record) = slice.device_ptr_mut(stream);
        // SAFETY: forwarded caller contract.
        unsafe { Self::lent(device, queue, ptr, bytes, stream, record, ready) }
    }

    /// [`SliceLoan::lend_mut`] for a slice cuhal only reads: `stream` waits for the slice's
    /// last cudarc writes (not its reads), and giving it back orders cudarc's later writes
    /// (not its reads) after cuhal's reads. cuhal must not write the buffer.
    ///
    /// # Safety
    /// As for [`SliceLoan::lend_mut`]; and no cuhal work may write the memory.
    pub unsafe fn lend<T, S: DevicePtr<T>>(
        device: &'a Device,
        queue: &Queue,
        slice: &'a S,
        stream: &'a CudaStream,
        ready: &SemaphoreValues<'_>,
    ) -> Result<Self> {
        let bytes = check(device, queue, slice, stream)?;
        let (ptr, record) = slice.device_ptr(stream);
        // SAFETY: forwarded caller contract.
        unsafe { Self::lent(device, queue, ptr, bytes, stream, record, ready) }
    }

    /// The loan once cudarc handed the pointer over: the queue's wait for the stream, and the
    /// buffer.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is device memory of the device's context, kept allocated as
    /// [`SliceLoan::lend_mut`] requires.
    unsafe fn lent(
        device: &'a Device,
        queue: &Queue,
        ptr: cudarc::driver::sys::CUdeviceptr,
        bytes: usize,
        stream: &'a CudaStream,
        record: SyncOnDrop<'a>,
        ready: &SemaphoreValues<'_>,
    ) -> Result<Self> {
        // On error `record` drops here: cudarc records the use, and cuhal has queued nothing.
        queue.wait_cudarc_stream(&[], ready, stream)?;
        let keeper: Arc<dyn Any + Send + Sync> = Arc::new(());
        // SAFETY: a cudarc slice of the device's primary context (checked) is device memory of
        // that context; the caller keeps it allocated while cuhal uses it.
        let buffer = unsafe { Buffer::from_raw(device.context(), ptr, bytes, keeper) };
        Ok(Self {
            buffer,
            device,
            stream,
            record: Some(record),
        })
    }

    /// The slice's memory as a cuhal buffer (never freed by cuhal).
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    /// The whole slice as a range: for queue operations, command-buffer recording, or an entry
    /// of a binding table ([`cuhal::Queue::execute_with_bindings`]).
    pub fn range(&self) -> BufferRange {
        self.buffer.whole()
    }

    /// The cudarc stream the loan crosses through.
    pub fn stream(&self) -> &CudaStream {
        self.stream
    }

    /// Ends the loan: the stream waits, on the device, for `semaphore` to reach `value` (signal
    /// it after cuhal's last use of the slice), then cudarc records the slice's use on the
    /// stream, so that cudarc's later uses of the slice wait for cuhal's.
    ///
    /// At most one driver call of cuhal's (`cuStreamWaitEvent`), then cudarc's event record.
    /// If the signal is not issued yet this waits on the host until it is, up to `timeout`; on
    /// error (a timeout, a failed semaphore) the loan stays out, so that it can be given back
    /// again, and nothing was enqueued.
    pub fn give_back(
        &mut self,
        semaphore: &Semaphore,
        value: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<()> {
        self.device
            .cudarc_stream_wait(self.stream, semaphore, value, timeout)?;
        drop(self.record.take());
        Ok(())
    }
}

impl std::fmt::Debug for SliceLoan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceLoan")
            .field("ptr", &format_args!("{:#x}", self.buffer.device_ptr()))
            .field("len", &self.buffer.len())
            .field("given_back", &self.record.is_none())
            .finish()
    }
}

/// Checks that the queue is the device's and the slice and stream of its primary context;
/// the slice's length in bytes.
fn check<T, S: DeviceSlice<T>>(
    device: &Device,
    queue: &Queue,
    slice: &S,
    stream: &CudaStream,
) -> Result<usize> {
    if queue.context().raw() != device.context().raw() {
        return Err(Error::Cuhal(cuhal::Error::WrongDevice { what: "queue" }));
    }
    same_context(device.context(), slice.stream().context(), "slice")?;
    same_context(device.context(), stream.context(), "stream")?;
    match slice.num_bytes() {
        0 => Err(Error::Empty),
        bytes => Ok(bytes),
    }
}
