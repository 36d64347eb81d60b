//! The translation of perf records into the recording's plain events
//! ([`crate::events`]), parsing through `linux-perf-event-reader`.

use std::collections::HashSet;

use linux_perf_event_reader::{
    AttrFlags, BranchSampleFormat, ContextSwitchRecord, CpuMode, Endianness, EventRecord,
    Mmap2FileId, PerfClock, PerfEventAttr, PerfEventType, RawData, RawEventRecord, ReadFormat,
    RecordParseInfo, RecordType, SampleFormat, SamplingPolicy, SoftwareCounterType,
    TaskWasPreempted, WakeupPolicy,
};
use perf_event_open_sys::bindings as pb;

use super::attr::{PERF_REG_X86_BP, PERF_REG_X86_IP, PERF_REG_X86_SP};
use super::sys::RingRecord;
use crate::events::{Event, EventKind, Mapping, Sample, UserRegs};
use crate::files::FileId;

/// Callchain context markers (`PERF_CONTEXT_*`) are the top 4095 values of u64.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;
const PERF_CONTEXT_KERNEL: u64 = (-128i64) as u64;
const PERF_CONTEXT_USER: u64 = (-512i64) as u64;
/// `PROT_EXEC` in an MMAP2 record's protection field.
const PROT_EXEC: u32 = 4;

/// The flag of an MMAP2 record that carries a build ID in place of the device and inode.
const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// The record's `misc` bits as they describe its layout. sampler never asks for build IDs
/// (`attr.build_id`), so its MMAP2 records always carry the device and inode; yet the
/// kernel (perf_event_mmap_output) sets the build-ID flag in a record header shared by
/// every session's events, and leaves it set: beside another session that asks for build
/// IDs (`perf record --buildid-mmap`), sampler's records come flagged. Read as a build
/// ID, the device number is a length, which the parser asserts is at most 20.
fn misc_of(record: &RingRecord<'_>) -> u16 {
    match record.kind {
        pb::PERF_RECORD_MMAP2 => record.misc & !PERF_RECORD_MISC_MMAP_BUILD_ID,
        _ => record.misc,
    }
}

/// Turns ring-buffer records into [`Event`]s for the sampling event and the
/// context-switch events beside it.
pub struct Parser {
    info: RecordParseInfo,
    /// The context-switch events' records (their samples lack the period).
    switch_info: RecordParseInfo,
    max_stack: usize,
    /// The sampling event's fixed period (its samples then do not carry one).
    period: Option<u64>,
    /// The ids of the context-switch events: their samples are switch-out stacks.
    switch_ids: HashSet<u64>,
    /// The `exit_group` events' records (their samples lack the period), and their ids.
    exit_info: RecordParseInfo,
    exit_ids: HashSet<u64>,
    /// The kernel walker's `bpf-output` events' records and ids: their samples' raw
    /// data are walked samples ([`super::kernel_walk`]).
    walks: Option<(RecordParseInfo, HashSet<u64>)>,
    /// The ids of the kernel walker's wake-up events, whose records carry nothing.
    wake_ids: HashSet<u64>,
}

/// What a record of the rings is, as [`Parser::parse`] reads it.
pub enum Parsed {
    Event(Event),
    /// One of the kernel walker's wake-ups: it carries nothing, and is not counted.
    WakeUp,
    /// A record not used, or malformed.
    Unused,
}

/// The records of the kernel walker's `bpf-output` events: their layout and ids.
pub struct Walks {
    pub attr: pb::perf_event_attr,
    pub ids: HashSet<u64>,
    /// The ids of the events whose records only wake sampler.
    pub wake_ids: HashSet<u64>,
}

impl Parser {
    /// A parser of the records of the sampling event `attr`, of the context-switch
    /// events (`switch_attr`, ids `switch_ids`), of the `exit_group` events (`exit`:
    /// their attribute and ids) and of the kernel walker's events (`walks`) that share
    /// its rings.
    pub fn new(
        attr: &pb::perf_event_attr,
        period: Option<u64>,
        switch_attr: &pb::perf_event_attr,
        switch_ids: HashSet<u64>,
        exit: (&pb::perf_event_attr, HashSet<u64>),
        walks: Option<Walks>,
    ) -> Parser {
        let (walks, wake_ids) = match walks {
            Some(w) => (Some((parse_info(&w.attr), w.ids)), w.wake_ids),
            None => (None, HashSet::new()),
        };
        Parser {
            info: parse_info(attr),
            switch_info: parse_info(switch_attr),
            max_stack: attr.sample_max_stack as usize,
            period,
            switch_ids,
            exit_info: parse_info(exit.0),
            exit_ids: exit.1,
            walks,
            wake_ids,
        }
    }

    /// Parses one record: an event, one of the kernel walker's wake-ups (a sample that
    /// carries nothing), or a record we do not use or that is malformed.
    pub fn parse(&self, record: RingRecord<'_>) -> Parsed {
        let data = raw_data(&record);
        // A sample starts with its event's id (PERF_SAMPLE_IDENTIFIER), which says
        // whose layout it has; other records have the same layout for every event.
        let id = match record.kind == pb::PERF_RECORD_SAMPLE {
            true => first_u64(data),
            false => None,
        };
        if id.is_some_and(|id| self.wake_ids.contains(&id)) {
            return Parsed::WakeUp;
        }
        self.event(&record, data, id)
            .map_or(Parsed::Unused, Parsed::Event)
    }

    /// The event of `record` (whose body is `data`, and whose sample id is `id`).
    fn event(&self, record: &RingRecord<'_>, data: RawData<'_>, id: Option<u64>) -> Option<Event> {
        if let (Some((info, ids)), Some(id)) = (&self.walks, id) {
            if ids.contains(&id) {
                return walked(data, *info);
            }
        }
        let switch = id.is_some_and(|id| self.switch_ids.contains(&id));
        let exit = id.is_some_and(|id| self.exit_ids.contains(&id));
        let info = match (switch, exit) {
            (true, _) => self.switch_info,
            (_, true) => self.exit_info,
            _ => self.info,
        };
        let raw = RawEventRecord::new(RecordType(record.kind), misc_of(record), data, info);
        let time_ns = raw.timestamp().unwrap_or(0);
        let kind = match record.kind {
            k if k == pb::PERF_RECORD_LOST_SAMPLES => EventKind::Lost {
                count: first_u64(data)?,
                pid: raw.common_data().ok().and_then(|c| c.pid),
                tid: raw.common_data().ok().and_then(|c| c.tid),
            },
            _ => match raw.parse().ok()? {
                EventRecord::Sample(s) => {
                    let sample = self.sample(&s)?;
                    match (switch, exit) {
                        (true, _) => EventKind::SwitchSample(sample),
                        (_, true) => EventKind::ExitStack(sample),
                        _ => EventKind::Sample(sample),
                    }
                }
                EventRecord::ContextSwitch(switch) => {
                    let common = raw.common_data().ok()?;
                    let (pid, tid) = (common.pid?, common.tid?);
                    match switch {
                        ContextSwitchRecord::Out { preempted, .. } => EventKind::SwitchOut {
                            pid,
                            tid,
                            preempted: preempted == TaskWasPreempted::Yes,
                        },
                        ContextSwitchRecord::In { .. } => EventKind::SwitchIn { pid, tid },
                    }
                }
                EventRecord::Mmap2(m) => EventKind::Mmap(Mapping {
                    pid: m.pid,
                    start: m.address,
                    len: m.length,
                    file_offset: m.page_offset,
                    path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    file: match m.file_id {
                        Mmap2FileId::InodeAndVersion(f) if f.inode != 0 => Some(FileId {
                            dev_major: f.major,
                            dev_minor: f.minor,
                            inode: f.inode,
                        }),
                        _ => None,
                    },
                    executable: m.protection & PROT_EXEC != 0,
                }),
                EventRecord::Mmap(m) => EventKind::Mmap(Mapping {
                    pid: m.pid,
                    start: m.address,
                    len: m.length,
                    file_offset: m.page_offset,
                    path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    file: None,
                    executable: m.is_executable,
                }),
                EventRecord::Comm(c) => EventKind::Comm {
                    pid: c.pid,
                    tid: c.tid,
                    name: String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
                    exec: c.is_execve,
                },
                EventRecord::Fork(f) => EventKind::Fork {
                    pid: f.pid,
                    ppid: f.ppid,
                    tid: f.tid,
                    ptid: f.ptid,
                },
                EventRecord::Exit(f) => EventKind::Exit {
                    pid: f.pid,
                    tid: f.tid,
                },
                EventRecord::Lost(l) => EventKind::Lost {
                    count: l.count,
                    pid: raw.common_data().ok().and_then(|c| c.pid),
                    tid: raw.common_data().ok().and_then(|c| c.tid),
                },
                EventRecord::Throttle(_) => EventKind::Throttle,
                _ => return None,
            },
        };
        Some(Event { time_ns, kind })
    }

    fn sample(&self, s: &linux_perf_event_reader::SampleRecord<'_>) -> Option<Sample> {
        let mut sample = Sample {
            pid: s.pid?,
            tid: s.tid?,
            cpu: s.cpu.unwrap_or(0),
            period: s.period.or(self.period).unwrap_or(1),
            ..Sample::default()
        };
        if let Some(chain) = &s.callchain {
            let mut in_kernel = s.cpu_mode == CpuMode::Kernel;
            for i in 0..chain.len() {
                let addr = chain.get(i)?;
                if addr >= PERF_CONTEXT_MAX {
                    in_kernel = addr == PERF_CONTEXT_KERNEL;
                    if addr != PERF_CONTEXT_KERNEL && addr != PERF_CONTEXT_USER {
                        // Hypervisor or guest contexts: not ours to show.
                        in_kernel = true;
                    }
                    continue;
                }
                if in_kernel {
                    sample.kernel_callchain.push(addr);
                } else {
                    sample.user_callchain.push(addr);
                }
            }
            sample.callchain_truncated =
                sample.kernel_callchain.len() + sample.user_callchain.len() >= self.max_stack;
        } else if let Some(ip) = s.ip {
            sample.user_callchain.push(ip);
        }
        if let Some(regs) = &s.user_regs {
            if let (Some(ip), Some(sp), Some(bp)) = (
                regs.get(PERF_REG_X86_IP),
                regs.get(PERF_REG_X86_SP),
                regs.get(PERF_REG_X86_BP),
            ) {
                sample.user_regs = Some(UserRegs { ip, sp, bp });
            }
        }
        if let Some((stack, dyn_size)) = &s.user_stack {
            let bytes = stack.as_slice();
            let valid = (*dyn_size as usize).min(bytes.len());
            sample.stack_copy = bytes[..valid].to_vec();
        }
        Some(sample)
    }
}

/// The reader's description of the records of `attr`.
fn parse_info(attr: &pb::perf_event_attr) -> RecordParseInfo {
    // Only the fields that determine the record layout matter to the reader.
    let mut flags = AttrFlags::SAMPLE_ID_ALL;
    if attr.exclude_kernel() != 0 {
        flags |= AttrFlags::EXCLUDE_KERNEL;
    }
    let reader_attr = PerfEventAttr {
        type_: PerfEventType::Software(SoftwareCounterType::CpuClock),
        sampling_policy: SamplingPolicy::Frequency(1000),
        sample_format: SampleFormat::from_bits_truncate(attr.sample_type),
        read_format: ReadFormat::from_bits_truncate(attr.read_format),
        flags,
        wakeup_policy: WakeupPolicy::EventCount(1),
        branch_sample_format: BranchSampleFormat::empty(),
        sample_regs_user: attr.sample_regs_user,
        sample_stack_user: attr.sample_stack_user,
        clock: PerfClock::Default,
        sample_regs_intr: 0,
        aux_watermark: 0,
        sample_max_stack: attr.sample_max_stack,
        aux_sample_size: 0,
        sig_data: 0,
    };
    RecordParseInfo::new(&reader_attr, Endianness::NATIVE)
}

/// The walked sample in the raw data of a sample of the kernel walker's `bpf-output`
/// event (layout `info`).
fn walked(data: RawData<'_>, info: RecordParseInfo) -> Option<Event> {
    let raw = RawEventRecord::new(RecordType(pb::PERF_RECORD_SAMPLE), 0, data, info);
    match raw.parse().ok()? {
        EventRecord::Sample(s) => super::kernel_walk::parse_record(&s.raw?.as_slice()),
        _ => None,
    }
}

/// A record's body, in one piece or in the two of a ring's wrap.
fn raw_data<'a>(record: &RingRecord<'a>) -> RawData<'a> {
    match record.body.1.is_empty() {
        true => RawData::Single(record.body.0),
        false => RawData::Split(record.body.0, record.body.1),
    }
}

/// The record body's first 8 bytes as a native-endian number (a sample's id, a lost
/// count).
fn first_u64(data: RawData<'_>) -> Option<u64> {
    let mut bytes = [0u8; 8];
    let mut body = data;
    body.read_exact(&mut bytes).ok()?;
    Some(u64::from_ne_bytes(bytes))
}
