//! Cache-line prefetches for recycled storage: the crate's only unsafe code, one hint instruction.
//! [`Recycled`](crate::Recycled) calls these itself; they are public for storage it does not hold.
//!
//! cuhal recycles what a submission writes (the scheduler's action slots, the device's completion
//! events, the rings that hand work to the completion thread), and the thread that gives a slot
//! back runs on another core than the one that takes it next. Each line of such a slot is then in
//! the other core's cache, and the taker stalls on each in turn when it writes it: a cross-core
//! transfer, for every line, on every submission. A submitter that knows which slot it takes next
//! asks for its lines one submission ahead, and the driver calls in between hide the transfers.
//! On the H200's host this took bench case 1's mean from 1.20x-1.26x of the raw driver to
//! 1.18x-1.21x on one queue, and from 1.18x-1.28x to 1.17x-1.23x across two
//! (`git show bd2a39e:docs/benchmarks.md`).

/// Asks the CPU to bring every cache line that `*slot` touches to this core, ready to be written,
/// and returns at once. A hint only: it never faults and changes nothing, whatever `slot` points
/// at (dangling or null included), and does nothing on architectures other than x86-64.
#[inline(always)]
pub fn for_write<T>(slot: *const T) {
    let size = std::mem::size_of::<T>();
    let bytes = slot.cast::<u8>();
    // Which of the three forms applies is known from the type alone, so the others compile away.
    if std::mem::align_of::<T>() >= 64 {
        // Starts a line: one hint per line, a constant count.
        let mut offset = 0;
        while offset < size {
            line(bytes.wrapping_add(offset));
            offset += 64;
        }
    } else if size <= 64 {
        // At most two lines: the first byte's and the last's (the same line twice costs a hint).
        line(bytes);
        line(bytes.wrapping_add(size.saturating_sub(1)));
    } else {
        // From the line the slot starts in to its end.
        let into_line = slot.addr() % 64;
        let first = bytes.wrapping_sub(into_line);
        let mut offset = 0;
        while offset < into_line + size {
            line(first.wrapping_add(offset));
            offset += 64;
        }
    }
}

/// `prefetchw` of the line that holds `address`.
#[inline(always)]
#[allow(unsafe_code)]
fn line(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetchw` never faults, whatever the address, and changes no memory
    // (`readonly`), no register and no flag (its operand is only read); the address is never
    // dereferenced (the callers make it with `wrapping_add`). x86-64 CPUs that do not report
    // PRFCHW run its opcode (0F 0D) as a no-op.
    unsafe {
        std::arch::asm!(
            "prefetchw [{0}]",
            in(reg) address,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::for_write;
    use crate::Storage;

    /// The hint runs on memory of any kind and changes none of it.
    #[test]
    fn a_prefetch_changes_nothing_and_never_faults() {
        let slots = VecDeque::from([[7u8; 200]; 3]);
        for_write(&slots[1]);
        for_write(slots.next_slot());
        for_write(VecDeque::<u8>::new().next_slot());
        assert!(slots.iter().all(|slot| slot.iter().all(|b| *b == 7)));
        // Null, dangling, unmapped and the top of the address space: no fault.
        for address in [0usize, 8, 0x1000, usize::MAX - 4096, usize::MAX & !63] {
            for_write(address as *const [u8; 256]);
        }
        for_write(std::ptr::NonNull::<u64>::dangling().as_ptr());
        // Each form: a type aligned to lines, a small one, a large unaligned one.
        #[repr(align(64))]
        struct Lines([u8; 130]);
        let lines = Lines([3; 130]);
        for_write(&lines);
        for_write(&lines.0[1]);
        for_write(&lines.0[129]);
        assert!(lines.0.iter().all(|b| *b == 3));
        for address in [0usize, usize::MAX & !63] {
            for_write(address as *const Lines);
            for_write(address as *const u32);
        }
    }
}
