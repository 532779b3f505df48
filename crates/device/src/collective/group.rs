//! One NCCL group around every local rank's call: `ncclGroupStart`, a call per rank,
//! `ncclGroupEnd`, written once.
//!
//! With several ranks on one thread, every rank's part of a collective (or every rank's
//! communicator init) must be made inside one group: one rank's call alone can block inside NCCL
//! for peers this thread has not called yet. The rules every group here follows:
//!
//! - the per-rank calls are made in rank order and stop at the first error;
//! - a started group is always ended, also after a failed call (NCCL requires it) and on an
//!   early return or unwinding (the guard's drop ends it);
//! - the first per-rank error is the group's error; the end's error counts only when every call
//!   succeeded.

use cuhal_sys::{NcclApi, NcclError, nccl};

/// An open NCCL group, ended by [`Group::end`] or, failing that, when dropped.
#[must_use = "a group is ended by `end`; dropping it ends it and loses the end's error"]
pub(super) struct Group<'a> {
    api: &'a NcclApi,
    open: bool,
}

impl<'a> Group<'a> {
    /// Starts a group (`ncclGroupStart`).
    pub(super) fn start(api: &'a NcclApi) -> Result<Self, NcclError> {
        // SAFETY: no arguments; the guard ends the group.
        unsafe { nccl!(api, ncclGroupStart()) }?;
        Ok(Self { api, open: true })
    }

    /// Calls `call` for each of `ranks` in order, stopping at the first error, which it returns.
    pub(super) fn each<T, E>(
        &self,
        ranks: impl IntoIterator<Item = T>,
        call: impl FnMut(T) -> Result<(), E>,
    ) -> Result<(), E> {
        ranks.into_iter().try_for_each(call)
    }

    /// Ends the group (`ncclGroupEnd`): `calls` (what [`Group::each`] returned) if it is an
    /// error, else the end's result.
    pub(super) fn end<E: From<NcclError>>(mut self, calls: Result<(), E>) -> Result<(), E> {
        let ended = self.close();
        calls?;
        Ok(ended?)
    }

    fn close(&mut self) -> Result<(), NcclError> {
        self.open = false;
        // SAFETY: ends the group `start` began, once (`open` was set).
        unsafe { nccl!(self.api, ncclGroupEnd()) }
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if self.open {
            // Nobody is left to report the end's error to: the group was abandoned by an early
            // return or a panic, whose own outcome stands.
            let _ = self.close();
        }
    }
}

/// One group: starts it, calls `call` for each of `ranks` in order (stopping at the first
/// error), and ends it, also after an error; the first error wins (see the module
/// documentation).
pub(super) fn group<T, E: From<NcclError>>(
    api: &NcclApi,
    ranks: impl IntoIterator<Item = T>,
    call: impl FnMut(T) -> Result<(), E>,
) -> Result<(), E> {
    let group = Group::start(api)?;
    let calls = group.each(ranks, call);
    group.end(calls)
}
