//! CPU tests of the shared recorder: state machine, validation, deferred encoding and zones.
//! Deferred command buffers record without a GPU, so they exercise the front end every kind
//! shares.

use std::sync::{Arc, Mutex};

use cuhal_sys::{CUevent, CUevent_st};

use crate::deferred::Op;
use crate::stream_ops::LaunchShape;
use crate::zone_hooks::CommandZone;
use crate::*;

fn raw(base: u64, capacity: usize) -> BufferRange {
    // SAFETY: these ranges are only recorded, never replayed on a device.
    unsafe { BufferRange::from_raw(base, capacity) }
}

fn ops(cb: &DeferredExec) -> Vec<Op> {
    cb.parts().0.ops.clone()
}

/// The ops recorded so far, before `end()`.
fn recording_ops(cb: &DeferredCommandBuffer) -> Vec<Op> {
    cb.recorder()
        .encoder()
        .map(|e| e.ops.clone())
        .unwrap_or_default()
}

#[test]
fn recording_after_end_is_a_state_error() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    let r = raw(0x1000, 64);
    cb.fill(&r, FillPattern::U8(1)).unwrap();
    let ended_cb = cb.end().unwrap();
    assert_eq!(cb.state(), CommandBufferState::Ended);
    let ended = |operation| Error::InvalidState {
        operation,
        state: CommandBufferState::Ended,
    };
    assert_eq!(cb.fill(&r, FillPattern::U8(1)), Err(ended("fill")));
    assert_eq!(cb.update(&r.sub(0, 1).unwrap(), &[1]), Err(ended("update")));
    assert_eq!(
        cb.copy(&r.sub(0, 8).unwrap(), &r.sub(8, 8).unwrap()),
        Err(ended("copy"))
    );
    assert_eq!(cb.barrier(), Err(ended("barrier")));
    assert_eq!(cb.begin_debug_group("g"), Err(ended("begin a debug group")));
    assert_eq!(cb.end_debug_group(), Err(ended("end a debug group")));
    assert_eq!(cb.end().err(), Some(ended("end")));
    let text = cb.end().err().unwrap().to_string();
    assert!(
        text.contains("cannot end") && text.contains("ended"),
        "{text}"
    );
    assert_eq!(ended_cb.command_count(), 1, "nothing recorded after end");
    assert_eq!(
        cb.command_count(),
        0,
        "the recording moved into the ended buffer"
    );
}

#[test]
fn an_ended_empty_buffer_replays_without_a_driver() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    cb.barrier().unwrap();
    let cb = cb.end().unwrap();
    // No commands: no driver call, no context needed.
    // SAFETY: with no commands the stream is never used.
    unsafe {
        cb.issue(std::ptr::null_mut()).unwrap();
        cb.issue(std::ptr::null_mut()).unwrap();
    }
}

#[test]
fn raw_ranges_without_a_context_cannot_replay() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    cb.fill(&raw(0x1000, 4), FillPattern::U8(0)).unwrap();
    let cb = cb.end().unwrap();
    // SAFETY: the missing context is found before any stream is used.
    let result = unsafe { cb.replay(std::ptr::null_mut()) };
    assert_eq!(result, Err(Error::NoContext));
}

#[test]
fn rejected_commands_record_nothing_and_keep_recording() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    let r = raw(0x1000, 64);
    assert_eq!(
        cb.fill(&r.sub(1, 8).unwrap(), FillPattern::U32(5)),
        Err(Error::Misaligned {
            what: "fill offset",
            value: 1,
            alignment: 4
        })
    );
    assert_eq!(
        cb.fill(&r.sub(2, 3).unwrap(), FillPattern::U16(5)),
        Err(Error::Misaligned {
            what: "fill length",
            value: 3,
            alignment: 2
        })
    );
    assert_eq!(
        cb.fill(&r.sub(3, 0).unwrap(), FillPattern::U8(5)),
        Err(Error::ZeroSize { what: "fill" })
    );
    assert_eq!(
        cb.update(&r.sub(0, 4).unwrap(), &[1, 2, 3]),
        Err(Error::LengthMismatch {
            what: "update",
            target: 4,
            source: 3
        })
    );
    assert_eq!(
        cb.update(&r.sub(0, 0).unwrap(), &[]),
        Err(Error::ZeroSize { what: "update" })
    );
    assert_eq!(
        cb.copy(&r.sub(0, 16).unwrap(), &r.sub(8, 16).unwrap()),
        Err(Error::OverlappingCopy {
            source: 0x1000,
            target: 0x1008,
            length: 16
        })
    );
    assert_eq!(
        cb.copy(&r.sub(0, 8).unwrap(), &r.sub(8, 16).unwrap()),
        Err(Error::LengthMismatch {
            what: "copy",
            target: 16,
            source: 8
        })
    );
    assert_eq!(cb.command_count(), 0);
    assert_eq!(cb.arena_bytes(), 0);
    assert_eq!(cb.state(), CommandBufferState::Recording);
    cb.fill(&r.sub(3, 5).unwrap(), FillPattern::U8(5)).unwrap();
    let cb = cb.end().unwrap();
    assert_eq!(cb.command_count(), 1);
}

#[test]
fn debug_groups_must_balance() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    assert_eq!(cb.end_debug_group(), Err(Error::NoOpenDebugGroup));
    cb.begin_debug_group("outer").unwrap();
    cb.begin_debug_group("inner").unwrap();
    cb.end_debug_group().unwrap();
    assert_eq!(cb.end().err(), Some(Error::UnclosedDebugGroups { open: 1 }));
    assert_eq!(cb.state(), CommandBufferState::Recording);
    cb.end_debug_group().unwrap();
    cb.end().unwrap();
}

#[test]
fn deferred_arena_encodes_each_command_compactly() {
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    let a = raw(0x10_0000, 256);
    let b = raw(0x20_0000, 256);
    cb.fill(&a.sub(3, 5).unwrap(), FillPattern::U8(0xab))
        .unwrap();
    cb.barrier().unwrap();
    cb.update(&a.sub(100, 3).unwrap(), &[7, 8, 9]).unwrap();
    cb.update(&b.sub(0, 2).unwrap(), &[1, 2]).unwrap();
    cb.copy(&a.sub(0, 64).unwrap(), &b.sub(64, 64).unwrap())
        .unwrap();
    cb.fill(&b.sub(8, 8).unwrap(), FillPattern::U32(0xdead_beef))
        .unwrap();
    let cb = cb.end().unwrap();
    assert_eq!(
        ops(&cb),
        [
            Op::Fill {
                target: 0x10_0003,
                length: 5,
                pattern: FillPattern::U8(0xab)
            },
            Op::Update {
                target: 0x10_0064,
                offset: 0,
                length: 3
            },
            Op::Update {
                target: 0x20_0000,
                offset: 3,
                length: 2
            },
            Op::Copy {
                source: 0x10_0000,
                target: 0x20_0040,
                length: 64
            },
            Op::Fill {
                target: 0x20_0008,
                length: 8,
                pattern: FillPattern::U32(0xdead_beef)
            },
        ]
    );
    assert_eq!(cb.parts().0.bytes.as_slice(), &[7, 8, 9, 1, 2]);
    // Small and copyable: a replay walks a flat array.
    assert!(size_of::<Op>() <= 64, "{}", size_of::<Op>());
}

#[test]
fn deferred_dispatch_arguments_are_frozen_in_the_arena() {
    use crate::encoder::Encoder;
    let mut enc = crate::deferred::DeferredEncoder::default();
    enc.update(
        crate::binding::Operand::Address(0x1000),
        &[1, 2, 3],
        CommandZone::default(),
    )
    .unwrap();
    let shape = LaunchShape {
        grid: [4, 1, 1],
        block: [64, 1, 1],
        shared_memory: 0,
    };
    let first = KernelArgs::new().with(0xaaaa_u64).with(3u8).with(7u32);
    let second = KernelArgs::new().with(2.5f32).with(0x55u64);
    let none = KernelArgs::new();
    let f = std::ptr::null_mut();
    enc.encode_dispatch(
        f,
        shape,
        LaunchAttributes::default(),
        &first,
        CommandZone::default(),
    )
    .unwrap();
    enc.encode_dispatch(
        f,
        shape,
        LaunchAttributes::default(),
        &none,
        CommandZone::default(),
    )
    .unwrap();
    enc.encode_dispatch(
        f,
        shape,
        LaunchAttributes::default(),
        &second,
        CommandZone::default(),
    )
    .unwrap();
    enc.end().unwrap();
    let dispatches: Vec<(u32, u32)> = enc
        .ops
        .iter()
        .filter_map(|op| match *op {
            Op::Dispatch {
                first_arg, args, ..
            } => Some((first_arg, args)),
            _ => None,
        })
        .collect();
    assert_eq!(dispatches, [(0, 3), (3, 0), (3, 2)]);
    assert!(enc.pointers(3, 0).is_null());
    let p = enc.pointers(0, 3);
    let q = enc.pointers(3, 2);
    // SAFETY: the pointers point into the encoder's frozen arena, at values of these types,
    // aligned as the builder aligned them.
    unsafe {
        assert_eq!(*(*p as *const u64), 0xaaaa);
        assert_eq!(*(*p.add(1) as *const u8), 3);
        assert_eq!(*(*p.add(2) as *const u32), 7);
        assert_eq!(*(*q as *const f32), 2.5);
        assert_eq!(*(*q.add(1) as *const u64), 0x55);
        for i in 0..3 {
            let ptr = *p.add(i) as usize;
            assert_eq!(ptr % [8, 1, 4][i], 0, "argument {i} aligned");
        }
        assert_eq!(*q.add(1) as usize % 8, 0);
    }
    // The update bytes are still where the Update op says.
    assert_eq!(&enc.bytes.as_slice()[..3], &[1, 2, 3]);
}

#[test]
fn fill_patterns_from_bytes() {
    assert_eq!(FillPattern::from_bytes(&[9]), Ok(FillPattern::U8(9)));
    assert_eq!(
        FillPattern::from_bytes(&[1, 2]),
        Ok(FillPattern::U16(u16::from_ne_bytes([1, 2])))
    );
    assert_eq!(
        FillPattern::from_bytes(&[1, 2, 3, 4]).map(FillPattern::value),
        Ok(u32::from_ne_bytes([1, 2, 3, 4]))
    );
    assert_eq!(
        FillPattern::from_bytes(&[1, 2, 3]),
        Err(Error::BadPattern { length: 3 })
    );
    assert_eq!(
        FillPattern::from_bytes(&[]),
        Err(Error::BadPattern { length: 0 })
    );
}

/// A zone recorder that hands out numbered fake events and logs every call.
struct FakeZones {
    verbosity: Verbosity,
    log: Mutex<Vec<String>>,
    next: Mutex<usize>,
    /// Every n-th begin returns None (a full pool); 0 for never.
    drop_every: usize,
}

impl FakeZones {
    fn new(verbosity: Verbosity) -> Arc<Self> {
        Arc::new(Self {
            verbosity,
            log: Mutex::new(Vec::new()),
            next: Mutex::new(0),
            drop_every: 0,
        })
    }

    fn event(&self) -> CUevent {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        std::ptr::without_provenance_mut::<CUevent_st>(*next)
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

// SAFETY: the made-up handles reach no driver: these tests record into deferred buffers and
// replay them only onto the recording fake.
unsafe impl ZoneRecorder for FakeZones {
    fn verbosity(&self) -> Verbosity {
        self.verbosity
    }
    fn begin_zone(&self, name: &str) -> Option<CUevent> {
        let mut log = self.log.lock().unwrap();
        log.push(format!("begin {name}"));
        let begins = log.iter().filter(|l| l.starts_with("begin")).count();
        drop(log);
        if self.drop_every > 0 && begins % self.drop_every == 0 {
            None
        } else {
            Some(self.event())
        }
    }
    fn end_zone(&self) -> Option<CUevent> {
        self.log.lock().unwrap().push("end".into());
        Some(self.event())
    }
}

fn record_sample(cb: &mut DeferredCommandBuffer) -> DeferredExec {
    let r = raw(0x1000, 64);
    cb.begin_debug_group("setup").unwrap();
    cb.fill(&r.sub(0, 8).unwrap(), FillPattern::U8(1)).unwrap();
    cb.update(&r.sub(8, 2).unwrap(), &[1, 2]).unwrap();
    cb.end_debug_group().unwrap();
    cb.barrier().unwrap();
    cb.copy(&r.sub(0, 16).unwrap(), &r.sub(32, 16).unwrap())
        .unwrap();
    cb.end().unwrap()
}

fn shape(ops: &[Op]) -> String {
    ops.iter()
        .map(|op| match op {
            Op::Event(_) => 'E',
            Op::Fill { .. } => 'F',
            Op::Update { .. } => 'U',
            Op::Copy { .. } => 'C',
            Op::Dispatch { .. } => 'D',
            Op::StreamWork(_) => 'W',
            Op::Indirect(_) => 'I',
        })
        .collect()
}

#[test]
fn without_a_recorder_there_are_no_zones() {
    let cb = record_sample(&mut DeferredCommandBuffer::new(None).unwrap());
    assert_eq!(shape(&ops(&cb)), "FUC");
    assert!(cb.zones().is_none());
}

#[test]
fn verbosity_off_never_calls_the_recorder() {
    let zones = FakeZones::new(Verbosity::Off);
    let cb = record_sample(&mut DeferredCommandBuffer::new(Some(zones.clone())).unwrap());
    assert_eq!(shape(&ops(&cb)), "FUC");
    assert!(zones.log().is_empty());
    assert!(cb.zones().is_some());
}

#[test]
fn coarse_zones_cover_debug_groups_and_not_the_whole_buffer() {
    // The whole buffer's zone comes from the submission (the queue's completion event), so a
    // deferred or graph command buffer records no event of its own for it.
    let zones = FakeZones::new(Verbosity::Coarse);
    let cb = record_sample(&mut DeferredCommandBuffer::new(Some(zones.clone())).unwrap());
    assert_eq!(zones.log(), ["begin setup", "end"]);
    assert_eq!(shape(&ops(&cb)), "EFUEC");
}

#[test]
fn fine_zones_also_wrap_every_command() {
    let zones = FakeZones::new(Verbosity::Fine);
    let cb = record_sample(&mut DeferredCommandBuffer::new(Some(zones.clone())).unwrap());
    assert_eq!(
        zones.log(),
        [
            "begin setup",
            "begin fill",
            "end",
            "begin update",
            "end",
            "end",
            "begin copy",
            "end",
        ]
    );
    assert_eq!(shape(&ops(&cb)), "EEFEEUEEECE");
    // Events are recorded in the order the recorder handed them out.
    let events: Vec<usize> = ops(&cb)
        .iter()
        .filter_map(|op| match op {
            Op::Event(e) => Some(e.addr()),
            _ => None,
        })
        .collect();
    assert_eq!(events, (1..=8).collect::<Vec<_>>());
}

#[test]
fn dropped_zones_stay_balanced_and_record_no_event() {
    let zones = Arc::new(FakeZones {
        drop_every: 2,
        ..Arc::into_inner(FakeZones::new(Verbosity::Fine)).unwrap()
    });
    let cb = record_sample(&mut DeferredCommandBuffer::new(Some(zones.clone())).unwrap());
    let log = zones.log();
    let begins = log.iter().filter(|l| l.starts_with("begin")).count();
    let ends = log.iter().filter(|l| *l == "end").count();
    assert_eq!((begins, ends), (4, 4));
    // Begins 2 and 4 ("fill" and "copy") were dropped: no begin event before either.
    assert_eq!(shape(&ops(&cb)), "EFEEUEECE");
}

#[test]
fn rejected_commands_open_no_zone() {
    let zones = FakeZones::new(Verbosity::Fine);
    let mut cb = DeferredCommandBuffer::new(Some(zones.clone())).unwrap();
    let r = raw(0x1000, 64);
    assert!(cb.fill(&r.sub(1, 4).unwrap(), FillPattern::U32(0)).is_err());
    assert!(zones.log().is_empty(), "{:?}", zones.log());
}

#[test]
fn command_buffers_are_send_sync_and_object_safe() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GraphCommandBuffer>();
    send_sync::<StreamCommandBuffer>();
    send_sync::<DeferredCommandBuffer>();
    send_sync::<Buffer>();
    send_sync::<HostBuffer>();
    send_sync::<Function>();
    send_sync::<Executable>();
    send_sync::<Error>();
    send_sync::<GraphExec>();
    send_sync::<DeferredExec>();
    let mut cb: Box<dyn CommandEncoder> = Box::new(DeferredCommandBuffer::new(None).unwrap());
    assert_eq!(cb.kind(), CommandBufferKind::Deferred);
    cb.barrier().unwrap();
    let shared: Arc<dyn CommandBuffer> = cb.end().unwrap();
    assert_eq!(shared.kind(), CommandBufferKind::Deferred);
    assert_eq!(cb.state(), CommandBufferState::Ended);
}

#[test]
fn retained_resources_are_deduplicated_at_end() {
    // Raw ranges retain nothing; the bookkeeping is exercised through the recorder directly.
    let cb = record_sample(&mut DeferredCommandBuffer::new(None).unwrap());
    assert_eq!(cb.parts().1.retained.counts(), (0, 0));
}

#[test]
fn deferred_stream_work_is_kept_checked_and_retained() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
        seen.lock().unwrap().push(on.ranges().to_vec());
        Ok(())
    });
    let mut cb = DeferredCommandBuffer::new(None).unwrap();
    let r = raw(0x1000, 64);
    cb.fill(&r.sub(0, 8).unwrap(), FillPattern::U8(1)).unwrap();
    cb.stream_work(
        &[r.sub(8, 16).unwrap(), r.sub(32, 8).unwrap()],
        Arc::clone(&work),
    )
    .unwrap();
    cb.barrier().unwrap();
    cb.stream_work(&[], Arc::clone(&work)).unwrap();
    assert_eq!(shape(&recording_ops(&cb)), "FWW");
    // Recording calls nothing: the closure runs at replay.
    assert!(calls.lock().unwrap().is_empty());
    // The command buffer holds the closure for each command (retained, and in the replay list),
    // plus the caller's handle.
    assert_eq!(Arc::strong_count(&work), 1 + 2 * 2);
    let ended = cb.end().unwrap();
    assert_eq!(
        cb.stream_work(&[], Arc::clone(&work)),
        Err(Error::InvalidState {
            operation: "stream work",
            state: CommandBufferState::Ended
        })
    );
    drop(cb);
    assert_eq!(
        Arc::strong_count(&work),
        1 + 2 * 2,
        "the ended command buffer holds the closures"
    );
    drop(ended);
    assert_eq!(
        Arc::strong_count(&work),
        1,
        "released with the command buffer"
    );
}
