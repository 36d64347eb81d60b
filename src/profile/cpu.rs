//! The CPU time a thread used between one sample and the next: what draws a thread's
//! CPU graph in the Firefox Profiler (its samples' `threadCPUDelta`), for every
//! recording, not only those with off-CPU time.
//!
//! Where it comes from, best first:
//! - with off-CPU time recorded, the context switches: the time between two rows less
//!   the time the thread spent off the CPU in between;
//! - for a time event (cpu-clock, task-clock), the sample itself: each one stands for
//!   its period of the thread's CPU time;
//! - for cycles, the sample's count of cycles (the viewer's "variable CPU cycles").
//!
//! Other events (page faults, cache misses) say nothing of CPU time, and get no graph
//! from it (the viewer then draws one from the samples' count).

use super::{Meta, SampleRow, SampleWeight};

/// The unit of a thread's CPU deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuDeltaUnit {
    Nanoseconds,
    /// Cycles, whose rate varies with the CPU's clock.
    Cycles,
}

impl CpuDeltaUnit {
    /// The unit's name in the Firefox format (`meta.sampleUnits.threadCPUDelta`).
    pub fn firefox_name(self) -> &'static str {
        match self {
            CpuDeltaUnit::Nanoseconds => "ns",
            CpuDeltaUnit::Cycles => "variable CPU cycles",
        }
    }

    /// The unit of the CPU deltas of a profile with `meta`, when it has any.
    pub fn of(meta: &Meta) -> Option<CpuDeltaUnit> {
        match () {
            _ if meta.off_cpu || meta.time_event => Some(CpuDeltaUnit::Nanoseconds),
            _ if meta.event == "cycles" => Some(CpuDeltaUnit::Cycles),
            _ => None,
        }
    }
}

/// Each row's CPU use since the row before, in [`CpuDeltaUnit::of`]'s unit (the first
/// row's is 0: the viewer does not read it); `None` when the event says nothing of CPU
/// time.
pub fn thread_cpu_deltas<S>(meta: &Meta, rows: &[SampleRow<S>]) -> Option<Vec<u64>> {
    CpuDeltaUnit::of(meta)?;
    if meta.off_cpu {
        return Some(deltas_from_switches(rows));
    }
    // A row of `n` samples stands for `n` periods; when the period varied, `n` is the
    // sum of the samples' periods already.
    let per_sample = meta.period.unwrap_or(1);
    let mut deltas: Vec<u64> = rows
        .iter()
        .map(|r| match r.weight {
            SampleWeight::OnCpu(n) => n.saturating_mul(per_sample),
            SampleWeight::OffCpu { .. } => 0,
        })
        .collect();
    // What a row stands for was used before it: the delta between a row and the one
    // before is the later row's own.
    if let Some(first) = deltas.first_mut() {
        *first = 0;
    }
    Some(deltas)
}

/// With context switches recorded: the time between two rows less the previous row's
/// time off the CPU.
fn deltas_from_switches<S>(rows: &[SampleRow<S>]) -> Vec<u64> {
    let mut deltas = Vec::with_capacity(rows.len());
    let mut previous: Option<(f64, u64)> = None;
    for r in rows {
        let delta = match previous {
            None => 0,
            Some((time_ms, off_ns)) => {
                let gap_ns = ((r.time_ms - time_ms).max(0.0) * 1e6).round() as u64;
                gap_ns.saturating_sub(off_ns)
            }
        };
        deltas.push(delta);
        let off_ns = match r.weight {
            SampleWeight::OnCpu(_) => 0,
            SampleWeight::OffCpu { ns, .. } => ns,
        };
        previous = Some((r.time_ms, off_ns));
    }
    deltas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::OffCpuKind;

    fn meta(event: &str, time_event: bool, period: Option<u64>, off_cpu: bool) -> Meta {
        Meta {
            event: event.into(),
            time_event,
            period,
            off_cpu,
            ..crate::profile::Profile::from_named_stacks(&[]).meta
        }
    }

    fn row(time_ms: f64, weight: SampleWeight) -> SampleRow<u32> {
        SampleRow {
            time_ms,
            stack: 0,
            weight,
        }
    }

    #[test]
    fn a_time_event_sample_stands_for_its_period_of_cpu() {
        let m = meta("cpu-clock", true, Some(1_005_025), false);
        let rows = [
            row(0.0, SampleWeight::OnCpu(1)),
            row(1.0, SampleWeight::OnCpu(1)),
            row(9.0, SampleWeight::OnCpu(2)),
        ];
        assert_eq!(CpuDeltaUnit::of(&m), Some(CpuDeltaUnit::Nanoseconds));
        assert_eq!(
            thread_cpu_deltas(&m, &rows),
            Some(vec![0, 1_005_025, 2_010_050])
        );
    }

    #[test]
    fn cycles_count_cycles_and_other_events_say_nothing() {
        let varied = meta("cycles", false, None, false);
        let rows = [
            row(0.0, SampleWeight::OnCpu(3_000_000)),
            row(1.0, SampleWeight::OnCpu(2_500_000)),
        ];
        assert_eq!(CpuDeltaUnit::of(&varied), Some(CpuDeltaUnit::Cycles));
        assert_eq!(thread_cpu_deltas(&varied, &rows), Some(vec![0, 2_500_000]));
        let faults = meta("page-faults", false, Some(1), false);
        assert_eq!(thread_cpu_deltas(&faults, &rows), None);
    }

    #[test]
    fn with_switches_the_time_off_the_cpu_is_not_cpu() {
        let m = meta("cpu-clock", true, Some(1_000_000), true);
        let off = SampleWeight::OffCpu {
            kind: OffCpuKind::ALL[0],
            ns: 4_000_000,
        };
        let rows = [
            row(0.0, SampleWeight::OnCpu(1)),
            row(1.0, off),
            row(6.0, SampleWeight::OnCpu(1)),
        ];
        assert_eq!(
            thread_cpu_deltas(&m, &rows),
            Some(vec![0, 1_000_000, 1_000_000])
        );
    }
}
