//! A counting global allocator, so case 1 can report heap allocations per submission (the goal
//! is zero). A library cannot install a global allocator for its users, so the program that
//! runs the bench (the `cuhal` binary) installs [`Counting`]:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: cuhal_bench::alloc_count::Counting = cuhal_bench::alloc_count::Counting;
//! ```
//!
//! Case 1 checks that it is installed ([`is_counting`]) and fails otherwise, rather than report
//! zero allocations that nobody counted.
//!
//! It counts every allocation and reallocation of every thread of the process (the submitting
//! thread and cuhal's own threads alike) with one relaxed atomic add, and otherwise is the
//! system allocator. The count is process-wide on purpose: an allocation that a submission
//! causes on a completion thread is as much a cost of that submission as one on the caller's.
//! The driver's own `malloc` calls do not come through Rust's allocator and are not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counter
// is the only addition and does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

// The unit tests' own binary counts too.
#[cfg(test)]
#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (and reallocations) made by the whole process so far; 0 forever when [`Counting`]
/// is not the process's global allocator.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Whether [`Counting`] is the process's global allocator: one allocation must move the count.
pub fn is_counting() -> bool {
    let before = allocations();
    drop(std::hint::black_box(Box::new(std::hint::black_box(1u64))));
    allocations() > before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_allocations_and_growth() {
        // Other tests run in parallel threads, so only a lower bound is exact.
        let before = allocations();
        let mut v: Vec<u64> = Vec::with_capacity(1);
        v.push(1);
        std::hint::black_box(&v);
        v.reserve(1000);
        std::hint::black_box(&v);
        assert!(allocations() >= before + 2);
    }

    #[test]
    fn sees_that_it_is_installed() {
        assert!(is_counting());
    }
}
