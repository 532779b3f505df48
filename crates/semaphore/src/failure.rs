//! [`Failure`]: the shareable error that fails semaphores and everything ordered by them.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// A cloneable, shareable error that fails semaphores and actions.
///
/// A failure is created once, where it happens (a device error, a failed action), and then travels by
/// cheap clones to every semaphore and waiter it reaches. The first failure of a semaphore wins and is
/// kept; [`Failure::ptr_eq`] tells whether two failures are the same original one, and
/// [`Failure::downcast_ref`] recovers the concrete error type.
#[derive(Clone)]
pub struct Failure(Arc<dyn StdError + Send + Sync + 'static>);

/// The error behind [`Failure::msg`].
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

impl Failure {
    /// Wraps an error.
    pub fn new<E: StdError + Send + Sync + 'static>(error: E) -> Self {
        Failure(Arc::new(error))
    }

    /// A failure that is just a message.
    pub fn msg(text: impl Into<String>) -> Self {
        Failure::new(Message(text.into()))
    }

    /// The wrapped error as `E`, if it is one.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        let inner: &(dyn StdError + 'static) = &*self.0;
        inner.downcast_ref::<E>()
    }

    /// Whether `self` and `other` are clones of the same original failure.
    pub fn ptr_eq(&self, other: &Failure) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The wrapped error.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Failure").field(&self.0).finish()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}
