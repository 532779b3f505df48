//! The benchmark's kernels, as hand-written PTX (`kernels.ptx`) that the driver compiles at load
//! time (no CUDA toolkit at build time). Each runs as one thread (grid 1, block 1): the
//! benchmarks time the machinery around a launch, not the kernel.
//!
//! - `empty()`: nothing; the cost of a launch alone.
//! - `step(counter, errors, index, period)`: checks that `*counter % period == index` (every
//!   launch meant to precede it ran, in order), counts a violation in `*errors`, then increments
//!   `*counter`. A chain of `period` steps with indices `0..period` proves its dependencies held;
//!   `period == 1` just counts.
//! - `spin(ns, record, flag, jitter)`: spins on `%globaltimer` for `ns` nanoseconds, then (when
//!   `jitter` is not 0) for a further pseudo-random `0..jitter` SM cycles, then increments
//!   `record[0]` (a launch count), writes its start and end times to `record[1]` and
//!   `record[2]`, and, when `flag` is not 0, writes the low 32 bits of the new count to `*flag`
//!   (mapped host memory) after a system-wide fence: the host sees that store within a PCIe
//!   write of the kernel's end. `ns == 0` is a timestamp kernel.
//!
//!   Why the jitter: a timer spin ends just after a `%globaltimer` tick, so its end is always
//!   in phase with the timer. If the timer ticks coarsely (1 us on some GPUs), a gap measured
//!   from such an end is always rounded the same way, and no amount of averaging removes it.
//!   The extra cycles, drawn from the launch count by a multiplicative (Weyl) sequence so a
//!   recorded command buffer with fixed arguments gets fresh ones every launch, spread the end
//!   over many ticks; the mean of the measured gaps is then the true gap.
//! - `timer_probe(out, iters)`: reads `%globaltimer` `iters` times and writes the smallest
//!   non-zero step between reads to `out[0]`, the number of steps to `out[1]` and the time
//!   covered to `out[2]`: the timer's resolution, which bounds case 3's precision.
//!
//! `.target sm_80` with PTX ISA 7.0 is understood by every driver since CUDA 11.0 and compiles
//! for any newer GPU, the H200 (sm_90) included.

/// The module text (`kernels.ptx`).
pub const MODULE: &str = include_str!("kernels.ptx");

/// `step_stamped(counter, errors, index, period, zone)`: `step` timed by the zone-stamp ABI
/// (`step_stamped.cu`, built by nvcc into `step_stamped.ptx`; a null `zone` stamps nothing).
pub const STAMPED_MODULE: &str = include_str!("step_stamped.ptx");

/// The entry points [`MODULE`] defines.
#[cfg(test)]
pub const ENTRY_POINTS: [&str; 4] = ["empty", "step", "spin", "timer_probe"];

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers declared as `%name<N>` cover indices 0..N.
    fn declared(body: &str, prefix: &str) -> usize {
        let decl = format!("{prefix}<");
        body.lines()
            .find_map(|l| {
                let l = l.trim();
                let at = l.find(&decl)?;
                l.starts_with(".reg").then(|| {
                    l[at + decl.len()..]
                        .trim_end_matches(">;")
                        .parse::<usize>()
                        .unwrap()
                })
            })
            .unwrap_or(0)
    }

    /// Splits the module into (name, body) per entry.
    fn entries() -> Vec<(String, String)> {
        MODULE
            .split(".visible .entry ")
            .skip(1)
            .map(|chunk| {
                let name = chunk.split('(').next().unwrap().trim().to_owned();
                (name, chunk.to_owned())
            })
            .collect()
    }

    #[test]
    fn every_entry_point_is_defined_once() {
        let names: Vec<String> = entries().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ENTRY_POINTS.map(str::to_owned).to_vec());
    }

    #[test]
    fn registers_used_are_declared() {
        // A register index past its declaration is a load-time error on the GPU machine; catch
        // it here, where it is cheap.
        for (name, body) in entries() {
            for prefix in ["%rd", "%r", "%p"] {
                let limit = declared(&body, prefix);
                let mut rest = body.as_str();
                while let Some(at) = rest.find(prefix) {
                    let tail = &rest[at + prefix.len()..];
                    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
                    if let Ok(index) = digits.parse::<usize>() {
                        assert!(
                            index < limit,
                            "{name}: {prefix}{index} beyond {prefix}<{limit}>"
                        );
                    }
                    rest = tail;
                }
            }
        }
    }

    #[test]
    fn labels_are_unique_and_every_branch_has_its_label() {
        let mut labels = Vec::new();
        for line in MODULE.lines() {
            let l = line.trim();
            if let Some(label) = l.strip_suffix(':') {
                assert!(!labels.contains(&label), "label {label} defined twice");
                labels.push(label);
            }
        }
        for line in MODULE.lines() {
            if let Some(at) = line.find("bra ") {
                let target = line[at + 4..].trim().trim_end_matches(';');
                assert!(labels.contains(&target), "branch to undefined {target}");
            }
        }
    }

    #[test]
    fn parameters_loaded_are_declared() {
        for (name, body) in entries() {
            let mut rest = body.as_str();
            while let Some(at) = rest.find("ld.param.") {
                let tail = &rest[at..];
                let open = tail.find('[').unwrap();
                let close = tail.find(']').unwrap();
                let param = &tail[open + 1..close];
                assert!(
                    body.contains(&format!(".param .u64 {param}"))
                        || body.contains(&format!(".param .u32 {param}")),
                    "{name}: {param} is not a parameter"
                );
                rest = &tail[close..];
            }
        }
    }
}
