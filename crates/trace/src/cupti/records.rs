//! Activity records as cuhal reads them.

use super::ffi::{
    self, CUpti_Activity, KernelRecordPrefix, MemcpyRecordPrefix, MemsetRecordPrefix,
};

/// What kind of GPU work a record times.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// A kernel (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL` or `_KERNEL`).
    Kernel,
    /// A copy (`CUPTI_ACTIVITY_KIND_MEMCPY`).
    Memcpy,
    /// A fill (`CUPTI_ACTIVITY_KIND_MEMSET`).
    Memset,
}

/// One GPU operation, exactly timed by CUPTI.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Activity {
    /// Kernel, copy or fill.
    pub kind: ActivityKind,
    /// Start on CUPTI's clock, in nanoseconds.
    pub start: u64,
    /// End on CUPTI's clock, in nanoseconds.
    pub end: u64,
    /// The correlation id of the API call that issued it (`cuGraphLaunch` for graph nodes).
    pub correlation_id: u32,
    /// The executable graph's node that ran it, 0 outside graphs.
    pub graph_node_id: u64,
    /// The node cuhal added that `graph_node_id` was cloned from (when the graph was
    /// instantiated); `graph_node_id` itself when no clone is known, 0 outside graphs. Filled in
    /// by the session as it parses the record.
    pub node_id: u64,
    /// The graph, 0 outside graphs.
    pub graph_id: u32,
    /// CUPTI's id of the stream it ran on.
    pub stream_id: u32,
    /// The device.
    pub device_id: u32,
}

/// Reads the record at `record`, or `None` for a kind cuhal does not trace.
///
/// # Safety
/// `record` must point to a whole activity record handed out by `cuptiActivityGetNextRecord`
/// (or built the same way), valid for reads of the prefix of its kind.
pub unsafe fn parse(record: *const CUpti_Activity) -> Option<Activity> {
    // SAFETY: every record starts with its kind (the caller's contract).
    let kind = unsafe { std::ptr::read_unaligned(record) }.kind;
    match kind {
        ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL | ffi::CUPTI_ACTIVITY_KIND_KERNEL => {
            // SAFETY: a kernel record holds at least this prefix (the caller's contract).
            let k = unsafe { std::ptr::read_unaligned(record.cast::<KernelRecordPrefix>()) };
            Some(Activity {
                kind: ActivityKind::Kernel,
                start: k.start,
                end: k.end,
                correlation_id: k.correlationId,
                graph_node_id: k.graphNodeId,
                node_id: k.graphNodeId,
                graph_id: k.graphId,
                stream_id: k.streamId,
                device_id: k.deviceId,
            })
        }
        ffi::CUPTI_ACTIVITY_KIND_MEMCPY => {
            // SAFETY: as above, for a memcpy record.
            let m = unsafe { std::ptr::read_unaligned(record.cast::<MemcpyRecordPrefix>()) };
            Some(Activity {
                kind: ActivityKind::Memcpy,
                start: m.start,
                end: m.end,
                correlation_id: m.correlationId,
                graph_node_id: m.graphNodeId,
                node_id: m.graphNodeId,
                graph_id: m.graphId,
                stream_id: m.streamId,
                device_id: m.deviceId,
            })
        }
        ffi::CUPTI_ACTIVITY_KIND_MEMSET => {
            // SAFETY: as above, for a memset record.
            let m = unsafe { std::ptr::read_unaligned(record.cast::<MemsetRecordPrefix>()) };
            Some(Activity {
                kind: ActivityKind::Memset,
                start: m.start,
                end: m.end,
                correlation_id: m.correlationId,
                graph_node_id: m.graphNodeId,
                node_id: m.graphNodeId,
                graph_id: m.graphId,
                stream_id: m.streamId,
                device_id: m.deviceId,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_memcpy_and_memset_records_are_read_at_their_offsets() {
        let k = KernelRecordPrefix {
            kind: ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
            start: 1_000,
            end: 3_500,
            correlationId: 77,
            graphNodeId: 0x1_0000_0005,
            graphId: 9,
            streamId: 13,
            deviceId: 1,
            ..Default::default()
        };
        // SAFETY: a whole kernel prefix.
        let a = unsafe { parse((&raw const k).cast()) }.unwrap();
        assert_eq!(
            a,
            Activity {
                kind: ActivityKind::Kernel,
                start: 1_000,
                end: 3_500,
                correlation_id: 77,
                graph_node_id: 0x1_0000_0005,
                node_id: 0x1_0000_0005,
                graph_id: 9,
                stream_id: 13,
                device_id: 1,
            }
        );
        let m = MemcpyRecordPrefix {
            kind: ffi::CUPTI_ACTIVITY_KIND_MEMCPY,
            start: 5,
            end: 6,
            correlationId: 8,
            graphNodeId: 4,
            ..Default::default()
        };
        // SAFETY: a whole memcpy prefix.
        let a = unsafe { parse((&raw const m).cast()) }.unwrap();
        assert_eq!(
            (a.kind, a.start, a.end, a.correlation_id, a.graph_node_id),
            (ActivityKind::Memcpy, 5, 6, 8, 4)
        );
        let s = MemsetRecordPrefix {
            kind: ffi::CUPTI_ACTIVITY_KIND_MEMSET,
            start: 50,
            end: 60,
            correlationId: 80,
            ..Default::default()
        };
        // SAFETY: a whole memset prefix.
        let a = unsafe { parse((&raw const s).cast()) }.unwrap();
        assert_eq!(
            (a.kind, a.start, a.end, a.correlation_id),
            (ActivityKind::Memset, 50, 60, 80)
        );
    }

    #[test]
    fn other_kinds_are_skipped() {
        let other = CUpti_Activity { kind: 5 };
        // SAFETY: a header-only record of a kind that is not parsed further.
        assert_eq!(unsafe { parse(&raw const other) }, None);
    }
}
