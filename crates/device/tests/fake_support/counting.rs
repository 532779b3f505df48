//! A global allocator that counts allocations while switched on. The `*_alloc` tests install it
//! with `#[global_allocator]` (one per test binary) and count a steady-state phase between
//! [`CountingAlloc::start`] and [`CountingAlloc::stop`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The system allocator, counting `alloc` and `realloc` calls while switched on.
pub struct CountingAlloc {
    counting: AtomicBool,
    allocations: AtomicU64,
}

impl CountingAlloc {
    /// Switched off, nothing counted.
    pub const fn new() -> Self {
        Self {
            counting: AtomicBool::new(false),
            allocations: AtomicU64::new(0),
        }
    }

    /// Counts from zero from now on.
    pub fn start(&self) {
        self.allocations.store(0, Ordering::Relaxed);
        self.counting.store(true, Ordering::Relaxed);
    }

    /// Stops counting; the allocations since [`CountingAlloc::start`].
    pub fn stop(&self) -> u64 {
        self.counting.store(false, Ordering::Relaxed);
        self.allocations.load(Ordering::Relaxed)
    }

    fn note(&self) {
        if self.counting.load(Ordering::Relaxed) {
            self.allocations.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through it).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
