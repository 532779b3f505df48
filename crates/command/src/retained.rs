//! [`Retained`]: the buffers, functions and stream-work closures a recording refers to, kept
//! alive as long as the command buffer. The recorder adds to it as commands are recorded;
//! [`Recorded`](crate::recorded::Recorded) keeps it once recording ends.

use std::sync::Arc;

use crate::{Buffer, Function, StreamWorkFn};

/// Resources the recorded commands refer to, kept alive as long as the command buffer.
#[derive(Default)]
pub(crate) struct Retained {
    buffers: Vec<Arc<Buffer>>,
    functions: Vec<Function>,
    /// Stream-work closures: kept so the resources they hold outlive the recorded work.
    pub(crate) works: Vec<Arc<StreamWorkFn>>,
}

impl Retained {
    /// Every buffer the recorded commands use (each once after `end()`).
    pub(crate) fn buffers(&self) -> &[Arc<Buffer>] {
        &self.buffers
    }

    pub(crate) fn buffer(&mut self, buffer: &Arc<Buffer>) {
        if !self.buffers.last().is_some_and(|b| Arc::ptr_eq(b, buffer)) {
            self.buffers.push(Arc::clone(buffer));
        }
    }

    pub(crate) fn function(&mut self, function: &Function) {
        if !self.functions.last().is_some_and(|f| f.same(function)) {
            self.functions.push(function.clone());
        }
    }

    /// Drops duplicate references once recording is over.
    pub(crate) fn compact(&mut self) {
        self.buffers.sort_by_key(|b| Arc::as_ptr(b) as usize);
        self.buffers.dedup_by(|a, b| Arc::ptr_eq(a, b));
        self.functions.sort_by_key(Function::identity);
        self.functions.dedup_by(|a, b| a.same(b));
        self.buffers.shrink_to_fit();
        self.functions.shrink_to_fit();
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.buffers.len(), self.functions.len())
    }
}
