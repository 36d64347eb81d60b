//! The recording's event log, in plain types, and the translation of perf records into
//! it (parsing through `linux-perf-event-reader`). Downstream modules see only the types.

use linux_perf_event_reader::{
    AttrFlags, BranchSampleFormat, CpuMode, Endianness, EventRecord, Mmap2FileId, PerfClock,
    PerfEventAttr, PerfEventType, RawData, RawEventRecord, ReadFormat, RecordParseInfo, RecordType,
    SampleFormat, SamplingPolicy, SoftwareCounterType, WakeupPolicy,
};
use perf_event_open_sys::bindings as pb;

use super::sys::RingRecord;
use super::{PERF_REG_X86_BP, PERF_REG_X86_IP, PERF_REG_X86_SP};

/// One entry of the log. `time_ns` is CLOCK_MONOTONIC.
#[derive(Clone, Debug)]
pub struct Event {
    pub time_ns: u64,
    pub kind: EventKind,
}

#[derive(Clone, Debug)]
pub enum EventKind {
    Sample(Sample),
    /// A file (or anonymous memory) was mapped executable into a process.
    Mmap(Mapping),
    /// A thread got a name; `exec` is set when it comes from an `exec` of a new program.
    Comm {
        pid: i32,
        tid: i32,
        name: String,
        exec: bool,
    },
    /// A thread or process was created (`pid == tid` for a new process).
    Fork {
        pid: i32,
        ppid: i32,
        tid: i32,
        ptid: i32,
    },
    /// A thread exited.
    Exit {
        pid: i32,
        tid: i32,
    },
    /// Records the kernel had to drop; `tid` is the thread that was running when they
    /// were lost (whose samples they were), when the kernel said.
    Lost {
        count: u64,
        tid: Option<i32>,
    },
    /// The kernel throttled sampling because the event fired too often.
    Throttle,
}

/// The user registers the unwinder needs, at the moment of the sample (for a sample taken
/// in the kernel: at the entry into the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub pid: i32,
    pub tid: i32,
    pub cpu: u32,
    /// The kernel's frame-pointer walk through kernel code, leaf first (empty when the
    /// sample was taken in user mode or kernel frames were excluded).
    pub kernel_stack: Vec<u64>,
    /// The kernel's frame-pointer walk through user code, leaf first; the first entry is
    /// the user instruction pointer.
    pub user_stack: Vec<u64>,
    /// Whether the callchain reached the kernel's frame limit, so the outermost frames are
    /// missing. The callchain cannot tell a stack of exactly the limit from a longer one,
    /// so such a stack counts as truncated too.
    pub callchain_truncated: bool,
    pub user_regs: Option<UserRegs>,
    /// A copy of user stack memory starting at `user_regs.sp`.
    pub stack_copy: Vec<u8>,
    /// The event count this sample stands for (ns for cpu-clock, cycles for cycles).
    pub period: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub pid: i32,
    pub start: u64,
    pub len: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
    /// The file's path, or a pseudo-name like `[vdso]`, `//anon`, `[anon:…]`.
    pub path: String,
    /// The GNU build ID, when the kernel reported it with the mapping.
    pub build_id: Option<Vec<u8>>,
    pub executable: bool,
}

/// Callchain context markers (`PERF_CONTEXT_*`) are the top 4095 values of u64.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;
const PERF_CONTEXT_KERNEL: u64 = (-128i64) as u64;
const PERF_CONTEXT_USER: u64 = (-512i64) as u64;
/// `PROT_EXEC` in an MMAP2 record's protection field.
const PROT_EXEC: u32 = 4;

/// Turns ring-buffer records into [`Event`]s for one attribute.
pub struct Parser {
    info: RecordParseInfo,
    max_stack: usize,
}

impl Parser {
    pub fn new(attr: &pb::perf_event_attr) -> Parser {
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
        Parser {
            info: RecordParseInfo::new(&reader_attr, Endianness::NATIVE),
            max_stack: attr.sample_max_stack as usize,
        }
    }

    /// Parses one record; records we do not use, and malformed ones, give `None`.
    pub fn parse(&self, record: RingRecord<'_>) -> Option<Event> {
        let data = if record.body.1.is_empty() {
            RawData::Single(record.body.0)
        } else {
            RawData::Split(record.body.0, record.body.1)
        };
        let raw = RawEventRecord::new(RecordType(record.kind), record.misc, data, self.info);
        let time_ns = raw.timestamp().unwrap_or(0);
        let kind = match record.kind {
            k if k == pb::PERF_RECORD_LOST_SAMPLES => {
                let mut count = [0u8; 8];
                let mut body = data;
                body.read_exact(&mut count).ok()?;
                EventKind::Lost {
                    count: u64::from_ne_bytes(count),
                    tid: raw.common_data().ok().and_then(|c| c.tid),
                }
            }
            _ => match raw.parse().ok()? {
                EventRecord::Sample(s) => EventKind::Sample(self.sample(&s)?),
                EventRecord::Mmap2(m) => EventKind::Mmap(Mapping {
                    pid: m.pid,
                    start: m.address,
                    len: m.length,
                    file_offset: m.page_offset,
                    path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    build_id: match m.file_id {
                        Mmap2FileId::BuildId(id) => Some(id),
                        Mmap2FileId::InodeAndVersion(_) => None,
                    },
                    executable: m.protection & PROT_EXEC != 0,
                }),
                EventRecord::Mmap(m) => EventKind::Mmap(Mapping {
                    pid: m.pid,
                    start: m.address,
                    len: m.length,
                    file_offset: m.page_offset,
                    path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                    build_id: None,
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
            period: s.period.unwrap_or(1),
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
                    sample.kernel_stack.push(addr);
                } else {
                    sample.user_stack.push(addr);
                }
            }
            sample.callchain_truncated =
                sample.kernel_stack.len() + sample.user_stack.len() >= self.max_stack;
        } else if let Some(ip) = s.ip {
            sample.user_stack.push(ip);
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
