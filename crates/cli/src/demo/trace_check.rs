//! Reads the demo's Perfetto JSON back and checks that it shows what produced what: every traced
//! submission has a host `submit` zone on the submitting thread, a GPU `submission` zone with its
//! details in `args`, and one flow arrow from the first to the second.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

/// What the check found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceCheck {
    /// Submissions with a host zone, a GPU zone and an arrow between them.
    pub linked: usize,
    /// Of those, submissions whose GPU waited for another queue first (`device_wait_us`).
    pub device_waits: usize,
}

/// A `[semaphore, value]` list, as the sink writes waits and signals.
fn is_pairs(value: &Value) -> bool {
    value.as_array().is_some_and(|pairs| {
        pairs.iter().all(|p| {
            p.as_array()
                .is_some_and(|p| p.len() == 2 && p.iter().all(Value::is_u64))
        })
    })
}

/// Checks the trace at `path`, which must show exactly `submissions` traced submissions.
pub fn check_trace(path: &Path, submissions: usize) -> Result<TraceCheck> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the trace {}", path.display()))?;
    let events: Vec<Value> = serde_json::from_str(&text)
        .with_context(|| format!("the trace {} is not a JSON array", path.display()))?;
    let complete = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name)
            .collect()
    };
    let (host, gpu) = (complete("submit"), complete("submission"));
    ensure!(
        host.len() == submissions && gpu.len() == submissions,
        "expected {submissions} host and GPU submission zones, found {} and {}",
        host.len(),
        gpu.len()
    );
    let mut device_waits = 0;
    for zone in &gpu {
        let args = &zone["args"];
        ensure!(
            args["queue"].is_string()
                && args["ordinal"].is_u64()
                && is_pairs(&args["waits"])
                && is_pairs(&args["signals"])
                && args["command_buffers"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty()),
            "a submission zone lacks its details: {zone}"
        );
        if args.get("device_wait_us").is_some() {
            ensure!(
                args["waited_on"].as_array().is_some_and(|w| !w.is_empty()),
                "a device wait names no semaphore: {zone}"
            );
            device_waits += 1;
        }
    }
    // Arrow ends by id; each must start inside a host zone and end at a GPU zone's start.
    let mut starts: HashMap<u64, &Value> = HashMap::new();
    let mut linked = 0;
    for flow in events.iter().filter(|e| e["ph"] == "s") {
        let id = flow["id"].as_u64().context("a flow start without an id")?;
        if starts.insert(id, flow).is_some() {
            bail!("two flow arrows share id {id}");
        }
    }
    let ts = |e: &Value| e["ts"].as_f64().unwrap_or(f64::NAN);
    for end in events.iter().filter(|e| e["ph"] == "f") {
        let id = end["id"].as_u64().context("a flow end without an id")?;
        let start = starts
            .remove(&id)
            .with_context(|| format!("flow {id} ends without a start"))?;
        ensure!(
            gpu.iter()
                .any(|z| z["tid"] == end["tid"] && ts(z) == ts(end)),
            "flow {id} does not end at a GPU submission zone"
        );
        ensure!(
            host.iter().any(|z| z["tid"] == start["tid"]
                && ts(z) <= ts(start)
                && ts(start) <= ts(z) + z["dur"].as_f64().unwrap_or(0.0)),
            "flow {id} does not start in a host submit zone"
        );
        linked += 1;
    }
    ensure!(starts.is_empty(), "{} flow arrows never end", starts.len());
    ensure!(
        linked == submissions,
        "{linked} flow arrows for {submissions} submissions"
    );
    let labelled = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["label"].is_string())
        .count();
    ensure!(
        labelled >= submissions,
        "{labelled} labelled command buffer zones for {submissions} submissions"
    );
    Ok(TraceCheck {
        linked,
        device_waits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuhal_trace::{HostSpan, JsonSink, Sink, SubmissionDetails};

    fn write_trace(path: &Path, flows: bool) {
        let sink = JsonSink::create(path).unwrap();
        let track = sink.register_gpu_track("GPU 0 queue 1", 0).unwrap();
        let details = SubmissionDetails {
            queue: "GPU 0 queue 1",
            ordinal: 1,
            waits: &[(4, 1)],
            signals: &[(5, 1)],
            command_buffers: &["graph command buffer"],
            device_wait_ns: Some(3_000),
            host: HostSpan {
                thread: 1,
                thread_name: Some("main"),
                issuing_thread: 1,
                submitted_ns: 1_000,
                issue_begin_ns: 1_200,
                issue_end_ns: 4_000,
            },
            flow: 77,
            fine_sample: None,
        };
        if flows {
            sink.submission_begin(track, "submission", 10_000, &details);
        } else {
            sink.gpu_zone_begin(track, "submission", 10_000);
        }
        sink.command_buffer_begin(track, "graph command buffer", 13_000, 1, 0);
        sink.gpu_zone_end(track, 20_000);
        sink.gpu_zone_end(track, 20_000);
        sink.finish().unwrap();
    }

    #[test]
    fn a_linked_trace_passes_and_one_without_arrows_fails() {
        let dir = std::env::temp_dir().join(format!("cuhal-trace-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        write_trace(&good, true);
        assert_eq!(
            check_trace(&good, 1).unwrap(),
            TraceCheck {
                linked: 1,
                device_waits: 1
            }
        );
        assert!(check_trace(&good, 2).is_err(), "counts submissions");
        let bad = dir.join("bad.json");
        write_trace(&bad, false);
        let error = check_trace(&bad, 1).unwrap_err().to_string();
        assert!(error.contains("host and GPU"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
