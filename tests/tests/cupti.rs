//! GPU suite: FINE zones from CUPTI activity records.
//!
//! The zone-accuracy test: a spin kernel reads `%globaltimer` when it starts and when it stops
//! and writes both out, so every launch states its own duration. 10,000 such launches per
//! command-buffer kind (graph, deferred), over two queues, traced at FINE with CUPTI required;
//! each zone's duration must lie within 0.5 us of its kernel's own figure for 99% of zones.
//! The distribution of the differences is printed for the record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal::{
    CommandBufferMode, CuptiChoice, DeviceOptions, Dispatch, KernelArgs, MemorySink, Verbosity,
};
use cuhal_gpu_tests::device_support::{command_buffer, open_with, wait};
use cuhal_gpu_tests::trace_support::{SPIN_NAME, SPIN_PTX};
use cuhal_trace::{FineSource, MemoryZone};

const QUEUES: usize = 2;
const ROUNDS: u64 = 50;
const DISPATCHES: usize = 100;
/// Spin lengths cycle through 1, 1.5, ... 3 us.
const SPIN_NS: [u64; 5] = [1_000, 1_500, 2_000, 2_500, 3_000];
const TOLERANCE_NS: u64 = 500;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn zones_match_the_kernels_own_figures(mode: CommandBufferMode) {
    let sink = Arc::new(MemorySink::new());
    let device = open_with(DeviceOptions {
        queues: QUEUES,
        command_buffer_mode: mode,
        tracing: Verbosity::Fine,
        trace_sink: Some(sink.clone()),
        cupti: CuptiChoice::Required,
        ..DeviceOptions::default()
    });
    for q in 0..QUEUES {
        let stats = device.queue(q).trace().expect("tracing").stats();
        assert_eq!(stats.fine_source, FineSource::Cupti, "{stats:?}");
    }
    let executable = device.load_ptx(SPIN_PTX).unwrap();
    let spin = executable.function(SPIN_NAME).unwrap();
    let outs: Vec<_> = (0..QUEUES)
        .map(|_| device.create_buffer(DISPATCHES * 16).unwrap())
        .collect();
    let cbs: Vec<_> = (0..QUEUES)
        .map(|q| {
            command_buffer(device.queue(q), |cb| {
                for i in 0..DISPATCHES {
                    let slot = outs[q].range(i * 16, 16).unwrap();
                    let args = KernelArgs::new()
                        .with(SPIN_NS[i % SPIN_NS.len()])
                        .with_range(&slot);
                    cb.dispatch(&Dispatch::new(&spin, [1, 1, 1], [1, 1, 1], &args))
                        .unwrap();
                    cb.barrier().unwrap();
                }
            })
        })
        .collect();
    let done: Vec<_> = (0..QUEUES).map(|_| device.create_semaphore(0)).collect();
    let tracks: Vec<_> = (0..QUEUES)
        .map(|q| device.queue(q).trace().unwrap().track().unwrap())
        .collect();
    let mut differences = Vec::with_capacity(QUEUES * ROUNDS as usize * DISPATCHES);
    let mut kernel_ns = Vec::with_capacity(differences.capacity());
    for round in 1..=ROUNDS {
        sink.clear();
        for q in 0..QUEUES {
            device
                .queue(q)
                .execute(&[], &[(&done[q], round)], &[&cbs[q]])
                .unwrap();
        }
        for semaphore in &done {
            wait(semaphore, round);
        }
        // The records come after the work: collect until every zone of the round is in.
        let deadline = Instant::now() + Duration::from_secs(5);
        let spins = |zones: &[MemoryZone], q: usize| -> Vec<MemoryZone> {
            zones
                .iter()
                .filter(|z| z.track == tracks[q] && z.name == SPIN_NAME)
                .cloned()
                .collect()
        };
        let zones = loop {
            for q in 0..QUEUES {
                device.queue(q).trace().unwrap().collect();
            }
            let zones = sink.zones();
            if (0..QUEUES).all(|q| spins(&zones, q).len() == DISPATCHES) {
                break zones;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: zones missing ({:?})",
                device.queue(0).trace().unwrap().stats()
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        for (q, out) in outs.iter().enumerate() {
            let mut bytes = vec![0u8; DISPATCHES * 16];
            out.read(0, &mut bytes).unwrap();
            let words: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            for (i, zone) in spins(&zones, q).iter().enumerate() {
                let own = words[2 * i + 1] - words[2 * i];
                kernel_ns.push(own);
                differences.push(zone.duration_ns().abs_diff(own));
            }
        }
    }
    differences.sort_unstable();
    let within = differences.iter().filter(|&&d| d <= TOLERANCE_NS).count();
    let share = within as f64 / differences.len() as f64;
    kernel_ns.sort_unstable();
    println!(
        "{mode:?}: {} zones; |zone - kernel's own figure|: p50 {} ns, p90 {} ns, p99 {} ns, max {} ns; \
         within {TOLERANCE_NS} ns: {:.3}%; kernels' own figures p50 {} ns",
        differences.len(),
        percentile(&differences, 0.5),
        percentile(&differences, 0.9),
        percentile(&differences, 0.99),
        differences.last().copied().unwrap_or(0),
        share * 100.0,
        percentile(&kernel_ns, 0.5),
    );
    for q in 0..QUEUES {
        println!("queue {q}: {:?}", device.queue(q).trace().unwrap().stats());
    }
    assert_eq!(differences.len(), QUEUES * ROUNDS as usize * DISPATCHES);
    assert!(
        share >= 0.99,
        "{mode:?}: only {:.3}% of zones within {TOLERANCE_NS} ns of the kernel's own figure",
        share * 100.0
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn cupti_zones_match_spin_kernels_in_graphs() {
    zones_match_the_kernels_own_figures(CommandBufferMode::Graph);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn cupti_zones_match_spin_kernels_in_deferred_replays() {
    zones_match_the_kernels_own_figures(CommandBufferMode::Deferred);
}
