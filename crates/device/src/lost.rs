//! Device loss, in one place.
//!
//! A sticky CUDA error (an illegal address, a trap, a launch failure) poisons the context: from
//! then on every driver call of the context fails. Whichever thread sees such an error first (a
//! submitting thread issuing work or recording a tracing zone, the completion thread querying an
//! event, a host waiter querying the event it waits on, a call that allocates or loads) hands the
//! device's error to [`Lost::note`], which creates the one [`DeviceLost`] failure of the device
//! there, loses every queue of the device with it, and returns it. Every semaphore, waiter and
//! later call then carries that same failure, whichever crate saw the error first.
//!
//! Stickiness is decided on the typed error ([`Error::cuda`] finds the driver's code through
//! every layer, tracing included), once, where the error is first seen: nothing downstream has
//! to guess it by downcasting failures.

use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use cuhal_semaphore::Failure;

use crate::error::Error;

/// The error a device is lost with: the sticky driver error that poisoned its context, where it
/// was first seen.
#[derive(Clone, Debug)]
pub struct DeviceLost {
    cuda: cuhal_sys::Error,
}

impl DeviceLost {
    /// The sticky driver error (the call and its `CUresult`).
    pub fn cuda(&self) -> &cuhal_sys::Error {
        &self.cuda
    }

    /// The sticky `CUresult`.
    pub fn result(&self) -> Option<cuhal_sys::CUresult> {
        self.cuda.result()
    }
}

impl fmt::Display for DeviceLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (a sticky error: the context is lost)", self.cuda)
    }
}

impl std::error::Error for DeviceLost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cuda)
    }
}

/// Loses one queue (registered by the queue when it starts).
type LoseQueue = Box<dyn Fn(&Failure) + Send + Sync>;

/// The device's lost state, shared by its queues, its event pool and the device itself.
#[derive(Default)]
pub(crate) struct Lost {
    failure: OnceLock<Failure>,
    queues: Mutex<Vec<LoseQueue>>,
}

impl Lost {
    /// The failure (holding a [`DeviceLost`]) that lost the device, if it is lost.
    pub(crate) fn get(&self) -> Option<&Failure> {
        self.failure.get()
    }

    /// `Err(Error::Lost)` once the device is lost: what every later call returns.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.failure.get() {
            Some(failure) => Err(Error::Lost(failure.clone())),
            None => Ok(()),
        }
    }

    /// Registers a queue to lose with the device (at once if it is already lost).
    pub(crate) fn add_queue(&self, lose: LoseQueue) {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(failure) = self.failure.get() {
            lose(failure);
        }
        queues.push(lose);
    }

    /// The failure to report for `error`: for a sticky driver error, the device's one
    /// [`DeviceLost`] failure (created now if this is the first, which also loses every queue);
    /// for any other error, a failure holding it.
    pub(crate) fn note(&self, error: Error) -> Failure {
        match self.lose_if_sticky(&error) {
            Some(failure) => failure,
            None => Failure::new(error),
        }
    }

    /// `error` as a call should return it: `Error::Lost` with the device's failure if it is a
    /// sticky driver error (losing the device if it is the first), else unchanged.
    pub(crate) fn filter(&self, error: Error) -> Error {
        match self.lose_if_sticky(&error) {
            Some(failure) => Error::Lost(failure),
            None => error,
        }
    }

    /// Loses the device if `error` holds a sticky driver error; returns the device's failure.
    fn lose_if_sticky(&self, error: &Error) -> Option<Failure> {
        if let Some(failure) = error.lost_failure() {
            // Already a loss (of this device or, through a shared semaphore, of another).
            return Some(failure.clone());
        }
        let cuda = error.cuda().filter(|e| e.is_sticky())?;
        let failure = Failure::new(DeviceLost { cuda: cuda.clone() });
        if self.failure.set(failure.clone()).is_ok() {
            let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            queues.iter().for_each(|lose| lose(&failure));
        }
        Some(self.failure.get().cloned().unwrap_or(failure))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuhal_sys::CUresult;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn cuda(call: &'static str, result: CUresult, name: &str) -> cuhal_sys::Error {
        cuhal_sys::Error::Cuda {
            call,
            result,
            name: name.into(),
            description: "described by the driver".into(),
        }
    }

    #[test]
    fn the_first_sticky_error_loses_the_device_once() {
        let lost = Lost::default();
        let losses = Arc::new(AtomicUsize::new(0));
        let counter = losses.clone();
        lost.add_queue(Box::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        let plain = Error::Driver(cuda(
            cuhal_sys::cu_name!(cuMemsetD32Async),
            CUresult::ERROR_INVALID_VALUE,
            "CUDA_ERROR_INVALID_VALUE",
        ));
        let failure = lost.note(plain);
        assert!(failure.downcast_ref::<Error>().is_some());
        assert!(
            lost.get().is_none(),
            "a plain error does not lose the device"
        );
        assert!(lost.check().is_ok());

        // A sticky error first seen by a tracing call, as the trace crate reports it.
        let sticky = cuda(
            cuhal_sys::cu_name!(cuEventRecord),
            CUresult::ERROR_ILLEGAL_ADDRESS,
            "CUDA_ERROR_ILLEGAL_ADDRESS",
        );
        let first = lost.note(Error::from(cuhal_trace::Error::Driver(sticky.clone())));
        let typed = first.downcast_ref::<DeviceLost>().expect("a DeviceLost");
        assert_eq!(typed.cuda(), &sticky);
        assert_eq!(typed.result(), Some(CUresult::ERROR_ILLEGAL_ADDRESS));
        assert!(lost.get().is_some_and(|f| f.ptr_eq(&first)));
        assert_eq!(losses.load(Ordering::Relaxed), 1);

        // A later sticky error, from anywhere, reports the device's failure.
        let later = lost.filter(Error::Driver(cuda(
            cuhal_sys::cu_name!(cuEventQuery),
            CUresult::ERROR_LAUNCH_FAILED,
            "CUDA_ERROR_LAUNCH_FAILED",
        )));
        assert!(later.failure().is_some_and(|f| f.ptr_eq(&first)));
        assert_eq!(later.cuda(), Some(&sticky));
        assert_eq!(losses.load(Ordering::Relaxed), 1, "lost once");
        // A queue registered after the loss is lost at once.
        let counter = losses.clone();
        lost.add_queue(Box::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(losses.load(Ordering::Relaxed), 2);
        assert!(matches!(lost.check(), Err(Error::Lost(f)) if f.ptr_eq(&first)));
    }
}
