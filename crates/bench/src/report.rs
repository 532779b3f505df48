//! The results: comparisons of cuhal with its floor, raw measurements, and their two renderings
//! (the markdown table printed at the end, the JSON file).

use std::fmt::Write as _;

use super::json::Value;
use super::stats::Summary;

/// What a row's numbers count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds, printed as microseconds.
    Nanos,
    /// A plain count (allocations per submission).
    Count,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Nanos => "ns",
            Unit::Count => "count",
        }
    }

    /// A value in this unit for a table cell.
    pub fn format(self, x: f64) -> String {
        match self {
            Unit::Nanos => format_ns(x),
            Unit::Count => format_count(x),
        }
    }
}

/// A duration in nanoseconds as microseconds (or milliseconds past 10 ms), with the decimals
/// that carry information at that size.
pub fn format_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "n/a".to_owned();
    }
    let us = ns / 1000.0;
    let a = us.abs();
    if a >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if a >= 100.0 {
        format!("{us:.0} us")
    } else if a >= 10.0 {
        format!("{us:.1} us")
    } else if a >= 1.0 {
        format!("{us:.2} us")
    } else {
        format!("{us:.3} us")
    }
}

/// A count, with enough decimals that a small non-zero rate (one allocation in 250
/// submissions) never prints as 0.
fn format_count(x: f64) -> String {
    if x == x.trunc() {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// The target a cuhal figure is held to, always on the medians.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// cuhal at most this many times the floor.
    RatioAtMost(f64),
    /// cuhal at most the floor plus this much (in the row's unit).
    AddedAtMost(f64),
    /// cuhal at most this much, whatever the floor.
    AtMost(f64),
    /// No target: reported for information.
    Report,
}

/// Whether a goal was met.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The goal holds.
    Met,
    /// The goal does not hold; the text says by how much.
    Missed(String),
    /// Not decidable: a side is missing, or the row has no goal.
    Unknown,
}

impl Goal {
    /// The goal as a table cell.
    pub fn describe(self, unit: Unit) -> String {
        match self {
            Goal::RatioAtMost(r) => format!("<= {r:.2}x floor"),
            Goal::AddedAtMost(a) => format!("<= floor + {}", unit.format(a)),
            Goal::AtMost(a) => format!("<= {}", unit.format(a)),
            Goal::Report => "-".to_owned(),
        }
    }

    /// Judges cuhal's median against the floor's median.
    pub fn judge(self, unit: Unit, cuhal: Option<f64>, floor: Option<f64>) -> Verdict {
        let Some(c) = cuhal else {
            return Verdict::Unknown;
        };
        match self {
            Goal::Report => Verdict::Unknown,
            Goal::AtMost(limit) => {
                if c <= limit {
                    Verdict::Met
                } else {
                    Verdict::Missed(format!("over by {}", unit.format(c - limit)))
                }
            }
            Goal::RatioAtMost(r) => match floor {
                Some(f) if f > 0.0 => {
                    let allowed = r * f;
                    if c <= allowed {
                        Verdict::Met
                    } else {
                        Verdict::Missed(format!(
                            "{:.2}x, {:.0}% over the goal",
                            c / f,
                            (c - allowed) / allowed * 100.0
                        ))
                    }
                }
                _ => Verdict::Unknown,
            },
            Goal::AddedAtMost(a) => match floor {
                Some(f) => {
                    let added = c - f;
                    if added <= a {
                        Verdict::Met
                    } else {
                        Verdict::Missed(format!(
                            "floor + {}, over by {}",
                            unit.format(added),
                            unit.format(added - a)
                        ))
                    }
                }
                None => Verdict::Unknown,
            },
        }
    }
}

impl Verdict {
    fn cell(&self) -> String {
        match self {
            Verdict::Met => "yes".to_owned(),
            Verdict::Missed(by) => format!("NO: {by}"),
            Verdict::Unknown => "n/a".to_owned(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Verdict::Met => Value::Bool(true),
            Verdict::Missed(_) => Value::Bool(false),
            Verdict::Unknown => Value::Null,
        }
    }
}

/// Which statistic a comparison is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Center {
    /// The median (the default: robust to outliers).
    Median,
    /// The mean: for GPU-timer gaps whose median is quantized by a coarse timer, where the
    /// mean of dithered samples is still exact. The table marks such cells `(mean)`.
    Mean,
    /// The 99th percentile: for goals on the tail. The table marks such cells `(p99)`.
    P99,
}

impl Center {
    /// The statistic from a summary.
    pub fn of(self, s: &Summary) -> f64 {
        match self {
            Center::Median => s.median,
            Center::Mean => s.mean,
            Center::P99 => s.p99,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Center::Median => "median",
            Center::Mean => "mean",
            Center::P99 => "p99",
        }
    }
}

/// One line of the main table: a cuhal figure beside the raw-driver floor measured in the same
/// process.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The case number ("1".."7").
    pub case: &'static str,
    /// What is measured.
    pub name: String,
    /// The unit of both sides.
    pub unit: Unit,
    /// cuhal's figure; `None` while it cannot be measured (the note says why).
    pub cuhal: Option<Summary>,
    /// The floor's figure.
    pub floor: Option<Summary>,
    /// The target.
    pub goal: Goal,
    /// The statistic the ratio and the goal use.
    pub center: Center,
    /// A remark for the notes under the table (empty for none).
    pub note: String,
}

impl Comparison {
    /// A comparison on medians with no note.
    pub fn new(
        case: &'static str,
        name: impl Into<String>,
        cuhal: Option<Summary>,
        floor: Option<Summary>,
        goal: Goal,
    ) -> Self {
        Self {
            case,
            name: name.into(),
            unit: Unit::Nanos,
            cuhal,
            floor,
            goal,
            center: Center::Median,
            note: String::new(),
        }
    }

    /// This comparison with a note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// cuhal's figure over the floor's.
    pub fn ratio(&self) -> Option<f64> {
        let c = self.cuhal.as_ref().map(|s| self.center.of(s))?;
        let f = self.floor.as_ref().map(|s| self.center.of(s))?;
        (f != 0.0).then(|| c / f)
    }

    /// Whether the goal holds.
    pub fn verdict(&self) -> Verdict {
        self.goal.judge(
            self.unit,
            self.cuhal.as_ref().map(|s| self.center.of(s)),
            self.floor.as_ref().map(|s| self.center.of(s)),
        )
    }

    fn center_cell(&self, s: Option<Summary>) -> String {
        match (s, self.center) {
            (None, _) => "n/a".to_owned(),
            (Some(s), Center::Median) => self.unit.format(s.median),
            (Some(s), Center::Mean) => format!("{} (mean)", self.unit.format(s.mean)),
            (Some(s), Center::P99) => format!("{} (p99)", self.unit.format(s.p99)),
        }
    }
}

/// A single figure: a floor, a component of one, or a reference point (the seeds' design).
#[derive(Clone, Debug)]
pub struct Measurement {
    /// The case it belongs to.
    pub case: &'static str,
    /// What is measured.
    pub name: String,
    /// Its unit.
    pub unit: Unit,
    /// The figures.
    pub summary: Summary,
}

/// Everything one run found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Facts about the machine and the run, in print order.
    pub header: Vec<(String, String)>,
    /// The main table.
    pub comparisons: Vec<Comparison>,
    /// Every raw figure.
    pub measurements: Vec<Measurement>,
    /// Remarks printed under the tables.
    pub notes: Vec<String>,
}

fn cell(unit: Unit, s: Option<Summary>, pick: fn(&Summary) -> f64) -> String {
    s.map_or_else(|| "n/a".to_owned(), |s| unit.format(pick(&s)))
}

/// Keeps a table cell on one row: pipes would split it.
fn escape_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

impl Report {
    /// Adds a header line.
    pub fn fact(&mut self, key: &str, value: impl Into<String>) {
        self.header.push((key.to_owned(), value.into()));
    }

    /// Adds a measurement.
    pub fn measured(&mut self, case: &'static str, name: impl Into<String>, summary: Summary) {
        self.measurements.push(Measurement {
            case,
            name: name.into(),
            unit: Unit::Nanos,
            summary,
        });
    }

    /// The markdown the run prints last.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("## cuhal bench\n\n");
        for (k, v) in &self.header {
            let _ = writeln!(out, "- {k}: {v}");
        }
        out.push('\n');
        out.push_str(
            "| case | cuhal median | cuhal p99 | floor median | floor p99 | ratio | goal | met? |\n",
        );
        out.push_str("|---|---|---|---|---|---|---|---|\n");
        for c in &self.comparisons {
            let _ = writeln!(
                out,
                "| {}. {} | {} | {} | {} | {} | {} | {} | {} |",
                c.case,
                escape_cell(&c.name),
                c.center_cell(c.cuhal),
                cell(c.unit, c.cuhal, |s| s.p99),
                c.center_cell(c.floor),
                cell(c.unit, c.floor, |s| s.p99),
                c.ratio()
                    .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x")),
                escape_cell(&c.goal.describe(c.unit)),
                escape_cell(&c.verdict().cell()),
            );
        }
        if !self.measurements.is_empty() {
            out.push_str("\nRaw measurements (same process):\n\n");
            out.push_str("| case | measurement | median | p99 | min | mean | n |\n");
            out.push_str("|---|---|---|---|---|---|---|\n");
            for m in &self.measurements {
                let s = &m.summary;
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    m.case,
                    escape_cell(&m.name),
                    m.unit.format(s.median),
                    m.unit.format(s.p99),
                    m.unit.format(s.min),
                    m.unit.format(s.mean),
                    s.n
                );
            }
        }
        let notes: Vec<String> = self
            .comparisons
            .iter()
            .filter(|c| !c.note.is_empty())
            .map(|c| format!("case {}: {}", c.case, c.note))
            .chain(self.notes.iter().cloned())
            .collect();
        if !notes.is_empty() {
            out.push_str("\nNotes:\n");
            for n in notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out
    }

    /// The JSON document written to `--json`.
    pub fn to_json(&self) -> Value {
        let header = Value::Obj(
            self.header
                .iter()
                .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
                .collect(),
        );
        let comparisons = self
            .comparisons
            .iter()
            .map(|c| {
                Value::object()
                    .with("case", c.case)
                    .with("name", c.name.as_str())
                    .with("unit", c.unit.name())
                    .with("cuhal", c.cuhal.map(summary_json))
                    .with("floor", c.floor.map(summary_json))
                    .with("center", c.center.name())
                    .with("ratio", c.ratio())
                    .with("goal", c.goal.describe(c.unit))
                    .with("met", c.verdict().json())
                    .with(
                        "verdict",
                        match c.verdict() {
                            Verdict::Missed(by) => Value::Str(by),
                            _ => Value::Null,
                        },
                    )
                    .with("note", c.note.as_str())
            })
            .collect::<Vec<_>>();
        let measurements = self
            .measurements
            .iter()
            .map(|m| {
                Value::object()
                    .with("case", m.case)
                    .with("name", m.name.as_str())
                    .with("unit", m.unit.name())
                    .with("summary", summary_json(m.summary))
            })
            .collect::<Vec<_>>();
        Value::object()
            .with("header", header)
            .with("comparisons", comparisons)
            .with("measurements", measurements)
            .with(
                "notes",
                self.notes
                    .iter()
                    .map(|n| Value::Str(n.clone()))
                    .collect::<Vec<_>>(),
            )
    }
}

fn summary_json(s: Summary) -> Value {
    Value::object()
        .with("n", s.n)
        .with("min", s.min)
        .with("median", s.median)
        .with("p99", s.p99)
        .with("max", s.max)
        .with("mean", s.mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(median: f64, p99: f64) -> Summary {
        Summary {
            n: 10,
            min: median / 2.0,
            median,
            p99,
            max: p99 * 2.0,
            mean: median,
        }
    }

    #[test]
    fn durations_print_in_microseconds() {
        assert_eq!(format_ns(190.0), "0.190 us");
        assert_eq!(format_ns(3_712.0), "3.71 us");
        assert_eq!(format_ns(51_234.0), "51.2 us");
        assert_eq!(format_ns(350_400.0), "350 us");
        assert_eq!(format_ns(12_345_678.0), "12.3 ms");
        assert_eq!(format_ns(-1_500.0), "-1.50 us");
        assert_eq!(format_ns(f64::NAN), "n/a");
    }

    #[test]
    fn counts_never_round_a_small_rate_to_zero() {
        assert_eq!(Unit::Count.format(0.0), "0");
        assert_eq!(Unit::Count.format(3.0), "3");
        assert_eq!(Unit::Count.format(2.5), "2.50");
        assert_eq!(Unit::Count.format(0.004), "0.0040");
    }

    #[test]
    fn ratio_goal_is_judged_on_medians() {
        let g = Goal::RatioAtMost(1.25);
        assert_eq!(
            g.judge(Unit::Nanos, Some(1250.0), Some(1000.0)),
            Verdict::Met
        );
        assert_eq!(
            g.judge(Unit::Nanos, Some(1500.0), Some(1000.0)),
            Verdict::Missed("1.50x, 20% over the goal".into())
        );
        assert_eq!(g.judge(Unit::Nanos, None, Some(1000.0)), Verdict::Unknown);
        assert_eq!(g.judge(Unit::Nanos, Some(1.0), None), Verdict::Unknown);
        assert_eq!(g.describe(Unit::Nanos), "<= 1.25x floor");
    }

    #[test]
    fn added_and_absolute_goals() {
        let g = Goal::AddedAtMost(3000.0);
        assert_eq!(
            g.judge(Unit::Nanos, Some(7900.0), Some(4900.0)),
            Verdict::Met
        );
        assert_eq!(
            g.judge(Unit::Nanos, Some(9900.0), Some(4900.0)),
            Verdict::Missed("floor + 5.00 us, over by 2.00 us".into())
        );
        assert_eq!(g.describe(Unit::Nanos), "<= floor + 3.00 us");
        let g = Goal::AtMost(10_000.0);
        assert_eq!(g.judge(Unit::Nanos, Some(9_000.0), None), Verdict::Met);
        assert_eq!(
            g.judge(Unit::Nanos, Some(12_500.0), None),
            Verdict::Missed("over by 2.50 us".into())
        );
        let zero_allocs = Goal::AtMost(0.0);
        assert_eq!(
            zero_allocs.judge(Unit::Count, Some(0.0), None),
            Verdict::Met
        );
        assert_eq!(
            zero_allocs.judge(Unit::Count, Some(2.5), None),
            Verdict::Missed("over by 2.50".into())
        );
        assert_eq!(
            Goal::Report.judge(Unit::Nanos, Some(1.0), Some(1.0)),
            Verdict::Unknown
        );
    }

    fn sample_report() -> Report {
        let mut r = Report::default();
        r.fact("gpu", "NVIDIA H200");
        r.comparisons.push(Comparison::new(
            "1",
            "submit | per submission",
            Some(summary(2500.0, 4000.0)),
            Some(summary(2000.0, 3000.0)),
            Goal::RatioAtMost(1.25),
        ));
        r.comparisons.push(
            Comparison::new(
                "4",
                "replay",
                None,
                Some(summary(51_000.0, 60_000.0)),
                Goal::RatioAtMost(1.1),
            )
            .note("cuhal side not measured"),
        );
        let mut gap = Comparison::new(
            "3",
            "gap",
            Some(Summary {
                mean: 1_900.0,
                ..summary(1_000.0, 3_000.0)
            }),
            Some(Summary {
                mean: 1_500.0,
                ..summary(2_000.0, 3_000.0)
            }),
            Goal::AddedAtMost(500.0),
        );
        gap.center = Center::Mean;
        r.comparisons.push(gap);
        r.measured("2", "host func", summary(40_000.0, 80_000.0));
        r.notes.push("a note".into());
        r
    }

    #[test]
    fn markdown_has_header_rows_and_notes() {
        let text = sample_report().to_markdown();
        assert!(text.contains("- gpu: NVIDIA H200\n"), "{text}");
        assert!(
            text.contains("| 1. submit \\| per submission | 2.50 us | 4.00 us | 2.00 us | 3.00 us | 1.25x | <= 1.25x floor | yes |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 4. replay | n/a | n/a | 51.0 us | 60.0 us | n/a | <= 1.10x floor | n/a |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| 2 | host func | 40.0 us | 80.0 us | 20.0 us | 40.0 us | 10 |"),
            "{text}"
        );
        assert!(
            text.contains("- case 4: cuhal side not measured\n"),
            "{text}"
        );
        // Judged on means: 1.9 vs 1.5 is within +0.5 although the medians are not.
        assert!(
            text.contains("| 3. gap | 1.90 us (mean) | 3.00 us | 1.50 us (mean) | 3.00 us | 1.27x | <= floor + 0.500 us | yes |"),
            "{text}"
        );
        assert!(text.contains("- a note\n"), "{text}");
    }

    #[test]
    fn json_carries_every_figure() {
        let text = sample_report().to_json().to_pretty();
        assert!(text.contains("\"gpu\": \"NVIDIA H200\""), "{text}");
        assert!(text.contains("\"ratio\": 1.25"), "{text}");
        assert!(text.contains("\"met\": true"), "{text}");
        assert!(text.contains("\"cuhal\": null"), "{text}");
        assert!(text.contains("\"median\": 51000"), "{text}");
        assert!(text.contains("\"name\": \"host func\""), "{text}");
    }
}
