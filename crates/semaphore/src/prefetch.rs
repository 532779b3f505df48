//! Cache-line prefetches for recycled storage: the crate's only unsafe code, one hint instruction.
//!
//! cuhal recycles what a submission writes (the scheduler's action slots, the device's completion
//! events, the rings that hand work to the completion thread), and the thread that gives a slot
//! back runs on another core than the one that takes it next. Each line of such a slot is then in
//! the other core's cache, and the taker stalls on each in turn when it writes it: a cross-core
//! transfer, for every line, on every submission. A submitter that knows which slot it takes next
//! asks for its lines one submission ahead, and the driver calls in between hide the transfers.
//! On the H200's host this took bench case 1's mean from 1.22x-1.26x of the raw driver to
//! 1.18x-1.21x on one queue (`docs/benchmarks.md`).

/// Asks the CPU to bring every cache line that `*slot` touches to this core, ready to be written,
/// and returns at once. A hint only: it never faults and changes nothing, whatever `slot` points
/// at (dangling or null included), and does nothing on architectures other than x86-64.
#[inline(always)]
#[allow(unsafe_code)]
pub fn for_write<T>(slot: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        let size = std::mem::size_of::<T>();
        // From the line the slot starts in (a slot need not be aligned to a line) to its end.
        let into_line = slot.addr() % 64;
        let first = slot.cast::<u8>().wrapping_sub(into_line);
        let end = into_line + size;
        let mut offset = 0;
        while offset < end {
            // SAFETY: `prefetchw` never faults, whatever the address, and changes no memory
            // (`readonly`), no register and no flag (its operand is only read); the address is
            // never dereferenced (`wrapping_add`). x86-64 CPUs that do not report PRFCHW run
            // its opcode (0F 0D) as a no-op.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) first.wrapping_add(offset),
                    options(nostack, preserves_flags, readonly)
                );
            }
            offset += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// [`for_write`] for the `T` stored right after `last`: the slot a ring or a vector writes
/// next, if `last` is its last element and it has room. Where it wraps or is full that is memory
/// of no use, or no memory at all: the hint is then wasted, nothing more.
#[inline(always)]
pub fn after<T>(last: &T) {
    for_write(std::ptr::from_ref(last).wrapping_add(1));
}

#[cfg(test)]
mod tests {
    use super::{after, for_write};

    /// The hint runs on memory of any kind and changes none of it.
    #[test]
    fn a_prefetch_changes_nothing_and_never_faults() {
        let slots = [[7u8; 200]; 3];
        for_write(&slots[1]);
        after(&slots[2]);
        assert!(slots.iter().all(|slot| slot.iter().all(|b| *b == 7)));
        // Null, dangling, unmapped and the top of the address space: no fault.
        for address in [0usize, 8, 0x1000, usize::MAX - 4096, usize::MAX & !63] {
            for_write(address as *const [u8; 256]);
        }
        for_write(std::ptr::NonNull::<u64>::dangling().as_ptr());
    }
}
