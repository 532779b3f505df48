//! No heap allocation per traced submission in steady state: a counting global allocator sees
//! zero allocations over hundreds of submissions after warm-up, untraced (the control), at
//! COARSE, and at FINE on timing events, on the fake CUPTI and with a zone-stamped dispatch
//! (its stamp region taken from the ring, read back, zeroed and given back), also in a command
//! buffer that names more binding slots than a table's inline room, each submission executed
//! and its zones collected on the completion side. The sink is a `NullSink` (sinks may allocate when they
//! write). Its own test binary without a harness, so nothing else allocates while it counts; the
//! fake driver is a separate library with its own allocator, so only cuhal's allocations count.

mod fake_support;

use std::sync::Arc;

use cuhal::{
    BufferRange, CommandBuffer, CuptiChoice, DeviceOptions, Dispatch, FillPattern, KernelArgs,
    Verbosity,
};
use cuhal_trace::NullSink;
use cuhal_trace::cupti::fake::FakeCupti;

#[global_allocator]
static GLOBAL: fake_support::counting::CountingAlloc = fake_support::counting::CountingAlloc::new();

const WARM: u64 = 200;
const COUNTED: u64 = 500;

/// Allocations made while `COUNTED` submissions of a graph command buffer (a debug group and a
/// fill, then a fill of each of `slots` binding slots, submitted with a table) ran on a queue
/// traced at `verbosity`, after `WARM` submissions.
fn allocations(
    tag: &str,
    verbosity: Verbosity,
    cupti: CuptiChoice,
    stamped: bool,
    slots: u32,
) -> (usize, u64) {
    let tag = tag.to_owned();
    let (_fake, _driver, device) = fake_support::open(
        &tag,
        DeviceOptions {
            tracing: verbosity,
            trace_sink: Some(Arc::new(NullSink)),
            cupti,
            ..DeviceOptions::default()
        },
    );
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer_with_bindings(slots).unwrap();
    cb.begin_debug_group("work").unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(3)).unwrap();
    for slot in 0..slots {
        cb.fill(
            &BufferRange::slot(slot, 0, 64).unwrap(),
            FillPattern::U32(slot),
        )
        .unwrap();
    }
    let stamp = stamped.then(|| fake_support::stamp::stamp_kernel(&device));
    if let Some(f) = &stamp {
        let args = KernelArgs::new().with_zone_stamp().with(10u64).with(20u64);
        cb.dispatch(&Dispatch::new(f, [1, 1, 1], [32, 1, 1], &args))
            .unwrap();
    }
    cb.end_debug_group().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    let table: Vec<BufferRange> = (0..slots)
        .map(|slot| buffer.range(64 * (slot as usize % 4), 64).unwrap())
        .collect();
    let submit = |n: u64| {
        if slots == 0 {
            queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
        } else {
            queue
                .execute_with_bindings(&[], &[(&done, n)], &[(&cb, &table[..])])
                .unwrap();
        }
    };
    // Each submission retired before the next: how far the completion side lags behind the
    // host (it naps when nobody waits on it) would otherwise decide how much storage the queue
    // and the tracer grow, which warm-up cannot bound on a loaded machine.
    for n in 1..=WARM {
        submit(n);
        fake_support::wait(&done, n);
        fake_support::settle(queue);
    }
    fake_support::settle(queue);
    let slots_before = queue.trace().map_or(0, |t| t.stats().submission_slots);
    GLOBAL.start();
    for n in WARM + 1..=WARM + COUNTED {
        submit(n);
        fake_support::wait(&done, n);
        fake_support::settle(queue);
    }
    fake_support::settle(queue);
    let counted = GLOBAL.stop() as usize;
    let collected = queue.trace().map_or(0, |t| t.stats().zones_collected);
    let slots_after = queue.trace().map_or(0, |t| t.stats().submission_slots);
    assert_eq!(
        slots_before, slots_after,
        "{tag}: submission slots are recycled"
    );
    drop(table);
    drop(cb);
    drop(device);
    (counted, collected)
}

fn main() {
    let cupti = FakeCupti::install();
    let cases = [
        ("untraced", Verbosity::Off, CuptiChoice::Off),
        ("coarse", Verbosity::Coarse, CuptiChoice::Off),
        ("fine-events", Verbosity::Fine, CuptiChoice::Off),
        ("fine-stamps", Verbosity::Fine, CuptiChoice::Off),
        ("fine-stamps-12-slots", Verbosity::Fine, CuptiChoice::Off),
        (
            "fine-cupti",
            Verbosity::Fine,
            CuptiChoice::Api {
                api: cupti.api(),
                required: true,
            },
        ),
    ];
    let mut failed = 0;
    let count = cases.len();
    for (tag, verbosity, choice) in cases {
        let stamped = tag.starts_with("fine-stamps");
        let slots = if tag == "fine-stamps-12-slots" { 12 } else { 0 };
        let (counted, collected) = allocations(
            &format!("trace-alloc-{tag}"),
            verbosity,
            choice,
            stamped,
            slots,
        );
        let traced = verbosity != Verbosity::Off;
        // Tracing must actually have collected zones while counting, or zero means nothing.
        let collecting = !traced || collected >= (WARM + COUNTED) * 2;
        println!(
            "{tag}: {counted} allocations over {COUNTED} submissions ({collected} zones collected)"
        );
        if counted != 0 || !collecting {
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!("{failed} case(s) allocated per submission or collected nothing");
        std::process::exit(1);
    }
    println!("test result: ok. {count} passed");
}
