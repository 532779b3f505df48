//! [`DevicePtr`]: a typed device address, the `T*` argument of a kernel. Ranges hand one out
//! ([`BufferRange::ptr`](crate::BufferRange::ptr)); `kernel_args` makes it a kernel argument.
//! It depends on nothing else of the crate.

use std::marker::PhantomData;

/// The device address of a `T` array: a `T*` kernel parameter, eight bytes as the kernel ABI
/// passes pointers. The type says what the kernel reads there; [`DevicePtr::null`] is the
/// null pointer kernels take for an absent optional input (a bias, a mask).
///
/// A `DevicePtr` holds no reference to the memory: [`KernelArgs::push_range`](crate::KernelArgs::push_range) (which keeps the
/// buffer alive) or [`BufferRange::ptr`](crate::BufferRange::ptr) are how a buffer's address becomes an argument.
///
/// ```
/// # use cuhal_command::{DevicePtr, KernelArgs};
/// let bias = DevicePtr::<f32>::null();
/// assert!(bias.is_null());
/// let mut args = KernelArgs::new();
/// args.push(bias).push(16u32);
/// assert_eq!(args.slots()[0].size, 8);
/// assert_eq!(&args.bytes()[..8], &[0; 8]);
/// ```
#[repr(transparent)]
pub struct DevicePtr<T> {
    address: u64,
    // `fn() -> T`: no ownership of a `T`, and `Send`/`Sync` whatever `T` is (it is an address).
    points_to: PhantomData<fn() -> T>,
}

impl<T> DevicePtr<T> {
    /// The null pointer.
    pub const fn null() -> Self {
        Self::from_address(0)
    }

    /// The pointer at device address `address` (from another library, or an offset into a
    /// buffer the caller keeps alive).
    pub const fn from_address(address: u64) -> Self {
        Self {
            address,
            points_to: PhantomData,
        }
    }

    /// The device address.
    pub const fn address(self) -> u64 {
        self.address
    }

    /// Whether this is the null pointer.
    pub const fn is_null(self) -> bool {
        self.address == 0
    }
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}
impl<T> PartialEq for DevicePtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.address == other.address
    }
}
impl<T> Eq for DevicePtr<T> {}
impl<T> std::fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DevicePtr<{}>({:#x})",
            std::any::type_name::<T>(),
            self.address
        )
    }
}
