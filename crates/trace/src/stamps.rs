//! The zone-stamp ring of a context: device memory where stamped kernels fold their own start
//! and end (`cuhal_zone_stamp.cuh`), 16 bytes a stamp.
//!
//! Allocated and zeroed at the first submission with stamps, [`TraceConfig::stamp_slots`]
//! slots (`crate::TraceConfig`), never grown. Each submitted command buffer with stamps takes a
//! contiguous region of its stamp count; collection reads the region after the submission
//! completed, zeroes it and gives it back. The regions in use are kept in a list sorted by
//! start, taken first-fit from after the last one taken (so the ring turns), whose room is
//! reserved for every slot: once warm, taking and giving back allocate nothing.
//!
//! When no region fits (the ring full of submissions not collected yet, or a command buffer
//! with more stamps than the ring has slots), the command buffer is bound to a discard region
//! instead: device memory its kernels may write and nobody reads. Its stamps are dropped and
//! counted ([`DropReason::StampsExhausted`](crate::DropReason::StampsExhausted)); the work
//! runs as ever.

use cuhal_sys::CUdeviceptr;

use crate::Error;
use crate::backend::EventBackend;

/// Bytes of one stamp (`CUHAL_ZONE_STAMP_BYTES`).
pub(crate) const STAMP_BYTES: usize = cuhal_command::ZONE_STAMP_BYTES as usize;

/// The default ring size, in stamps: 64 Ki (1 MiB of device memory).
pub const DEFAULT_STAMP_SLOTS: u32 = 64 * 1024;

/// Where a submitted command buffer's stamps are.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct StampRegion {
    /// Its first byte.
    pub(crate) address: CUdeviceptr,
    /// Its stamps.
    pub(crate) count: u32,
    /// Its first slot in the ring; `None` for the discard region (nothing to read back).
    pub(crate) start: Option<u32>,
}

impl StampRegion {
    pub(crate) fn bytes(&self) -> usize {
        self.count as usize * STAMP_BYTES
    }
}

/// The ring and the discard region.
pub(crate) struct StampRing {
    capacity: u32,
    /// The ring's memory, once allocated and zeroed.
    base: Option<CUdeviceptr>,
    /// Allocating or zeroing the ring failed: no more tries (every stamp goes to discard).
    failed: bool,
    /// Regions in use, as (first slot, count), sorted by first slot.
    used: Vec<(u32, u32)>,
    /// Where the next region is looked for first.
    cursor: u32,
    /// Discard memory, the largest last (earlier ones may still be written by work in flight,
    /// so they are kept until the context goes).
    discard: Vec<(CUdeviceptr, usize)>,
    /// A region was given up while work that may write it could still be in flight
    /// ([`StampRing::quarantine`]): the memory is leaked rather than freed when the context goes.
    written_late: bool,
}

impl StampRing {
    pub(crate) fn new(capacity: u32) -> Self {
        Self {
            capacity,
            base: None,
            failed: false,
            used: Vec::new(),
            cursor: 0,
            discard: Vec::new(),
            written_late: false,
        }
    }

    /// Regions in use now.
    pub(crate) fn in_use(&self) -> usize {
        self.used.len()
    }

    /// A region of `count` stamps, zeroed: of the ring (`start` set), or the discard region
    /// when none fits (`start` `None`). An error only when no device memory could be had at
    /// all (the submission then fails: its kernels would write through a bad pointer).
    pub(crate) fn acquire(
        &mut self,
        backend: &dyn EventBackend,
        count: u32,
    ) -> Result<StampRegion, Error> {
        if count == 0 {
            return Err(Error::Stamps {
                reason: "a region of no stamps",
            });
        }
        if let Some(base) = self.ring(backend)
            && let Some(start) = self.find(count)
        {
            let at = self.used.partition_point(|&(s, _)| s < start);
            self.used.insert(at, (start, count));
            self.cursor = start + count;
            return Ok(StampRegion {
                address: base + start as u64 * STAMP_BYTES as u64,
                count,
                start: Some(start),
            });
        }
        let bytes = count as usize * STAMP_BYTES;
        let address = match self.discard.last() {
            Some(&(address, len)) if len >= bytes => address,
            _ => {
                let len = bytes.max(self.discard.last().map_or(0, |d| d.1 * 2));
                let address = backend.alloc_device(len)?;
                self.discard.push((address, len));
                address
            }
        };
        Ok(StampRegion {
            address,
            count,
            start: None,
        })
    }

    /// Gives a ring region back (a discard region needs nothing).
    pub(crate) fn release(&mut self, region: StampRegion) {
        let Some(start) = region.start else {
            return;
        };
        if let Ok(at) = self.used.binary_search_by_key(&start, |&(s, _)| s) {
            self.used.remove(at);
        }
    }

    /// Keeps a region out of the ring for good: its submission failed or was given up, so work
    /// that may still write it can be in flight, and neither zeroing nor reusing it is safe. The
    /// ring loses its slots (failures are rare), and its memory, with the discard memory, is
    /// leaked rather than freed when the context goes.
    pub(crate) fn quarantine(&mut self, region: StampRegion) {
        let _ = region;
        self.written_late = true;
    }

    /// The ring's memory, allocated and zeroed on first use (its list's room reserved for
    /// every slot, so taking regions never allocates). `None` once that failed.
    fn ring(&mut self, backend: &dyn EventBackend) -> Option<CUdeviceptr> {
        if self.base.is_some() || self.failed || self.capacity == 0 {
            return self.base;
        }
        let bytes = self.capacity as usize * STAMP_BYTES;
        let Ok(address) = backend.alloc_device(bytes) else {
            self.failed = true;
            return None;
        };
        // SAFETY: the memory was just allocated by this backend, `bytes` long; nothing uses it.
        if unsafe { backend.zero_device(address, bytes) }.is_err()
            || self.used.try_reserve(self.capacity as usize).is_err()
        {
            // SAFETY: allocated just above, freed once, never used.
            unsafe { backend.free_device(address) };
            self.failed = true;
            return None;
        }
        self.base = Some(address);
        self.base
    }

    /// The first slot of a free run of `count` slots: from the cursor on, then from 0.
    fn find(&self, count: u32) -> Option<u32> {
        if count > self.capacity {
            return None;
        }
        self.fit_from(self.cursor, count)
            .or_else(|| self.fit_from(0, count))
    }

    /// The first free run of `count` slots starting at or after `from`.
    fn fit_from(&self, from: u32, count: u32) -> Option<u32> {
        let mut start = from;
        let first = self.used.partition_point(|&(s, n)| s + n <= from);
        for &(s, n) in &self.used[first..] {
            if s >= start && s - start >= count {
                return Some(start);
            }
            start = start.max(s + n);
        }
        (self.capacity.checked_sub(start)? >= count).then_some(start)
    }

    /// Frees the ring's and the discard region's memory as the context goes: every submission
    /// that bound them was collected (its work completed), unless one was given up
    /// ([`StampRing::quarantine`]), and then the memory is leaked, never freed under work that
    /// may still write it.
    pub(crate) fn free(&mut self, backend: &dyn EventBackend) {
        if self.written_late {
            self.base = None;
            self.discard.clear();
            return;
        }
        if let Some(base) = self.base.take() {
            // SAFETY: allocated by this backend, freed once; no work that may write it is in
            // flight (every submission that bound it was collected: `written_late` is unset).
            unsafe { backend.free_device(base) };
        }
        for (address, _) in self.discard.drain(..) {
            // SAFETY: as above.
            unsafe { backend.free_device(address) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeGpu;

    #[test]
    fn regions_are_contiguous_reused_and_turn_around_the_ring() {
        let gpu = FakeGpu::new();
        let mut ring = StampRing::new(8);
        let a = ring.acquire(&*gpu, 3).unwrap();
        let b = ring.acquire(&*gpu, 3).unwrap();
        assert_eq!((a.start, b.start), (Some(0), Some(3)));
        assert_eq!(b.address - a.address, 48);
        assert_eq!(gpu.device_bytes(a.address, 128).unwrap(), vec![0; 128]);
        // 2 slots left at the end: a region of 3 goes to discard.
        let c = ring.acquire(&*gpu, 3).unwrap();
        assert_eq!(c.start, None);
        ring.release(a);
        // The cursor is at 6: 6..8 is too short, so it turns to 0.
        let d = ring.acquire(&*gpu, 3).unwrap();
        assert_eq!(d.start, Some(0));
        ring.release(b);
        ring.release(c);
        ring.release(d);
        assert_eq!(ring.in_use(), 0);
        let allocations = gpu.device_allocations();
        for _ in 0..100 {
            let r = ring.acquire(&*gpu, 5).unwrap();
            assert!(r.start.is_some());
            ring.release(r);
        }
        assert_eq!(gpu.device_allocations(), allocations, "warm: no allocation");
        // More stamps than the ring has: discard, grown to fit.
        let big = ring.acquire(&*gpu, 20).unwrap();
        assert_eq!(big.start, None);
        assert!(gpu.device_bytes(big.address, 320).is_some());
        ring.free(&*gpu);
        assert_eq!(gpu.live_device_allocations(), 0);
    }

    #[test]
    fn a_region_given_up_is_never_reused_and_the_memory_is_leaked_not_freed() {
        let gpu = FakeGpu::new();
        let mut ring = StampRing::new(4);
        let lost = ring.acquire(&*gpu, 2).unwrap();
        ring.quarantine(lost);
        assert_eq!(ring.in_use(), 1, "its slots stay taken");
        for _ in 0..10 {
            let r = ring.acquire(&*gpu, 2).unwrap();
            assert_eq!(
                r.start,
                Some(2),
                "only the other half of the ring is handed out"
            );
            ring.release(r);
        }
        let live = gpu.live_device_allocations();
        assert!(live > 0);
        ring.free(&*gpu);
        assert_eq!(
            gpu.live_device_allocations(),
            live,
            "work may still write it: leaked, not freed"
        );
    }

    #[test]
    fn a_ring_that_cannot_be_had_sends_everything_to_discard_or_fails() {
        let gpu = FakeGpu::new();
        gpu.fail_device_memory(true);
        let mut ring = StampRing::new(8);
        assert!(ring.acquire(&*gpu, 1).is_err());
        gpu.fail_device_memory(false);
        let r = ring.acquire(&*gpu, 1).unwrap();
        assert_eq!(r.start, None, "the ring is not tried again");
    }
}
