//! FINE sampling of replays ([`FineSampling`]) through a queue's submission entry
//! ([`TraceContext::submit`]), on the fake GPU and the fake CUPTI: which replays get command
//! zones from records, what each kind of replay asks CUPTI and the backend, and what the
//! trace says of it.

use std::sync::Arc;

use cuhal_command::{CommandBuffer, DeferredCommandBuffer, EventPlacement};

use super::fake::FakeCupti;
use super::ffi::{self, cbid};
use crate::fake::FakeGpu;
use crate::{
    CuptiChoice, EventBackend, FineSample, FineSampling, IssueStep, MemorySink, StreamBefore,
    SubmissionInfo, TraceConfig, TraceContext, Verbosity,
};

/// The fake GPU's clock reads 1 ms; CUPTI's reads `CUPTI_AT_1MS` then.
const CUPTI_AT_1MS: u64 = 50_000_000_000;
const MS: u64 = 1_000_000;

fn to_cupti(trace_ns: u64) -> u64 {
    trace_ns - MS + CUPTI_AT_1MS
}

/// A context on a fresh fake GPU and memory sink at `verbosity`, timing commands by `fake`'s
/// records (required) with `sampling`.
fn traced(
    fake: &FakeCupti,
    verbosity: Verbosity,
    sampling: FineSampling,
) -> (Arc<FakeGpu>, Arc<MemorySink>, TraceContext) {
    fake.set_timestamp(Some(CUPTI_AT_1MS));
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    let config = TraceConfig {
        cupti: CuptiChoice::Api {
            api: fake.api(),
            required: true,
        },
        fine_sampling: sampling,
        ..TraceConfig::new(verbosity, "queue 0")
    };
    let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
    (gpu, sink, trace)
}

/// An executable (an ended deferred command buffer) whose zone list has one CUPTI-timed
/// command per name (none at COARSE).
fn executable(trace: &TraceContext, names: &[&str]) -> Arc<dyn CommandBuffer> {
    let recorder = trace.recorder().unwrap();
    for name in names {
        let timing = recorder.command_zone(name, EventPlacement::Stream);
        assert!(timing.by_activity, "{name} is timed by CUPTI");
    }
    let mut cb = DeferredCommandBuffer::new(Some(recorder)).unwrap();
    Arc::new(cb.end().unwrap())
}

/// One submission of `cbs` issued at `at` (trace clock) on this thread: each command buffer
/// `i` launches `commands[i]` kernels, each running 5 us, 10 us apart; the submission completes
/// at `at + 1 ms` and is collected as a queue's completion side collects it. Returns the
/// launches' correlation ids per command buffer.
fn replay(
    fake: &FakeCupti,
    gpu: &Arc<FakeGpu>,
    trace: &TraceContext,
    cbs: &[Arc<dyn CommandBuffer>],
    commands: &[usize],
    at: u64,
) -> Vec<Vec<u32>> {
    let stream = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    let info = SubmissionInfo::new([], []);
    let completion = gpu.create_event().unwrap();
    let mut ids = vec![Vec::new(); cbs.len()];
    // SAFETY: the fake backend made the completion event and it lives past the collection;
    // the stream is never used by the fake.
    let ticket = unsafe {
        trace.submit::<crate::Error>(
            stream,
            &info,
            cbs,
            StreamBefore::Traced,
            completion,
            |step| {
                match step {
                    IssueStep::CommandBuffer(i)
                    | IssueStep::StampedCommandBuffer { index: i, .. } => {
                        ids[i] = (0..commands[i])
                            .map(|_| fake.launch(cbid::LAUNCH_KERNEL))
                            .collect();
                    }
                    IssueStep::Completion => gpu.pend(completion),
                }
                Ok(())
            },
        )
    }
    .unwrap()
    .unwrap();
    // The kernels ran (records exist only for launches made while the kinds were enabled).
    for (b, launches) in ids.iter().enumerate() {
        for (j, &id) in launches.iter().enumerate() {
            let start = at + 100_000 * b as u64 + 10_000 * (j as u64 + 1);
            fake.complete_kernel(id, to_cupti(start), to_cupti(start + 5_000), 0);
        }
    }
    gpu.complete_at(completion, at + MS);
    trace.completed(ticket);
    trace.collect_completed();
    // SAFETY: made by this backend; its collection has returned.
    unsafe { gpu.destroy_event(completion) };
    ids
}

const KINDS: [u32; 3] = [
    ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    ffi::CUPTI_ACTIVITY_KIND_MEMCPY,
    ffi::CUPTI_ACTIVITY_KIND_MEMSET,
];

fn kinds_enabled(fake: &FakeCupti) -> bool {
    KINDS.iter().any(|&k| fake.kind_enabled(k))
}

/// With 1 in 4 over 12 replays of one executable, replays 0, 4 and 8 have their command zones
/// from CUPTI records, at the records' times; the others only the submission's and the command
/// buffer's zones, with nothing dropped. Each submission says which it was; the stats count
/// both. An unsampled replay asks CUPTI nothing at all and the backend no more than a COARSE
/// replay does; a sampled one enables and disables the three kinds around its issue and
/// flushes once, and the kinds are off between replays.
#[test]
fn one_in_four_samples_replays_0_4_8_and_the_rest_cost_what_coarse_costs() {
    let fake = FakeCupti::install();

    // The backend calls of one COARSE replay of an executable, for comparison.
    let coarse_calls = {
        let (gpu, _sink, trace) = traced(&fake, Verbosity::Coarse, FineSampling::Every);
        let cb = executable(&trace, &[]);
        replay(&fake, &gpu, &trace, std::slice::from_ref(&cb), &[2], 2 * MS);
        let before = gpu.calls();
        replay(&fake, &gpu, &trace, &[cb], &[2], 12 * MS);
        gpu.calls() - before
    };

    let (gpu, sink, trace) = traced(&fake, Verbosity::Fine, FineSampling::OneIn(4));
    assert!(!kinds_enabled(&fake), "sampling leaves the kinds off");
    let cb = executable(&trace, &["a", "b"]);
    let mut expected = Vec::new();
    for k in 0..12u64 {
        let at = (k + 2) * 10 * MS;
        let (cupti_before, enables, disables, flushes, backend) = (
            fake.total_calls(),
            fake.calls(crate::cupti_name!(cuptiActivityEnable)),
            fake.calls(crate::cupti_name!(cuptiActivityDisable)),
            fake.flushes(),
            gpu.calls(),
        );
        let ids = replay(&fake, &gpu, &trace, std::slice::from_ref(&cb), &[2], at);
        assert!(!kinds_enabled(&fake), "replay {k}: kinds left enabled");
        let sampled = k % 4 == 0;
        if sampled {
            assert_eq!(
                fake.calls(crate::cupti_name!(cuptiActivityEnable)) - enables,
                3,
                "replay {k}"
            );
            assert_eq!(
                fake.calls(crate::cupti_name!(cuptiActivityDisable)) - disables,
                3,
                "replay {k}"
            );
            assert_eq!(fake.flushes() - flushes, 1, "replay {k}: one flush");
            let first = at + 10_000;
            expected.push(("a".to_owned(), first, first + 5_000));
            expected.push(("b".to_owned(), first + 10_000, first + 15_000));
        } else {
            assert_eq!(
                fake.total_calls() - cupti_before,
                0,
                "replay {k}: an unsampled replay called CUPTI"
            );
            assert_eq!(
                gpu.calls() - backend,
                coarse_calls,
                "replay {k}: backend calls beyond COARSE's"
            );
        }
        assert_eq!(ids[0].len(), 2);
    }
    let zones = sink.zones();
    let commands: Vec<(String, u64, u64)> = zones
        .iter()
        .filter(|z| z.name == "a" || z.name == "b")
        .map(|z| (z.name.clone(), z.begin_ns, z.end_ns))
        .collect();
    assert_eq!(commands, expected, "command zones of replays 0, 4, 8 only");
    let count = |name: &str| zones.iter().filter(|z| z.name == name).count();
    assert_eq!(count("submission"), 12);
    assert_eq!(count("deferred command buffer"), 12);

    let samples: Vec<Option<FineSample>> =
        sink.submissions().iter().map(|s| s.fine_sample).collect();
    let want: Vec<Option<FineSample>> = (0..12u64)
        .map(|k| {
            Some(FineSample {
                sampled: k % 4 == 0,
                replay: k,
                one_in: 4,
            })
        })
        .collect();
    assert_eq!(samples, want);

    let stats = trace.stats();
    assert_eq!((stats.sampled_replays, stats.unsampled_replays), (3, 9));
    assert_eq!(stats.activity_zones, 6);
    assert_eq!(stats.dropped.total(), 0, "{:?}", stats.dropped);
    assert_eq!(stats.pending_submissions, 0);
}

/// Two executables count their replays apart: interleaved, with 1 in 3, each samples its own
/// replays 0 and 3, whatever the other did; in a submission of both, the submission is sampled
/// when either is.
#[test]
fn two_executables_keep_their_own_counters() {
    let fake = FakeCupti::install();
    let (gpu, sink, trace) = traced(&fake, Verbosity::Fine, FineSampling::OneIn(3));
    let x = executable(&trace, &["x"]);
    let y = executable(&trace, &["y1", "y2"]);
    let mut at = 20 * MS;
    let mut step = |cbs: &[Arc<dyn CommandBuffer>], commands: &[usize]| {
        replay(&fake, &gpu, &trace, cbs, commands, at);
        at += 10 * MS;
    };
    // x: replays 0, 1, 2; y: replay 0; x: 3; then both together: x 4 and y 1; y alone: 2, 3.
    for _ in 0..3 {
        step(std::slice::from_ref(&x), &[1]);
    }
    step(std::slice::from_ref(&y), &[2]);
    step(std::slice::from_ref(&x), &[1]);
    step(&[x.clone(), y.clone()], &[1, 2]);
    step(std::slice::from_ref(&y), &[2]);
    step(std::slice::from_ref(&y), &[2]);

    let zones = sink.zones();
    let count = |name: &str| zones.iter().filter(|z| z.name == name).count();
    assert_eq!(count("x"), 2, "x replays 0 and 3");
    assert_eq!((count("y1"), count("y2")), (2, 2), "y replays 0 and 3");
    let samples: Vec<(bool, u64)> = sink
        .submissions()
        .iter()
        .map(|s| {
            let f = s.fine_sample.unwrap();
            assert_eq!(f.one_in, 3);
            (f.sampled, f.replay)
        })
        .collect();
    assert_eq!(
        samples,
        [
            (true, 0),
            (false, 1),
            (false, 2),
            (true, 0),
            (true, 3),
            (false, 4),
            (false, 2),
            (true, 3),
        ]
    );
    let stats = trace.stats();
    assert_eq!((stats.sampled_replays, stats.unsampled_replays), (4, 5));
    assert_eq!(stats.dropped.total(), 0);
}

/// The default samples every replay exactly as before: the session's kinds are enabled when
/// the context is made and stay so (no enable or disable per replay), every replay gets its
/// command zones, and submissions carry no sampling detail.
#[test]
fn every_replay_is_the_default_and_toggles_nothing() {
    let fake = FakeCupti::install();
    assert_eq!(TraceConfig::default().fine_sampling, FineSampling::Every);
    let (gpu, sink, trace) = traced(&fake, Verbosity::Fine, FineSampling::default());
    assert!(KINDS.iter().all(|&k| fake.kind_enabled(k)));
    assert_eq!(fake.calls(crate::cupti_name!(cuptiActivityEnable)), 3);
    let cb = executable(&trace, &["a", "b"]);
    for k in 0..8u64 {
        replay(
            &fake,
            &gpu,
            &trace,
            std::slice::from_ref(&cb),
            &[2],
            (k + 2) * 10 * MS,
        );
    }
    assert_eq!(fake.calls(crate::cupti_name!(cuptiActivityEnable)), 3);
    assert_eq!(fake.calls(crate::cupti_name!(cuptiActivityDisable)), 0);
    assert!(KINDS.iter().all(|&k| fake.kind_enabled(k)));
    let zones = sink.zones();
    assert_eq!(zones.iter().filter(|z| z.name == "a").count(), 8);
    assert!(sink.submissions().iter().all(|s| s.fine_sample.is_none()));
    let stats = trace.stats();
    assert_eq!((stats.sampled_replays, stats.unsampled_replays), (0, 0));
    assert_eq!(stats.activity_zones, 16);
}

/// A sampling context that joins a live session whose user wants every launch leaves the
/// kinds enabled (that user's records must keep coming); a session started by a sampling
/// context enables them when an every-launch user joins, for good.
#[test]
fn sampling_and_every_launch_users_share_one_session() {
    let fake = FakeCupti::install();
    let (_gpu, _sink, sampling) = traced(&fake, Verbosity::Fine, FineSampling::OneIn(2));
    assert!(!kinds_enabled(&fake));
    let (_gpu2, _sink2, every) = traced(&fake, Verbosity::Fine, FineSampling::Every);
    assert!(KINDS.iter().all(|&k| fake.kind_enabled(k)));
    let session = super::CuptiSession::acquire_sampled_with(fake.api()).unwrap();
    let window = session.open_window().unwrap();
    drop(window);
    assert!(
        KINDS.iter().all(|&k| fake.kind_enabled(k)),
        "kept for every launch"
    );
    drop((session, every, sampling));
    assert!(!fake.subscribed());
}

/// The budget form measures what sampled and unsampled replays of an executable cost on the
/// GPU (their command buffer's zone) and moves its rate to keep the amortized overhead within
/// the budget: sampled replays twice as long, 10% allowed, gives 1 in 10.
#[test]
fn a_budget_sets_the_rate_from_the_replays_costs() {
    let fake = FakeCupti::install();
    let (gpu, sink, trace) = traced(
        &fake,
        Verbosity::Fine,
        FineSampling::Budget { max_overhead: 0.1 },
    );
    let cb = executable(&trace, &["a"]);
    let stream = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    for k in 0..40u64 {
        let at = (k + 2) * 10 * MS;
        let completion = gpu.create_event().unwrap();
        let mut sampled_issue = false;
        gpu.set_now(at);
        // SAFETY: as in `replay`.
        let ticket = unsafe {
            trace.submit::<crate::Error>(
                stream,
                &SubmissionInfo::new([], []),
                std::slice::from_ref(&cb),
                StreamBefore::Traced,
                completion,
                |step| {
                    if step == IssueStep::Completion {
                        gpu.pend(completion);
                    } else {
                        sampled_issue = kinds_enabled(&fake);
                        let id = fake.launch(cbid::LAUNCH_KERNEL);
                        fake.complete_kernel(id, to_cupti(at + 10), to_cupti(at + 20), 0);
                    }
                    Ok(())
                },
            )
        }
        .unwrap()
        .unwrap();
        // A sampled replay runs 2 ms, the others 1 ms.
        let cost = if sampled_issue { 2 * MS } else { MS };
        gpu.complete_at(completion, at + cost);
        trace.completed(ticket);
        trace.collect_completed();
        // SAFETY: made by this backend; its collection has returned.
        unsafe { gpu.destroy_event(completion) };
    }
    let rates: Vec<(bool, u64, u32)> = sink
        .submissions()
        .iter()
        .map(|s| s.fine_sample.unwrap())
        .map(|f| (f.sampled, f.replay, f.one_in))
        .collect();
    assert_eq!(rates[0], (true, 0, crate::BUDGET_FIRST_ONE_IN));
    // Replay 1 measured the unsampled cost: 1 in 10 from there, so replays 10, 20, 30.
    let sampled: Vec<u64> = rates.iter().filter(|r| r.0).map(|r| r.1).collect();
    assert_eq!(sampled, [0, 10, 20, 30]);
    assert!(rates[2..].iter().all(|r| r.2 == 10), "{rates:?}");
}

/// The JSON sink writes each submission's sampling in its zone's `args` (`sampled`, `replay`,
/// `one_in`) when FINE samples, and nothing of it otherwise.
#[test]
fn the_json_sink_writes_whether_a_replay_was_sampled() {
    let fake = FakeCupti::install();
    let run = |sampling: FineSampling| {
        fake.set_timestamp(Some(CUPTI_AT_1MS));
        let gpu = FakeGpu::new();
        let sink = Arc::new(crate::JsonSink::new(Vec::<u8>::new()).unwrap());
        let config = TraceConfig {
            cupti: CuptiChoice::Api {
                api: fake.api(),
                required: true,
            },
            fine_sampling: sampling,
            ..TraceConfig::new(Verbosity::Fine, "queue 0")
        };
        let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
        let cb = executable(&trace, &["a"]);
        for k in 0..3u64 {
            replay(
                &fake,
                &gpu,
                &trace,
                std::slice::from_ref(&cb),
                &[1],
                (k + 2) * 10 * MS,
            );
        }
        drop(trace);
        let bytes = sink.finish().unwrap().unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_slice::<serde_json::Value>(&bytes)
            .unwrap()
            .as_array()
            .unwrap()
            .clone();
        events
            .into_iter()
            .filter(|e| e.get("name").and_then(|n| n.as_str()) == Some("submission"))
            .filter_map(|e| e.get("args").cloned())
            .filter(|a| a.get("command_buffers").is_some())
            .collect::<Vec<_>>()
    };
    let sampled = run(FineSampling::OneIn(2));
    let got: Vec<(bool, u64, u64)> = sampled
        .iter()
        .map(|a| {
            (
                a["sampled"].as_bool().unwrap(),
                a["replay"].as_u64().unwrap(),
                a["one_in"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(true, 0, 2), (false, 1, 2), (true, 2, 2)],
        "{sampled:?}"
    );
    let every = run(FineSampling::Every);
    assert_eq!(every.len(), 3);
    for args in &every {
        assert!(args.get("sampled").is_none(), "{args}");
        assert!(args.get("one_in").is_none(), "{args}");
    }
}
