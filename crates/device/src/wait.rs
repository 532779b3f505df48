//! Host waits on several semaphores at once, blocking or as a future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use cuhal_semaphore::{Timeout, WaitAll, WaitAny};

use crate::Semaphore;
use crate::error::Result;
use crate::event_pool::CudaEvent;

/// Whether a multi-wait needs every semaphore or any one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Every `(semaphore, value)` must be reached.
    All,
    /// One is enough.
    Any,
}

/// Blocks until the semaphores reach their values (all or any), one fails (its failure is the
/// error), or the timeout passes (`Error::Semaphore(Timeout)`). Returns the index of a reached
/// entry (0 in `All` mode).
pub fn wait_semaphores(
    mode: WaitMode,
    list: &[(&Semaphore, u64)],
    timeout: impl Into<Timeout>,
) -> Result<usize> {
    Ok(match mode {
        WaitMode::All => cuhal_semaphore::wait_all(list, timeout).map(|()| 0)?,
        WaitMode::Any => cuhal_semaphore::wait_any(list, timeout)?,
    })
}

/// The async form of [`wait_semaphores`], for any executor: a future that resolves with the
/// index of a reached entry (0 in `All` mode) or the failure of a semaphore in the list
/// (`Error::Semaphore(Failed)`, the same error the blocking wait returns; a lost device fails
/// every semaphore with its failure). It has no timeout: use the executor's, dropping the
/// future unregisters it. It holds handles to the semaphores (it is `'static`).
///
/// A pending future is woken by whichever thread advances a semaphore it waits on: a queue's
/// completion side for device work, which learns that somebody waits and retires that work
/// promptly instead of at its gathering pace. No thread waits on the future's behalf. One
/// semaphore: [`Semaphore::wait_async`](cuhal_semaphore::Semaphore::wait_async).
pub fn wait_semaphores_async(mode: WaitMode, list: &[(&Semaphore, u64)]) -> WaitSemaphores {
    WaitSemaphores(match mode {
        WaitMode::All => Inner::All(cuhal_semaphore::wait_all_async(list)),
        WaitMode::Any => Inner::Any(cuhal_semaphore::wait_any_async(list)),
    })
}

/// The future [`wait_semaphores_async`] returns.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct WaitSemaphores(Inner);

#[derive(Debug)]
enum Inner {
    All(WaitAll<CudaEvent>),
    Any(WaitAny<CudaEvent>),
}

impl Future for WaitSemaphores {
    type Output = Result<usize>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::All(wait) => Pin::new(wait).poll(cx).map(|r| Ok(r.map(|()| 0)?)),
            Inner::Any(wait) => Pin::new(wait).poll(cx).map(|r| Ok(r?)),
        }
    }
}
