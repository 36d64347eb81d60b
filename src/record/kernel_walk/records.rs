//! What the program sends sampler through the perf rings: its walked samples (each the
//! raw data of a sample of a `bpf-output` event, laid out as `struct record`), and its
//! wake-ups (samples of another `bpf-output` event that carry nothing).

use perf_event_open_sys::bindings as pb;

use crate::events::{Event, EventKind, KernelWalk, Sample};

/// Callchain context markers (`PERF_CONTEXT_*`) are the top 4,095 values of u64.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;
/// Bytes of a record's header (`struct record` up to `ips`).
const RECORD_HEADER_BYTES: usize = 40;

/// The attribute of the `bpf-output` events the program writes through (`wakes`: those
/// of its wake-ups, else those of its walks): a sample (with the id, thread, time and
/// CPU, in the sampling event's layout of side-band records, so that one parser reads the
/// ring) at each record it writes. The clock is the sampling event's: the kernel shares a
/// ring only between events of one clock.
pub(super) fn output_attr(wakes: bool) -> pb::perf_event_attr {
    let mut attr = pb::perf_event_attr {
        size: std::mem::size_of::<pb::perf_event_attr>() as u32,
        type_: pb::PERF_TYPE_SOFTWARE,
        config: pb::PERF_COUNT_SW_BPF_OUTPUT as u64,
        sample_type: (pb::PERF_SAMPLE_IDENTIFIER
            | pb::PERF_SAMPLE_TID
            | pb::PERF_SAMPLE_TIME
            | pb::PERF_SAMPLE_CPU
            | pb::PERF_SAMPLE_RAW) as u64,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    // A wake-up event's every record wakes whoever polls its ring; the walks' records
    // wake no one by themselves (they count, as every record, toward the wake-up at
    // half a ring).
    if wakes {
        attr.__bindgen_anon_2.wakeup_events = 1;
    }
    attr.set_use_clockid(1);
    attr.set_sample_id_all(1);
    attr
}

/// The event of one record the program sent (`struct record`); `None` when it is
/// shorter than its header says.
pub(in crate::record) fn parse_record(data: &[u8]) -> Option<Event> {
    let u64_at = |at: usize| Some(u64::from_ne_bytes(data.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?));
    let u16_at = |at: usize| Some(u16::from_ne_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let time_ns = u64_at(0)?;
    let (pid, tid, cpu) = (u32_at(8)? as i32, u32_at(12)? as i32, u32_at(16)?);
    let (kernel_nr, user_nr) = (usize::from(u16_at(20)?), usize::from(u16_at(22)?));
    let period = u64_at(24)?;
    let walk = match u32_at(32)? {
        0 => KernelWalk::Outermost,
        1 => KernelWalk::FrameLimit,
        2 => KernelWalk::NotUp,
        _ => return None,
    };
    let frame = |i: usize| u64_at(RECORD_HEADER_BYTES + 8 * i);
    // bpf_get_stack copies the kernel's part of the perf callchain with its context
    // marker (PERF_CONTEXT_KERNEL, first): not a frame.
    let kernel_callchain = (0..kernel_nr)
        .map(frame)
        .filter(|a| a.is_none_or(|a| a < PERF_CONTEXT_MAX))
        .collect::<Option<Vec<u64>>>()?;
    let user_callchain = (kernel_nr..kernel_nr + user_nr)
        .map(frame)
        .collect::<Option<Vec<u64>>>()?;
    Some(Event {
        time_ns,
        kind: EventKind::Sample(Sample {
            pid,
            tid,
            cpu,
            kernel_callchain,
            user_callchain,
            callchain_truncated: false,
            user_regs: None,
            stack_copy: Vec::new(),
            period,
            kernel_walk: Some(walk),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_becomes_a_sample_with_its_kernel_and_user_frames() {
        let mut data = Vec::new();
        data.extend(123_456u64.to_ne_bytes());
        data.extend(10u32.to_ne_bytes());
        data.extend(11u32.to_ne_bytes());
        data.extend(1u32.to_ne_bytes());
        data.extend(2u16.to_ne_bytes());
        data.extend(2u16.to_ne_bytes());
        data.extend(1_000_000u64.to_ne_bytes());
        data.extend(0u32.to_ne_bytes());
        data.extend(0u32.to_ne_bytes());
        // The kernel's part starts with PERF_CONTEXT_KERNEL, as bpf_get_stack copies it.
        for frame in [
            (-128i64) as u64,
            0xffff_ffff_8100_0000u64,
            0x40_1000,
            0x40_2005,
        ] {
            data.extend(frame.to_ne_bytes());
        }
        let event = parse_record(&data).unwrap();
        assert_eq!(event.time_ns, 123_456);
        let EventKind::Sample(s) = event.kind else {
            panic!("not a sample")
        };
        assert_eq!((s.pid, s.tid, s.cpu, s.period), (10, 11, 1, 1_000_000));
        assert_eq!(s.kernel_callchain, [0xffff_ffff_8100_0000]);
        assert_eq!(s.user_callchain, [0x40_1000, 0x40_2005]);
        assert_eq!(s.kernel_walk, Some(KernelWalk::Outermost));
        // A record cut short of the frames its header counts is not a sample.
        assert!(parse_record(&data[..data.len() - 1]).is_none());
    }
}
