//! Kernel arguments, stored inline with the alignment the kernel ABI gives them.
//!
//! `cuLaunchKernel` and kernel graph nodes take a `void**`: one pointer per argument, to a
//! value of the argument's size. [`KernelArgs`] keeps the values back to back in one buffer,
//! each at the next offset that its alignment allows, which is also exactly the layout of the
//! kernel's parameter buffer (a C struct of the parameters), and builds the pointer array on
//! demand. Values are copied in, so the caller's variables need not outlive the builder.

use std::ffi::c_void;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::arena::{AlignedBytes, MAX_ALIGN};
use crate::error::out_of_host_memory;
use crate::{Buffer, BufferRange, DevicePtr, Error};

mod sealed {
    pub trait Sealed {}
}

/// A plain value that can be a kernel argument: integers, floats and arrays of them.
///
/// Sealed: every implementor is `Copy`, has no padding bytes and no pointers to host memory.
/// Other layouts go through [`KernelArgs::push_bytes`].
pub trait KernelArg: sealed::Sealed + Copy + 'static {}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelArg for $t {}
    )*};
}
kernel_arg!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);
impl<T: KernelArg, const N: usize> sealed::Sealed for [T; N] {}
impl<T: KernelArg, const N: usize> KernelArg for [T; N] {}

// A `DevicePtr` is one `u64` (`repr(transparent)` over it, the marker is zero-sized): no
// padding, no host pointer.
impl<T: 'static> sealed::Sealed for DevicePtr<T> {}
impl<T: 'static> KernelArg for DevicePtr<T> {}

/// A kernel argument that is the address of a slot's binding plus an offset.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ArgBinding {
    /// Index of the argument in its [`KernelArgs`](crate::KernelArgs).
    pub arg: u32,
    /// The slot.
    pub slot: u32,
    /// Bytes from the start of the binding.
    pub offset: u64,
    /// Bytes from `offset` the kernel may reach (0 when only the address is known): the
    /// binding must be at least `offset + length` long.
    pub length: u64,
}

/// Bytes of one zone-stamp slot (`CUHAL_ZONE_STAMP_BYTES`): the complement of the earliest
/// start, then the latest end, both `u64` `%globaltimer` nanoseconds.
pub const ZONE_STAMP_BYTES: u64 = 16;

/// Where one argument lives inside [`KernelArgs::bytes`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ArgSlot {
    /// Byte offset in the packed buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// A builder of kernel arguments.
///
/// ```
/// # use cuhal_command::KernelArgs;
/// let mut args = KernelArgs::new();
/// args.push(7u8).push(0x1234_5678_9abc_def0u64).push(2.5f32);
/// assert_eq!(args.len(), 3);
/// // u8 at 0, u64 aligned to 8, f32 right after it: the C layout of the parameters.
/// assert_eq!(args.slots()[1].offset, 8);
/// assert_eq!(args.slots()[2].offset, 16);
/// ```
#[derive(Clone, Default)]
pub struct KernelArgs {
    bytes: AlignedBytes,
    slots: SmallVec<[ArgSlot; 16]>,
    buffers: SmallVec<[Arc<Buffer>; 4]>,
    /// Arguments that are a binding slot's address plus an offset.
    bindings: SmallVec<[ArgBinding; 4]>,
    /// The arguments pushed by [`KernelArgs::push_zone_stamp`] (more than one is refused when
    /// the dispatch is recorded).
    zone_stamps: SmallVec<[u32; 1]>,
}

impl KernelArgs {
    /// An empty argument list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a value at its natural alignment.
    pub fn push<T: KernelArg>(&mut self, value: T) -> &mut Self {
        // SAFETY: KernelArg types are Copy with no padding (sealed), so all size_of::<T>()
        // bytes of `value` are initialized.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const value).cast::<u8>(), size_of::<T>()) };
        self.push_slot(bytes, align_of::<T>().min(MAX_ALIGN));
        self
    }

    /// Appends a value, builder style.
    pub fn with<T: KernelArg>(mut self, value: T) -> Self {
        self.push(value);
        self
    }

    /// Appends a null pointer (a `T*` parameter the kernel takes as absent).
    pub fn push_null<T: 'static>(&mut self) -> &mut Self {
        self.push(DevicePtr::<T>::null())
    }

    /// Appends the device address of `range`'s first byte (a `T*` parameter) and keeps the
    /// range's buffer alive for as long as any command buffer that records these arguments.
    /// A slot range ([`BufferRange::slot`]) appends the address its slot's binding has at each
    /// submission, plus the range's offset, and makes the range's end part of the slot's
    /// extent.
    pub fn push_range(&mut self, range: &BufferRange) -> &mut Self {
        if let Some(slot) = range.binding_slot() {
            return self.push_bound(slot, range.offset() as u64, range.len() as u64);
        }
        if let Some(buffer) = range.buffer()
            && !self.buffers.iter().any(|b| Arc::ptr_eq(b, buffer))
        {
            self.buffers.push(Arc::clone(buffer));
        }
        self.push(range.device_ptr())
    }

    /// Appends the address of binding slot `slot` plus `offset` bytes (a `T*` parameter), filled
    /// in at each submission from its binding table. Only a command buffer with a binding
    /// capacity above `slot` records it; the slot's binding must be at least `offset` long
    /// (use [`KernelArgs::push_range`] with a slot range to require a length as well).
    pub fn push_binding(&mut self, slot: u32, offset: u64) -> &mut Self {
        self.push_bound(slot, offset, 0)
    }

    /// Appends a slot's address, builder style.
    pub fn with_binding(mut self, slot: u32, offset: u64) -> Self {
        self.push_binding(slot, offset);
        self
    }

    fn push_bound(&mut self, slot: u32, offset: u64, length: u64) -> &mut Self {
        let arg = self.slots.len() as u32;
        self.bindings.push(ArgBinding {
            arg,
            slot,
            offset,
            length,
        });
        // The recorded value until a table gives the slot its address: the offset.
        self.push(offset)
    }

    /// Appends the kernel's `cuhal_zone_stamp*` parameter (`cuhal_zone_stamp.cuh` in
    /// `cuhal-trace`): the slot where the kernel folds its own start and end, so that its FINE
    /// zone comes from its own clock instead of timing events around it.
    ///
    /// Recorded as null (0), which the kernel takes as "not stamped", unless the command buffer
    /// traces at [`Verbosity::Fine`](crate::Verbosity::Fine) with a tracer that takes stamps
    /// ([`ZoneRecorder::stamp_zone`](crate::ZoneRecorder::stamp_zone)) and binds per
    /// submission (graph and deferred command buffers). A stream command buffer has no
    /// per-submission table: its stamp argument stays null and the dispatch is timed as any
    /// other. At most one per kernel: a second is refused when the dispatch is recorded
    /// ([`Error::BadKernelArgument`]).
    pub fn push_zone_stamp(&mut self) -> &mut Self {
        let arg = self.slots.len() as u32;
        self.zone_stamps.push(arg);
        self.push(0u64)
    }

    /// Appends the kernel's zone-stamp parameter, builder style
    /// ([`KernelArgs::push_zone_stamp`]).
    pub fn with_zone_stamp(mut self) -> Self {
        self.push_zone_stamp();
        self
    }

    /// The index of the zone-stamp argument, if there is one; more than one is an error.
    pub fn zone_stamp(&self) -> Result<Option<u32>, Error> {
        match self.zone_stamps.as_slice() {
            [] => Ok(None),
            [arg] => Ok(Some(*arg)),
            _ => Err(Error::BadKernelArgument {
                reason: "more than one zone-stamp argument",
            }),
        }
    }

    /// These arguments with the zone-stamp argument `arg` bound to `slot` at `offset` (16
    /// bytes), for a stamped dispatch.
    pub(crate) fn with_stamp_binding(&self, arg: u32, slot: u32, offset: u64) -> Self {
        let mut args = self.clone();
        args.bindings.push(ArgBinding {
            arg,
            slot,
            offset,
            length: ZONE_STAMP_BYTES,
        });
        args
    }

    /// Appends a range's address, builder style.
    pub fn with_range(mut self, range: &BufferRange) -> Self {
        self.push_range(range);
        self
    }

    /// Appends raw bytes (a struct parameter) at `align`, a power of two up to 16.
    pub fn push_bytes(&mut self, bytes: &[u8], align: usize) -> Result<&mut Self, Error> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::BadKernelArgument {
                reason: "alignment must be a power of two no larger than 16",
            });
        }
        if bytes.is_empty() {
            return Err(Error::BadKernelArgument {
                reason: "an argument of zero bytes",
            });
        }
        // The caller gives the size: a host without the memory is an error, not an abort.
        let offset = self
            .bytes
            .try_push(bytes, align)
            .ok_or_else(|| out_of_host_memory("kernel arguments", bytes.len()))?;
        self.note_slot(offset, bytes.len());
        Ok(self)
    }

    fn push_slot(&mut self, bytes: &[u8], align: usize) {
        let offset = self.bytes.push(bytes, align);
        self.note_slot(offset, bytes.len());
    }

    fn note_slot(&mut self, offset: usize, size: usize) {
        // Sizes past u32 saturate; such arguments are refused at dispatch (the driver takes at
        // most 32,764 bytes of them).
        self.slots.push(ArgSlot {
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            size: u32::try_from(size).unwrap_or(u32::MAX),
        });
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The packed parameter buffer (each value at its aligned offset).
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Where each argument lives in [`KernelArgs::bytes`].
    pub fn slots(&self) -> &[ArgSlot] {
        &self.slots
    }

    /// Buffers the arguments refer to (from [`KernelArgs::push_range`]).
    pub fn buffers(&self) -> &[Arc<Buffer>] {
        &self.buffers
    }

    /// The arguments that name binding slots.
    pub fn bindings(&self) -> &[ArgBinding] {
        &self.bindings
    }

    /// The `void**` array the driver takes: one pointer per argument into this builder's
    /// storage. The pointers are valid while `self` is borrowed and unmodified.
    pub fn pointers(&self) -> SmallVec<[*mut c_void; 16]> {
        let base = self.bytes.base();
        self.slots
            .iter()
            .map(|s| {
                // SAFETY: every slot lies inside the storage that `base` starts (it was pushed
                // there), so the offset stays in bounds of one allocation.
                unsafe { base.add(s.offset as usize) }
                    .cast_mut()
                    .cast::<c_void>()
            })
            .collect()
    }

    /// Empties the list for reuse, keeping its storage.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.slots.clear();
        self.buffers.clear();
        self.bindings.clear();
        self.zone_stamps.clear();
    }
}

impl std::fmt::Debug for KernelArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("slots", &self.slots)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_a_c_struct_of_the_parameters() {
        #[repr(C)]
        struct Params {
            out: u64,
            c: u8,
            x: u64,
            s: u16,
            w: u32,
            f: f32,
            v: [f32; 3],
            d: f64,
        }
        let mut args = KernelArgs::new();
        args.push(0xdead_beef_u64)
            .push(7u8)
            .push(0x0102_0304_0506_0708u64)
            .push(0xabcdu16)
            .push(0x1122_3344u32)
            .push(1.5f32)
            .push([1.0f32, 2.0, 3.0])
            .push(-2.25f64);
        let offsets: Vec<u32> = args.slots().iter().map(|s| s.offset).collect();
        let expected = [
            std::mem::offset_of!(Params, out),
            std::mem::offset_of!(Params, c),
            std::mem::offset_of!(Params, x),
            std::mem::offset_of!(Params, s),
            std::mem::offset_of!(Params, w),
            std::mem::offset_of!(Params, f),
            std::mem::offset_of!(Params, v),
            std::mem::offset_of!(Params, d),
        ]
        .map(|o| o as u32);
        assert_eq!(offsets, expected);
        let sizes: Vec<u32> = args.slots().iter().map(|s| s.size).collect();
        assert_eq!(sizes, [8, 1, 8, 2, 4, 4, 12, 8]);

        let bytes = args.bytes();
        let read_u64 = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(read_u64(16), 0x0102_0304_0506_0708);
        assert_eq!(bytes[8], 7);
        assert_eq!(&bytes[9..16], &[0; 7], "padding is zeroed");
        assert_eq!(
            u16::from_ne_bytes(bytes[24..26].try_into().unwrap()),
            0xabcd
        );
        assert_eq!(f64::from_ne_bytes(bytes[48..56].try_into().unwrap()), -2.25);
    }

    #[test]
    fn pointers_point_at_each_value() {
        let args = KernelArgs::new().with(3u32).with(9u64).with(-1i16);
        let ptrs = args.pointers();
        assert_eq!(ptrs.len(), 3);
        // SAFETY: the pointers point into `args`, which is alive and unmodified, at values of
        // the pushed types and alignments.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u32), 3);
            assert_eq!(*(ptrs[1] as *const u64), 9);
            assert_eq!(*(ptrs[2] as *const i16), -1);
        }
        for (p, s) in ptrs.iter().zip(args.slots()) {
            assert_eq!(
                *p as usize % (s.size as usize).min(8),
                0,
                "aligned in memory"
            );
        }
    }

    #[test]
    fn raw_bytes_take_their_alignment() {
        let mut args = KernelArgs::new();
        args.push(1u8);
        args.push_bytes(&[5; 16], 16).unwrap();
        assert_eq!(
            args.slots()[1],
            ArgSlot {
                offset: 16,
                size: 16
            }
        );
        assert!(matches!(
            args.push_bytes(&[1], 3),
            Err(Error::BadKernelArgument { .. })
        ));
        assert!(matches!(
            args.push_bytes(&[1], 32),
            Err(Error::BadKernelArgument { .. })
        ));
        assert!(matches!(
            args.push_bytes(&[], 4),
            Err(Error::BadKernelArgument { .. })
        ));
        assert_eq!(args.len(), 2, "rejected arguments are not added");
    }

    #[test]
    fn zone_stamp_is_a_null_pointer_argument() {
        let mut args = KernelArgs::new();
        args.push(3u32).push_zone_stamp().push(1u8);
        assert_eq!(args.len(), 3);
        assert_eq!(args.slots()[1], ArgSlot { offset: 8, size: 8 });
        assert_eq!(&args.bytes()[8..16], &[0; 8], "null until bound");
        assert_eq!(args.zone_stamp().unwrap(), Some(1));
        assert!(args.bindings().is_empty());
        let bound = args.with_stamp_binding(1, 7, 32);
        assert_eq!(
            bound.bindings(),
            &[ArgBinding {
                arg: 1,
                slot: 7,
                offset: 32,
                length: 16
            }]
        );
        assert_eq!(KernelArgs::new().with(1u32).zone_stamp().unwrap(), None);
        let twice = KernelArgs::new().with_zone_stamp().with_zone_stamp();
        assert!(matches!(
            twice.zone_stamp(),
            Err(Error::BadKernelArgument { .. })
        ));
        args.clear();
        assert_eq!(args.zone_stamp().unwrap(), None);
    }

    #[test]
    fn raw_ranges_push_their_address() {
        // SAFETY: the range never reaches a device.
        let range = unsafe { BufferRange::from_raw(0x7000_0000, 256) };
        let args = KernelArgs::new().with_range(&range.sub(16, 16).unwrap());
        assert_eq!(args.bytes(), &0x7000_0010u64.to_ne_bytes());
        assert!(args.buffers().is_empty());
    }
}
