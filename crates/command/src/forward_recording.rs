//! The `forward_recording!` macro: implements [`CommandRecorder`](crate::CommandRecorder) for a
//! command buffer type by forwarding each method to the [`Recorder`](crate::recorder::Recorder)
//! it holds. The graph, deferred and stream command buffers invoke it.

/// Implements [`CommandRecorder`] for a command buffer type by forwarding every method to its
/// `recorder: Recorder<_>` field, where validation, state and tracing live for all three kinds.
macro_rules! forward_recording {
    ($ty:ty) => {
        impl $crate::CommandRecorder for $ty {
            fn state(&self) -> $crate::CommandBufferState {
                self.recorder.state()
            }
            fn fill(
                &mut self,
                target: &$crate::BufferRange,
                pattern: $crate::FillPattern,
            ) -> Result<(), $crate::Error> {
                self.recorder.fill(target, pattern)
            }
            fn update(
                &mut self,
                target: &$crate::BufferRange,
                data: &[u8],
            ) -> Result<(), $crate::Error> {
                self.recorder.update(target, data)
            }
            fn copy(
                &mut self,
                source: &$crate::BufferRange,
                target: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.copy(source, target)
            }
            fn copy_peer(
                &mut self,
                source: &$crate::BufferRange,
                target: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.copy_peer(source, target)
            }
            fn dispatch(&mut self, dispatch: &$crate::Dispatch<'_>) -> Result<(), $crate::Error> {
                self.recorder.dispatch(dispatch)
            }
            fn dispatch_indirect(
                &mut self,
                dispatch: &$crate::Dispatch<'_>,
                counts: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.dispatch_indirect(dispatch, counts)
            }
            fn barrier(&mut self) -> Result<(), $crate::Error> {
                self.recorder.barrier()
            }
            fn stream_work(
                &mut self,
                ranges: &[$crate::BufferRange],
                work: ::std::sync::Arc<$crate::StreamWorkFn>,
            ) -> Result<(), $crate::Error> {
                self.recorder.stream_work(ranges, work)
            }
            fn begin_debug_group(&mut self, name: &str) -> Result<(), $crate::Error> {
                self.recorder.begin_debug_group(name)
            }
            fn end_debug_group(&mut self) -> Result<(), $crate::Error> {
                self.recorder.end_debug_group()
            }
        }
    };
}
pub(crate) use forward_recording;
