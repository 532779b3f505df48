//! Writes a small Chrome/Perfetto trace (open it in ui.perfetto.dev).
//!
//! `cargo run -p cuhal-trace --example trace_json [PATH]` (default `cuhal-trace.json`).
//! With a CUDA GPU it times real work (memsets on a stream, in nested zones); without one it
//! plays the same zones on the fake device. Either way the zones go through the whole pipeline:
//! event pool, zone list, collection after completion, and a JSON sink next to a memory sink.

use std::sync::Arc;

use cuhal_sys::{CU_STREAM_NON_BLOCKING, DriverApi, PrimaryContext, Stream, cu};
use cuhal_trace::fake::FakeGpu;
use cuhal_trace::{
    CpuZone, Fanout, JsonSink, MemorySink, Sink, TraceConfig, TraceContext, Verbosity,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "cuhal-trace.json".to_owned());
    let json = Arc::new(JsonSink::create(&path)?);
    let memory = Arc::new(MemorySink::new());
    let sink: Arc<dyn Sink> = Arc::new(Fanout::new(vec![json.clone(), memory.clone()]));

    let gpu = DriverApi::load().and_then(|api| PrimaryContext::retain(Arc::new(api), 0));
    match gpu {
        Ok(context) => on_gpu(&context, &sink)?,
        Err(e) => {
            println!("no GPU ({e}); playing zones on the fake device");
            on_fake(&sink)?;
        }
    }
    json.finish()?;
    for z in memory.zones() {
        println!(
            "{:indent$}{}: {:.3} us",
            "",
            z.name,
            z.duration_ns() as f64 / 1e3,
            indent = 2 * z.depth
        );
    }
    println!("wrote {path}");
    Ok(())
}

/// Three frames of nested zones on the fake device.
fn on_fake(sink: &Arc<dyn Sink>) -> Result<(), Box<dyn std::error::Error>> {
    let gpu = FakeGpu::new();
    let trace = TraceContext::with_backend(
        gpu.clone(),
        TraceConfig::new(Verbosity::Fine, "fake GPU queue 0"),
        sink.clone(),
    )?;
    for frame in 0..3u64 {
        let _cpu = CpuZone::new(sink.as_ref(), "record and submit");
        let list = trace.zone_list().expect("tracing is on");
        let t0 = gpu.now() + 10_000;
        let stamp = |event: Option<cuhal_sys::CUevent>, at: u64| {
            if let Some(e) = event {
                gpu.complete_at(e, t0 + at);
            }
        };
        stamp(list.begin_zone("command buffer"), 0);
        stamp(list.begin_zone("fill"), 1_000);
        stamp(list.end_zone(), 21_000 + frame * 500);
        stamp(list.begin_zone("dispatch"), 22_000 + frame * 500);
        stamp(list.end_zone(), 95_000);
        stamp(list.end_zone(), 96_000);
        gpu.advance(200_000);
        if let Some(collect) = list.on_submit() {
            collect();
        }
    }
    Ok(())
}

/// Three submissions of two memsets each, timed on a real stream.
fn on_gpu(
    context: &Arc<PrimaryContext>,
    sink: &Arc<dyn Sink>,
) -> Result<(), Box<dyn std::error::Error>> {
    let api = context.api();
    let trace = TraceContext::new(
        context.clone(),
        TraceConfig::new(Verbosity::Fine, "GPU 0 queue 0"),
        sink.clone(),
    )?;
    let owned_stream = Stream::new(context, CU_STREAM_NON_BLOCKING)?;
    let stream = owned_stream.raw();
    let bytes = 64 << 20;
    let buffer = cuhal_command::Buffer::new(context, bytes)?;
    let memory = buffer.device_ptr();
    for _ in 0..3 {
        let _cpu = CpuZone::new(sink.as_ref(), "record and submit");
        let list = trace.zone_list().expect("tracing is on");
        // SAFETY: `stream` and `memory` are live objects of the context for this whole loop.
        unsafe {
            list.begin_on_stream(stream, "submission")?;
            for (name, value) in [("memset 0x00", 0u8), ("memset 0xff", 0xff)] {
                list.begin_on_stream(stream, name)?;
                cu!(api, cuMemsetD8Async(memory, value, bytes, stream))?;
                list.end_on_stream(stream)?;
            }
            list.end_on_stream(stream)?;
        }
        let collect = list.on_submit();
        owned_stream.synchronize()?;
        // What the completion thread does once the submission completed.
        if let Some(collect) = collect {
            collect();
        }
    }
    Ok(())
}
