//! How stream work fails: [`StreamWorkError`], what a closure returns, and [`WorkError`], the
//! shared form a command error carries (a closure's error or its caught panic). `stream_work`
//! calls the closures and makes these; `error` wraps them, so they depend on nothing else of
//! the crate.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// What a stream-work closure returns on failure: any error (a library's status, a driver
/// error).
pub type StreamWorkError = Box<dyn StdError + Send + Sync + 'static>;

/// An error a stream-work closure returned (or its panic), shared so command errors stay
/// `Clone`; two are equal when they are the same error.
#[derive(Clone)]
pub struct WorkError(pub Arc<dyn StdError + Send + Sync + 'static>);

impl WorkError {
    pub(crate) fn from_box(error: StreamWorkError) -> Self {
        Self(Arc::from(error))
    }

    pub(crate) fn panicked() -> Self {
        Self(Arc::new(Panicked))
    }
}

impl PartialEq for WorkError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for WorkError {}

impl fmt::Debug for WorkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for WorkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// The closure panicked (the panic was caught: it never unwinds through cuhal).
#[derive(Debug)]
struct Panicked;

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the stream-work closure panicked")
    }
}

impl StdError for Panicked {}
