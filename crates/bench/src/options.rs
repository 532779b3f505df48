//! `cuhal bench [--quick] [--json PATH] [--case NAME...]`.

use std::path::PathBuf;

/// The benchmark cases, numbered as in docs/benchmarks.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Case {
    /// 1: host cost of one submission.
    Submit,
    /// 2: from a kernel's end to the host waiter's return.
    Wake,
    /// 3: GPU gap of a dependency across two queues.
    Dependency,
    /// 4: replay of a 100-dispatch command buffer.
    Replay,
    /// 5: submit one dispatch and wait for it.
    RoundTrip,
    /// 6: case 4 with tracing on.
    Tracing,
    /// 7: scheduler cost per action with many pending (CPU only).
    Scheduler,
    /// 8: a library call (cuBLAS SGEMM) as stream work in a command buffer.
    Library,
    /// 9: an alternating chain across two queues, released by one host signal.
    Chain,
    /// 10: from a host signal that releases a submission to a host waiter's return.
    Signal,
    /// 11: case 4 and case 5 with a new binding table every submission.
    Bindings,
    /// 12: GPU time per step of 100 dependent dispatches, with and without programmatic edges.
    Pdl,
    /// 13: all-reduce over two GPUs (queue operation, graph set, raw NCCL) and peer copies.
    Collectives,
    /// 14: case 1's submissions while another thread waits on the host for the newest.
    Waiter,
    /// 15: from a kernel's end to a task awaiting `wait_async` resuming.
    WaitAsync,
    /// 16: a Llama decoder's per-token time against the same graph on the raw driver.
    Decoder,
}

impl Case {
    /// Every case, in run order. Tracing runs after the other GPU cases: once CUPTI is loaded
    /// (its raw floor and FINE tracing load it), every later launch of the process costs more,
    /// even after its activity is disabled (on the H200, case 14's floor took 4.8 us a
    /// submission after case 6 against 2.4 to 3.3 us without it).
    pub const ALL: [Case; 16] = [
        Case::Submit,
        Case::Wake,
        Case::Dependency,
        Case::Replay,
        Case::RoundTrip,
        Case::Scheduler,
        Case::Library,
        Case::Chain,
        Case::Signal,
        Case::Bindings,
        Case::Pdl,
        Case::Collectives,
        Case::Waiter,
        Case::WaitAsync,
        Case::Decoder,
        Case::Tracing,
    ];

    /// The case's number as text.
    pub fn number(self) -> &'static str {
        match self {
            Case::Submit => "1",
            Case::Wake => "2",
            Case::Dependency => "3",
            Case::Replay => "4",
            Case::RoundTrip => "5",
            Case::Tracing => "6",
            Case::Scheduler => "7",
            Case::Library => "8",
            Case::Chain => "9",
            Case::Signal => "10",
            Case::Bindings => "11",
            Case::Pdl => "12",
            Case::Collectives => "13",
            Case::Waiter => "14",
            Case::WaitAsync => "15",
            Case::Decoder => "16",
        }
    }

    /// The name `--case` takes.
    pub fn name(self) -> &'static str {
        match self {
            Case::Submit => "submit",
            Case::Wake => "wake",
            Case::Dependency => "dependency",
            Case::Replay => "replay",
            Case::RoundTrip => "round-trip",
            Case::Tracing => "tracing",
            Case::Scheduler => "scheduler",
            Case::Library => "library",
            Case::Chain => "chain",
            Case::Signal => "signal",
            Case::Bindings => "bindings",
            Case::Pdl => "pdl",
            Case::Collectives => "collectives",
            Case::Waiter => "waiter",
            Case::WaitAsync => "wait-async",
            Case::Decoder => "decoder",
        }
    }

    /// Whether the case needs a GPU (all but the scheduler's).
    pub fn needs_gpu(self) -> bool {
        self != Case::Scheduler
    }

    /// The case named by `text`: its name or its number.
    pub fn parse(text: &str) -> Option<Case> {
        Case::ALL
            .into_iter()
            .find(|c| c.name() == text || c.number() == text)
    }
}

/// The default `--json` path.
pub const DEFAULT_JSON: &str = "cuhal-bench.json";

/// Parsed options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// About a tenth of the repetitions: a smoke run.
    pub quick: bool,
    /// Where the JSON goes.
    pub json: PathBuf,
    /// The cases to run, in run order, without repeats.
    pub cases: Vec<Case>,
    /// `--help` was given.
    pub help: bool,
}

/// The usage text.
pub fn usage() -> String {
    let names: Vec<&str> = Case::ALL.iter().map(|c| c.name()).collect();
    format!(
        "usage: cuhal bench [--quick] [--json PATH] [--case NAME...]\n\
         \n\
         Times cuhal against the raw CUDA driver in the same process and prints a markdown table.\n\
         \n\
         --quick        about a tenth of the repetitions (a smoke run)\n\
         --json PATH    where to write the results (default {DEFAULT_JSON})\n\
         --case NAME    run only these cases (names or numbers; repeat, or separate with commas):\n\
         \x20              {}",
        names.join(", ")
    )
}

/// Parses the arguments after `bench`.
pub fn parse(args: &[String]) -> Result<Options, String> {
    let mut quick = false;
    let mut json = None;
    let mut cases = Vec::new();
    let mut help = false;
    let mut it = args.iter().peekable();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => help = true,
            "--json" => match it.next() {
                Some(path) if !path.is_empty() => json = Some(PathBuf::from(path)),
                _ => return Err("--json needs a path".to_owned()),
            },
            "--case" => {
                let mut any = false;
                while let Some(next) = it.next_if(|a| !a.starts_with('-')) {
                    add_cases(&mut cases, next)?;
                    any = true;
                }
                if !any {
                    return Err("--case needs a name".to_owned());
                }
            }
            other => {
                if let Some(path) = other.strip_prefix("--json=") {
                    if path.is_empty() {
                        return Err("--json needs a path".to_owned());
                    }
                    json = Some(PathBuf::from(path));
                } else if let Some(names) = other.strip_prefix("--case=") {
                    add_cases(&mut cases, names)?;
                } else {
                    return Err(format!("unknown argument {other:?}"));
                }
            }
        }
    }
    if cases.is_empty() {
        cases = Case::ALL.to_vec();
    }
    // In run order (`Case::ALL`), not by number.
    cases.sort_by_key(|case| Case::ALL.iter().position(|c| c == case));
    cases.dedup();
    Ok(Options {
        quick,
        json: json.unwrap_or_else(|| PathBuf::from(DEFAULT_JSON)),
        cases,
        help,
    })
}

fn add_cases(cases: &mut Vec<Case>, list: &str) -> Result<(), String> {
    for name in list.split(',').filter(|n| !n.is_empty()) {
        let case = Case::parse(name).ok_or_else(|| {
            let names: Vec<&str> = Case::ALL.iter().map(|c| c.name()).collect();
            format!("unknown case {name:?} (cases: {})", names.join(", "))
        })?;
        cases.push(case);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn defaults_run_everything() {
        let o = parse(&[]).unwrap();
        assert!(!o.quick && !o.help);
        assert_eq!(o.json, PathBuf::from(DEFAULT_JSON));
        assert_eq!(o.cases, Case::ALL.to_vec());
    }

    #[test]
    fn cases_by_name_number_list_and_repeat() {
        let o = parse(&args(&[
            "--case",
            "replay",
            "1",
            "--quick",
            "--case=wake,7",
        ]))
        .unwrap();
        assert!(o.quick);
        assert_eq!(
            o.cases,
            vec![Case::Submit, Case::Wake, Case::Replay, Case::Scheduler]
        );
        let o = parse(&args(&["--case", "round-trip", "5"])).unwrap();
        assert_eq!(o.cases, vec![Case::RoundTrip]);
        let o = parse(&args(&["--case", "decoder", "--quick"])).unwrap();
        assert_eq!(o.cases, vec![Case::Decoder]);
        assert_eq!(Case::parse("16"), Some(Case::Decoder));
    }

    #[test]
    fn json_path_in_both_spellings() {
        assert_eq!(
            parse(&args(&["--json", "out/x.json"])).unwrap().json,
            PathBuf::from("out/x.json")
        );
        assert_eq!(
            parse(&args(&["--json=y.json"])).unwrap().json,
            PathBuf::from("y.json")
        );
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&args(&["--json"])).is_err());
        assert!(parse(&args(&["--json="])).is_err());
        assert!(parse(&args(&["--case"])).is_err());
        assert!(parse(&args(&["--case", "--quick"])).is_err());
        let e = parse(&args(&["--case", "warp"])).unwrap_err();
        assert!(e.contains("warp") && e.contains("round-trip"), "{e}");
        assert!(parse(&args(&["--fast"])).is_err());
        assert!(parse(&args(&["extra"])).is_err());
    }

    #[test]
    fn only_the_scheduler_case_runs_without_a_gpu() {
        for c in Case::ALL {
            assert_eq!(c.needs_gpu(), c != Case::Scheduler);
            assert_eq!(Case::parse(c.name()), Some(c));
            assert_eq!(Case::parse(c.number()), Some(c));
        }
        assert!(parse(&args(&["-h"])).unwrap().help);
        assert!(usage().contains("round-trip"));
    }
}
