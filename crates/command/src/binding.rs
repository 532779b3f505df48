//! Binding tables: command buffers recorded with slots instead of buffers, bound to memory at
//! each submission.
//!
//! A command buffer created with a binding capacity may record [`BufferRange::slot`] ranges
//! wherever it takes a buffer range (fill, update, copy targets and sources), and kernel
//! arguments that name a slot and an offset ([`KernelArgs::push_binding`]). Recording checks
//! what it can without memory (slot below the capacity, offsets that do not overflow, fill
//! alignment of the offset) and keeps, per slot, the largest extent used and the strictest
//! alignment, in a [`BindingLayout`]. Each submission passes a binding table, one
//! [`BufferRange`] per slot, which [`BindingLayout::check`] checks entirely before anything
//! is issued, so a bad table is a typed error and never a failure on the queue.
//!
//! What each kind does with a table: a graph command buffer patches, in each executable, only
//! the nodes whose slots are bound to other addresses than at that executable's last launch
//! (`cuGraphExec{Kernel,Memcpy,Memset}NodeSetParams`); a deferred one substitutes the
//! addresses while it replays.
//!
//! [`KernelArgs::push_binding`]: crate::KernelArgs::push_binding

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use cuhal_recycle::Recycled;
use cuhal_sys::{CUcontext, CUdeviceptr};
use smallvec::SmallVec;

use crate::error::out_of_host_memory;
use crate::range::check_no_overlap;
use crate::{ArgBinding, ArgSlot, BindingError, BufferRange, Error};

/// Where a command's memory operand lives: a fixed address, or an offset in a slot's binding.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Operand {
    Address(CUdeviceptr),
    Slot { slot: u32, offset: u64 },
}

impl Operand {
    /// The operand of a range (checked by the recorder first).
    pub(crate) fn of(range: &BufferRange) -> Self {
        match range.binding_slot() {
            Some(slot) => Operand::Slot {
                slot,
                offset: range.offset() as u64,
            },
            None => Operand::Address(range.device_ptr()),
        }
    }

    /// The fixed address, or an error for a slot (for encoders that cannot bind: stream).
    pub(crate) fn address(self, what: &'static str) -> Result<CUdeviceptr, Error> {
        match self {
            Operand::Address(address) => Ok(address),
            Operand::Slot { slot, .. } => {
                Err(BindingError::SlotRangeNotBound { what, slot }.into())
            }
        }
    }

    pub(crate) fn slot(self) -> Option<u32> {
        match self {
            Operand::Address(_) => None,
            Operand::Slot { slot, .. } => Some(slot),
        }
    }

    /// The address with `table` bound (a table [`BindingLayout::check`] accepted).
    #[inline]
    pub(crate) fn resolve(self, table: &[BufferRange]) -> CUdeviceptr {
        match self {
            Operand::Address(address) => address,
            Operand::Slot { slot, offset } => table[slot as usize].device_ptr() + offset,
        }
    }

    /// The address recorded in place of a slot operand before any table is known: its offset
    /// (never used by the driver; deferred buffers substitute, graphs patch before launching).
    pub(crate) fn recorded(self) -> CUdeviceptr {
        match self {
            Operand::Address(address) => address,
            Operand::Slot { offset, .. } => offset,
        }
    }
}

/// The most binding slots a command buffer may have: about a million. A layout's storage and a
/// submission's checks grow with the slots the commands name, not with this bound, so it only
/// keeps a capacity no table could reach (`u32::MAX` given by mistake) a typed error at creation.
pub const MAX_BINDING_CAPACITY: u32 = 1 << 20;

/// What a command buffer recorded about its binding slots, checked against each table.
///
/// Its storage grows with the slots the commands name, never with the declared capacity.
#[derive(Clone, Debug, Default)]
pub struct BindingLayout {
    capacity: u32,
    /// Per slot named so far (`slot < extents.len() <= capacity`): the largest
    /// `offset + length` used (`None`: unused).
    extents: Vec<Option<usize>>,
    /// Per slot named so far: the largest fill element size used on it (1 when none).
    alignments: Vec<u8>,
    /// Copies with a slot operand: checked for overlap once the table is known.
    copies: Vec<(Operand, Operand, usize)>,
    /// One past the highest slot used.
    needed: usize,
    /// Stamped dispatches' zones ([`ZoneRecorder::stamp_zone`](crate::ZoneRecorder::stamp_zone)):
    /// one past the highest stamp index recorded.
    stamps: u32,
}

/// The slot stamp bindings are recorded with until recording ends and the stamp slot is known
/// ([`BindingLayout::stamp_slot`]); never seen by a table.
pub(crate) const STAMP_SLOT_PENDING: u32 = u32::MAX;

/// The layout of command buffers without slots.
static NO_BINDINGS: BindingLayout = BindingLayout {
    capacity: 0,
    extents: Vec::new(),
    alignments: Vec::new(),
    copies: Vec::new(),
    needed: 0,
    stamps: 0,
};

impl BindingLayout {
    /// The layout of a command buffer recorded without slots (accepts only empty tables).
    pub fn none() -> &'static BindingLayout {
        &NO_BINDINGS
    }

    /// An empty layout for slots below `capacity`; more than [`MAX_BINDING_CAPACITY`] is an
    /// error. Nothing is allocated until a command names a slot.
    pub(crate) fn with_capacity(capacity: u32) -> Result<Self, Error> {
        if capacity > MAX_BINDING_CAPACITY {
            return Err(BindingError::CapacityTooLarge {
                capacity,
                max: MAX_BINDING_CAPACITY,
            }
            .into());
        }
        Ok(Self {
            capacity,
            ..Self::default()
        })
    }

    /// The binding capacity the command buffer was created with.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// One past the highest slot recorded: the shortest table a submission may pass.
    pub fn slots_used(&self) -> usize {
        self.needed
    }

    /// Whether the command buffer recorded any slot (and so needs a table).
    pub fn has_slots(&self) -> bool {
        self.needed > 0
    }

    /// How many zone stamps the command buffer's stamped dispatches use (0: none): its stamp
    /// region holds this many 16-byte slots.
    pub fn stamp_count(&self) -> u32 {
        self.stamps
    }

    /// The hidden slot a command buffer with stamped dispatches binds its stamp region to: one
    /// past the user's slots ([`Self::slots_used`] once recording ended). `None` without
    /// stamps. The user's tables never include it: [`Self::check`] is unchanged for them, and
    /// the queue issues with [`Self::stamped_table_into`].
    pub fn stamp_slot(&self) -> Option<u32> {
        (self.stamps > 0).then_some(self.needed as u32)
    }

    /// Writes the table a command buffer with stamps is issued with into `out` (emptied
    /// first; its room is kept, so a caller that reuses it allocates nothing once warm):
    /// `table` (the user's, which passed [`Self::check`]) cut to the slots used, then `region`
    /// (at least [`Self::stamp_count`] `* 16` bytes of zeroed device memory) at
    /// [`Self::stamp_slot`]. Without stamps, `table` unchanged.
    pub fn stamped_table_into(
        &self,
        table: &[BufferRange],
        region: BufferRange,
        out: &mut Vec<BufferRange>,
    ) {
        out.clear();
        if self.stamps == 0 {
            out.extend(table.iter().cloned());
            return;
        }
        out.extend(table.iter().take(self.needed).cloned());
        out.push(region);
    }

    /// The shortest table an issue takes: the user's slots, and the stamp slot if any.
    pub(crate) fn issue_table_len(&self) -> usize {
        self.needed + usize::from(self.stamps > 0)
    }

    /// Notes a stamped dispatch's stamp index.
    pub(crate) fn use_stamp(&mut self, index: u32) {
        self.stamps = self.stamps.max(index.saturating_add(1));
    }

    /// The largest `offset + length` recorded for `slot`, or `None` if it is unused.
    pub fn extent(&self, slot: u32) -> Option<usize> {
        self.extents.get(slot as usize).copied().flatten()
    }

    /// Checks that `slot` exists and makes room to note its use, without recording anything:
    /// the notes after the command is encoded then cannot fail.
    fn check_slot(&mut self, slot: u32) -> Result<(), Error> {
        if slot >= self.capacity {
            return Err(BindingError::SlotOutOfCapacity {
                slot,
                capacity: self.capacity,
            }
            .into());
        }
        let len = slot as usize + 1;
        if let Some(more) = len.checked_sub(self.extents.len()).filter(|&n| n > 0) {
            let bytes = more * (size_of::<Option<usize>>() + size_of::<u8>());
            let room = self.extents.try_reserve(more);
            room.and_then(|()| self.alignments.try_reserve(more))
                .map_err(|_| out_of_host_memory("binding layout", bytes))?;
            self.extents.resize(len, None);
            self.alignments.resize(len, 1);
        }
        Ok(())
    }

    /// Checks a range's slot (if it has one) before a command is recorded.
    pub(crate) fn check_range(&mut self, range: &BufferRange) -> Result<(), Error> {
        match range.binding_slot() {
            Some(slot) => self.check_slot(slot),
            None => Ok(()),
        }
    }

    /// Checks the slots kernel arguments name.
    pub(crate) fn check_args(&mut self, bindings: &[ArgBinding]) -> Result<(), Error> {
        bindings.iter().try_for_each(|b| self.check_slot(b.slot))
    }

    fn note_extent(&mut self, slot: u32, end: usize) {
        let extent = &mut self.extents[slot as usize];
        *extent = Some(extent.map_or(end, |e| e.max(end)));
        self.needed = self.needed.max(slot as usize + 1);
    }

    /// Records what a recorded command uses of `range`'s slot: its extent and the alignment of
    /// its fills (`element`, 1 for anything else). Call after [`Self::check_range`] and after
    /// the command was encoded.
    pub(crate) fn use_range(&mut self, range: &BufferRange, element: usize) {
        if let Some(slot) = range.binding_slot() {
            self.note_extent(slot, range.offset() + range.len());
            let alignment = &mut self.alignments[slot as usize];
            *alignment = (*alignment).max(element as u8);
        }
    }

    /// Records a copy with at least one slot operand, to check its overlap at submission.
    pub(crate) fn use_copy(&mut self, source: &BufferRange, target: &BufferRange) {
        let (s, t) = (Operand::of(source), Operand::of(target));
        if (s.slot().is_some() || t.slot().is_some()) && s.slot() != t.slot() {
            self.copies.push((s, t, source.len()));
        }
    }

    /// Records what kernel arguments use of their slots.
    pub(crate) fn use_args(&mut self, bindings: &[ArgBinding]) {
        for b in bindings {
            let end = b.offset.saturating_add(b.length);
            self.note_extent(b.slot, usize::try_from(end).unwrap_or(usize::MAX));
        }
    }

    /// Checks `table` for a submission on `context`: an empty table for a command buffer
    /// without slots; otherwise at least one entry per slot used and no more than the
    /// capacity, every used entry memory (not a slot range) of `context` (ranges made with
    /// `BufferRange::from_raw` are taken on the caller's word), at least as long as the slot's
    /// extent, aligned for the slot's fills, and no copy overlapping itself.
    pub fn check(&self, table: &[BufferRange], context: CUcontext) -> Result<(), Error> {
        if self.capacity == 0 {
            return if table.is_empty() {
                Ok(())
            } else {
                Err(BindingError::TableNotExpected { given: table.len() }.into())
            };
        }
        if table.is_empty() && self.needed > 0 {
            return Err(BindingError::TableMissing {
                needed: self.needed,
            }
            .into());
        }
        if table.len() < self.needed {
            return Err(BindingError::TableTooShort {
                given: table.len(),
                needed: self.needed,
            }
            .into());
        }
        if table.len() > self.capacity as usize {
            return Err(BindingError::TableTooLong {
                given: table.len(),
                capacity: self.capacity,
            }
            .into());
        }
        for (slot, entry) in table.iter().enumerate().take(self.needed) {
            let Some(extent) = self.extents[slot] else {
                continue;
            };
            let slot = slot as u32;
            if let Some(inner) = entry.binding_slot() {
                return Err(BindingError::SlotRangeNotBound {
                    what: "a binding table entry",
                    slot: inner,
                }
                .into());
            }
            if let Some(buffer) = entry.buffer()
                && buffer.context().raw() != context
            {
                return Err(BindingError::BindingContext { slot }.into());
            }
            if entry.len() < extent {
                return Err(BindingError::BindingTooSmall {
                    slot,
                    length: entry.len(),
                    extent,
                }
                .into());
            }
            let alignment = usize::from(self.alignments[slot as usize]);
            if !entry.device_ptr().is_multiple_of(alignment as u64) {
                return Err(BindingError::BindingMisaligned {
                    slot,
                    address: entry.device_ptr(),
                    alignment,
                }
                .into());
            }
        }
        for &(source, target, length) in &self.copies {
            let (s, t) = (source.resolve(table), target.resolve(table));
            if check_no_overlap(s, t, length).is_err() {
                return Err(BindingError::OverlappingCopy {
                    source: s,
                    target: t,
                    length,
                }
                .into());
            }
        }
        Ok(())
    }
}

/// 16-byte units, so argument values copied here keep their alignment.
#[derive(Copy, Clone, Default)]
#[repr(C, align(16))]
struct Unit([u8; 16]);

/// The room an argument scratch's lists take when they first grow (then doubled, and kept).
const MIN_ARG_ROOM: usize = 16;

/// Scratch for kernel arguments with substituted addresses: the driver copies argument values
/// when a launch is enqueued or a node's parameters are set, so one scratch per issuer at a time
/// is enough (a graph executable holds one; replays of a deferred command buffer take one of
/// its [`ArgScratches`]), and it stops growing after the largest argument list it has seen.
#[derive(Default)]
pub(crate) struct ArgScratch {
    bytes: Recycled<Vec<Unit>, MIN_ARG_ROOM>,
    /// The address of each argument in `bytes`, exposed: the `void**` the driver reads.
    /// Addresses rather than pointers, so that the scratch can move between threads.
    pointers: Recycled<Vec<usize>, MIN_ARG_ROOM>,
}

/// The argument scratches of one command buffer that several threads may replay at once: each
/// replay takes one for its launches and gives it back after, so a warm command buffer replays
/// without allocating, whatever thread replays it (a thread's first replay included).
#[derive(Default)]
pub(crate) struct ArgScratches(Mutex<Recycled<Vec<ArgScratch>, MIN_SCRATCHES>>);

/// The room the list of spare scratches takes when it first grows: replays at once.
const MIN_SCRATCHES: usize = 4;

impl ArgScratches {
    /// A spare scratch (a new one when none is spare), given back when the result drops.
    pub(crate) fn take(&self) -> TakenScratch<'_> {
        let spare = self.0.lock().unwrap_or_else(PoisonError::into_inner).pop();
        TakenScratch {
            scratch: spare.unwrap_or_default(),
            home: self,
        }
    }
}

/// A scratch taken from [`ArgScratches`], given back when dropped.
pub(crate) struct TakenScratch<'a> {
    scratch: ArgScratch,
    home: &'a ArgScratches,
}

impl TakenScratch<'_> {
    /// The scratch, for [`with_bound_args`].
    pub(crate) fn scratch(&mut self) -> &mut ArgScratch {
        &mut self.scratch
    }
}

impl Drop for TakenScratch<'_> {
    fn drop(&mut self) {
        let scratch = std::mem::take(&mut self.scratch);
        self.home
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(scratch);
    }
}

/// Calls `use_args` with the `void**` of packed arguments `bytes` (laid out as `slots` say)
/// whose bound arguments hold their slot's address in `table` plus their offset, written in
/// `scratch`. Allocates only the first time `scratch` sees a longer argument list.
pub(crate) fn with_bound_args<R>(
    scratch: &mut ArgScratch,
    bytes: &[u8],
    slots: &[ArgSlot],
    bindings: &[ArgBinding],
    table: &[BufferRange],
    use_args: impl FnOnce(*mut *mut c_void) -> R,
) -> R {
    let units = bytes.len().div_ceil(16);
    if scratch.bytes.len() < units {
        let more = units - scratch.bytes.len();
        scratch
            .bytes
            .extend(std::iter::repeat_n(Unit::default(), more));
    }
    let base = scratch.bytes.as_mut_slice().as_mut_ptr().cast::<u8>();
    // SAFETY: `scratch.bytes` holds at least `bytes.len()` bytes (units of plain bytes), and
    // nothing else borrows it while `buffer` lives (`scratch` is borrowed mutably here).
    let buffer = unsafe { std::slice::from_raw_parts_mut(base, bytes.len()) };
    buffer.copy_from_slice(bytes);
    for b in bindings {
        let slot = slots[b.arg as usize];
        let address = table[b.slot as usize].device_ptr() + b.offset;
        let at = slot.offset as usize;
        buffer[at..at + 8].copy_from_slice(&address.to_ne_bytes());
    }
    scratch.pointers.clear();
    scratch.pointers.extend(
        slots
            .iter()
            // Every slot lies inside `bytes`, so the address is inside `buffer`.
            .map(|s| base.wrapping_add(s.offset as usize).expose_provenance()),
    );
    let pointers = if scratch.pointers.is_empty() {
        std::ptr::null_mut()
    } else {
        // An address and a pointer have one size and alignment: the driver reads the list as
        // `void*`s, whose provenance `expose_provenance` kept.
        scratch
            .pointers
            .as_mut_slice()
            .as_mut_ptr()
            .cast::<*mut c_void>()
    };
    use_args(pointers)
}

/// The slots a command's operands name, deduplicated (inline for up to four).
pub(crate) type SlotList = SmallVec<[u32; 4]>;

/// Adds `slot` to `list` unless it is there.
pub(crate) fn add_slot(list: &mut SlotList, slot: Option<u32>) {
    if let Some(slot) = slot
        && !list.contains(&slot)
    {
        list.push(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(base: u64, capacity: usize) -> BufferRange {
        // SAFETY: these ranges never reach a device.
        unsafe { BufferRange::from_raw(base, capacity) }
    }

    /// [`with_bound_args`] on all of `args`.
    fn bind<R>(
        scratch: &mut ArgScratch,
        args: &crate::KernelArgs,
        table: &[BufferRange],
        use_args: impl FnOnce(*mut *mut c_void) -> R,
    ) -> R {
        with_bound_args(
            scratch,
            args.bytes(),
            args.slots(),
            args.bindings(),
            table,
            use_args,
        )
    }

    fn layout() -> BindingLayout {
        let mut l = BindingLayout::with_capacity(4).unwrap();
        let a = BufferRange::slot(0, 16, 64).unwrap();
        let b = BufferRange::slot(2, 0, 32).unwrap();
        l.check_range(&a).unwrap();
        l.check_range(&b).unwrap();
        l.use_range(&a, 4);
        l.use_range(&b, 1);
        l.use_copy(&b, &BufferRange::slot(0, 0, 32).unwrap());
        l
    }

    #[test]
    fn extents_and_needed_slots_follow_the_recording() {
        let mut l = layout();
        assert_eq!(l.extent(0), Some(80));
        assert_eq!(l.extent(1), None);
        assert_eq!(l.extent(2), Some(32));
        assert_eq!(l.slots_used(), 3);
        assert!(l.has_slots());
        assert_eq!(
            l.check_range(&BufferRange::slot(4, 0, 1).unwrap()),
            Err(Error::Binding(BindingError::SlotOutOfCapacity {
                slot: 4,
                capacity: 4
            }))
        );
    }

    #[test]
    fn a_capacity_past_the_limit_is_an_error_and_storage_follows_the_slots_named() {
        for capacity in [MAX_BINDING_CAPACITY + 1, u32::MAX] {
            assert_eq!(
                BindingLayout::with_capacity(capacity).unwrap_err(),
                Error::Binding(BindingError::CapacityTooLarge {
                    capacity,
                    max: MAX_BINDING_CAPACITY
                })
            );
        }
        let mut l = BindingLayout::with_capacity(MAX_BINDING_CAPACITY).unwrap();
        assert_eq!(l.extents.capacity() + l.alignments.capacity(), 0);
        let range = BufferRange::slot(3, 0, 8).unwrap();
        l.check_range(&range).unwrap();
        l.use_range(&range, 1);
        assert_eq!((l.extents.len(), l.alignments.len()), (4, 4));
        assert!(
            l.extents.capacity() < 64,
            "grown to {}",
            l.extents.capacity()
        );
        assert_eq!(l.slots_used(), 4);
        // The highest slot: storage for every slot below it, and nothing past.
        let last = BufferRange::slot(MAX_BINDING_CAPACITY - 1, 0, 8).unwrap();
        l.check_range(&last).unwrap();
        assert_eq!(l.extents.len(), MAX_BINDING_CAPACITY as usize);
    }

    #[test]
    fn every_bad_table_is_its_own_error() {
        let l = layout();
        let ok = [raw(0x1000, 80), raw(0, 0), raw(0x2000, 32)];
        assert_eq!(l.check(&ok, std::ptr::null_mut()), Ok(()));
        let err = |table: &[BufferRange]| match l.check(table, std::ptr::null_mut()) {
            Err(Error::Binding(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            err(&ok[..2]),
            BindingError::TableTooShort {
                given: 2,
                needed: 3
            }
        );
        let five = [
            ok[0].clone(),
            ok[1].clone(),
            ok[2].clone(),
            raw(0, 0),
            raw(0, 0),
        ];
        assert_eq!(
            err(&five),
            BindingError::TableTooLong {
                given: 5,
                capacity: 4
            }
        );
        assert_eq!(
            err(&[raw(0x1000, 79), raw(0, 0), raw(0x2000, 32)]),
            BindingError::BindingTooSmall {
                slot: 0,
                length: 79,
                extent: 80
            }
        );
        assert_eq!(
            err(&[raw(0x1002, 80), raw(0, 0), raw(0x2000, 32)]),
            BindingError::BindingMisaligned {
                slot: 0,
                address: 0x1002,
                alignment: 4
            }
        );
        assert_eq!(
            err(&[
                raw(0x1000, 80),
                raw(0, 0),
                BufferRange::slot(1, 0, 32).unwrap()
            ]),
            BindingError::SlotRangeNotBound {
                what: "a binding table entry",
                slot: 1
            }
        );
        // Slot 2's 32 bytes copied onto slot 0's first 32: bound to overlapping memory.
        assert_eq!(
            err(&[raw(0x1000, 80), raw(0, 0), raw(0x1010, 32)]),
            BindingError::OverlappingCopy {
                source: 0x1010,
                target: 0x1000,
                length: 32
            }
        );
        assert_eq!(
            BindingLayout::none().check(&ok, std::ptr::null_mut()),
            Err(Error::Binding(BindingError::TableNotExpected { given: 3 }))
        );
        assert_eq!(
            BindingLayout::none().check(&[], std::ptr::null_mut()),
            Ok(())
        );
        assert_eq!(err(&[]), BindingError::TableMissing { needed: 3 });
        assert!(err(&[]).to_string().contains("uses 3 slots"));
    }

    #[test]
    fn bound_arguments_hold_the_table_address() {
        let args = crate::KernelArgs::new()
            .with(7u32)
            .with_binding(1, 8)
            .with(9u64);
        let table = [raw(0x5000, 16), raw(0x9000, 64)];
        let mut scratch = ArgScratch::default();
        let values = bind(&mut scratch, &args, &table, |p| {
            // SAFETY: three pointers into the scratch, at values of the pushed types.
            unsafe {
                let p = std::slice::from_raw_parts(p, 3);
                (
                    *(p[0] as *const u32),
                    *(p[1] as *const u64),
                    *(p[2] as *const u64),
                )
            }
        });
        assert_eq!(values, (7, 0x9008, 9));
    }

    /// A scratch keeps its room: a second call with the same arguments writes where the first
    /// did, and a shorter list leaves the room as it was.
    #[test]
    fn a_scratch_is_reused_across_calls() {
        let args = crate::KernelArgs::new().with_binding(0, 0).with([5u8; 40]);
        let table = [raw(0x7000, 64)];
        let mut scratch = ArgScratch::default();
        let mut first = std::ptr::null_mut();
        bind(&mut scratch, &args, &table, |p| {
            first = p;
        });
        let room = (scratch.bytes.capacity(), scratch.pointers.capacity());
        let second = bind(&mut scratch, &args, &table, |p| {
            // SAFETY: two pointers into the scratch: the bound address, then the bytes.
            unsafe {
                let p = std::slice::from_raw_parts(p, 2);
                assert_eq!(*(p[0] as *const u64), 0x7000);
                assert_eq!(*(p[1] as *const [u8; 40]), [5; 40]);
            }
            p
        });
        assert_eq!(first, second);
        let short = crate::KernelArgs::new().with(1u32);
        bind(&mut scratch, &short, &table, |_| {});
        assert_eq!(
            (scratch.bytes.capacity(), scratch.pointers.capacity()),
            room
        );
    }

    /// Replays at once take distinct scratches; given back, they are taken again (with the room
    /// they grew to) instead of new ones.
    #[test]
    fn scratches_are_lent_one_per_replay_and_kept() {
        let scratches = ArgScratches::default();
        let args = crate::KernelArgs::new().with([1u8; 100]).with_binding(0, 8);
        let table = [raw(0x1000, 64)];
        let mut a = scratches.take();
        let mut b = scratches.take();
        for taken in [&mut a, &mut b] {
            bind(taken.scratch(), &args, &table, |_| {});
        }
        assert_ne!(
            a.scratch().bytes.as_ptr(),
            b.scratch().bytes.as_ptr(),
            "two replays share a scratch"
        );
        let grown = [a.scratch().bytes.as_ptr(), b.scratch().bytes.as_ptr()];
        drop((a, b));
        assert_eq!(scratches.0.lock().unwrap().len(), 2);
        let mut again = scratches.take();
        assert!(grown.contains(&again.scratch().bytes.as_ptr()));
        assert!(again.scratch().bytes.capacity() >= 100 / 16);
    }
}
