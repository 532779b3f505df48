//! [`Resource`]: what an action keeps alive until it completes or fails.

use std::any::Any;
use std::sync::Arc;

use smallvec::SmallVec;

/// How many resources an action holds inline.
pub const INLINE_RESOURCES: usize = 4;

/// Anything an action keeps alive until it completes or fails (buffers, command buffers, a
/// tracing context). Cloning an `Arc` into the list allocates nothing.
pub type Resource = Arc<dyn Any + Send + Sync>;

/// The resources of one action.
pub type Resources = SmallVec<[Resource; INLINE_RESOURCES]>;
