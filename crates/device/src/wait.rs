//! Host waits on several semaphores at once.

use cuhal_semaphore::Timeout;

use crate::Semaphore;
use crate::error::Result;

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
