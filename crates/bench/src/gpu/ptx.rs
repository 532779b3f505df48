//! The benchmark's kernels, as hand-written PTX that the driver compiles at load time (no CUDA
//! toolkit at build time). Each runs as one thread (grid 1, block 1): the benchmarks time the
//! machinery around a launch, not the kernel.
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

/// The module text.
pub const MODULE: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry empty()
{
	ret;
}

.visible .entry step(
	.param .u64 step_counter,
	.param .u64 step_errors,
	.param .u32 step_index,
	.param .u32 step_period
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<7>;
	.reg .b64 %rd<5>;

	ld.param.u64 %rd1, [step_counter];
	cvta.to.global.u64 %rd2, %rd1;
	ld.volatile.global.u32 %r1, [%rd2];
	ld.param.u32 %r2, [step_period];
	rem.u32 %r3, %r1, %r2;
	ld.param.u32 %r4, [step_index];
	setp.eq.u32 %p1, %r3, %r4;
	@%p1 bra STEP_IN_ORDER;
	ld.param.u64 %rd3, [step_errors];
	cvta.to.global.u64 %rd4, %rd3;
	atom.global.add.u32 %r5, [%rd4], 1;
STEP_IN_ORDER:
	add.u32 %r6, %r1, 1;
	st.volatile.global.u32 [%rd2], %r6;
	ret;
}

.visible .entry spin(
	.param .u64 spin_ns,
	.param .u64 spin_record,
	.param .u64 spin_flag,
	.param .u64 spin_jitter
)
{
	.reg .pred %p<4>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<19>;

	ld.param.u64 %rd1, [spin_ns];
	mov.u64 %rd2, %globaltimer;
SPIN_LOOP:
	mov.u64 %rd3, %globaltimer;
	sub.u64 %rd4, %rd3, %rd2;
	setp.lt.u64 %p1, %rd4, %rd1;
	@%p1 bra SPIN_LOOP;
	ld.param.u64 %rd5, [spin_record];
	cvta.to.global.u64 %rd6, %rd5;
	ld.volatile.global.u64 %rd7, [%rd6];
	add.u64 %rd8, %rd7, 1;
	ld.param.u64 %rd11, [spin_jitter];
	setp.eq.u64 %p2, %rd11, 0;
	@%p2 bra SPIN_STAMP;
	mul.lo.u64 %rd12, %rd8, 2654435761;
	and.b64 %rd13, %rd12, 4294967295;
	mul.lo.u64 %rd14, %rd13, %rd11;
	shr.u64 %rd15, %rd14, 32;
	mov.u64 %rd16, %clock64;
SPIN_JITTER:
	mov.u64 %rd17, %clock64;
	sub.u64 %rd18, %rd17, %rd16;
	setp.lt.u64 %p3, %rd18, %rd15;
	@%p3 bra SPIN_JITTER;
	mov.u64 %rd3, %globaltimer;
SPIN_STAMP:
	st.volatile.global.u64 [%rd6], %rd8;
	st.global.u64 [%rd6+8], %rd2;
	st.global.u64 [%rd6+16], %rd3;
	ld.param.u64 %rd9, [spin_flag];
	setp.eq.u64 %p1, %rd9, 0;
	@%p1 bra SPIN_DONE;
	cvta.to.global.u64 %rd10, %rd9;
	cvt.u32.u64 %r1, %rd8;
	membar.sys;
	st.volatile.global.u32 [%rd10], %r1;
SPIN_DONE:
	ret;
}

.visible .entry timer_probe(
	.param .u64 probe_out,
	.param .u32 probe_iters
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<3>;
	.reg .b64 %rd<10>;

	ld.param.u32 %r1, [probe_iters];
	mov.u64 %rd1, %globaltimer;
	mov.u64 %rd2, %rd1;
	mov.u64 %rd3, 1000000000;
	mov.u64 %rd4, 0;
	mov.u32 %r2, 0;
PROBE_LOOP:
	mov.u64 %rd5, %globaltimer;
	sub.u64 %rd6, %rd5, %rd2;
	setp.eq.u64 %p1, %rd6, 0;
	@%p1 bra PROBE_NEXT;
	min.u64 %rd3, %rd3, %rd6;
	add.u64 %rd4, %rd4, 1;
	mov.u64 %rd2, %rd5;
PROBE_NEXT:
	add.u32 %r2, %r2, 1;
	setp.lt.u32 %p2, %r2, %r1;
	@%p2 bra PROBE_LOOP;
	ld.param.u64 %rd7, [probe_out];
	cvta.to.global.u64 %rd8, %rd7;
	st.global.u64 [%rd8], %rd3;
	st.global.u64 [%rd8+8], %rd4;
	sub.u64 %rd9, %rd2, %rd1;
	st.global.u64 [%rd8+16], %rd9;
	ret;
}
"#;

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
