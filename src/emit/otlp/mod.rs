//! OTLP profiles: the profile as an OpenTelemetry `ExportProfilesServiceRequest`
//! (profiles `v1development`, the messages in [`proto`]), as OTLP/HTTP receivers (the
//! OpenTelemetry Collector, and back ends behind it) take it.
//!
//! One resource per process, with the semantic conventions' attributes (`service.name`,
//! `host.name`, `process.pid`, `process.executable.name`, `container.id`); under it one
//! profile per kind of value: CPU time (or the sampled event's count) and, for a
//! recording with `--off-cpu`, off-CPU time. A sample is a (thread, stack) with
//! `thread.name` and `thread.id`, and every observation of it: the value and the time of
//! each sample row. The dictionary shares functions, mappings (a library each, with its
//! GNU build ID as `process.executable.build_id.gnu`), locations (one per code address:
//! its inlined calls are its extra lines, innermost first) and stacks across processes.

pub mod proto;

use std::collections::HashMap;

use crate::profile::{CodeKind, FrameIndex, Process, Profile, SampleWeight, StackIndex};
use proto::{AnyValue, KeyValue, KeyValueAndUnit, Value};

/// The profile as one OTLP export request. `just_recorded`: this run recorded it, so a
/// process's container is read from its cgroup (`/proc/PID/cgroup` while it runs; for
/// the recorded command, gone, sampler's own, which it inherited); a profile read from
/// a file has no `container.id` (its PIDs may be other processes' by now).
pub fn to_request(profile: &Profile, just_recorded: bool) -> proto::ExportProfilesServiceRequest {
    let mut dict = Dictionary::new(profile);
    let host = host_name();
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty());
    let kinds = ValueKinds::of(profile, &mut dict);
    let mut resource_profiles = Vec::new();
    for (i, process) in profile.processes.iter().enumerate() {
        let mut cpu = Vec::new();
        let mut off_cpu = Vec::new();
        for thread in profile.threads.iter().filter(|t| t.process.index() == i) {
            let attributes = vec![
                dict.attribute("thread.name", Value::String(thread.name.clone())),
                dict.attribute("thread.id", Value::Int(i64::from(thread.tid))),
            ];
            // Per stack: its observations, in time order (a thread's rows are).
            let mut on: Vec<(StackIndex, proto::Sample)> = Vec::new();
            let mut off: Vec<(StackIndex, proto::Sample)> = Vec::new();
            let mut on_of: HashMap<StackIndex, usize> = HashMap::new();
            let mut off_of: HashMap<StackIndex, usize> = HashMap::new();
            for row in &thread.samples {
                let (list, index, value) = match row.weight {
                    SampleWeight::OnCpu(n) => (&mut on, &mut on_of, n * kinds.per_sample),
                    SampleWeight::OffCpu { ns, .. } => (&mut off, &mut off_of, ns),
                };
                let at = *index.entry(row.stack).or_insert_with(|| {
                    list.push((
                        row.stack,
                        proto::Sample {
                            stack_index: 0,
                            attribute_indices: attributes.clone(),
                            link_index: 0,
                            values: Vec::new(),
                            timestamps_unix_nano: Vec::new(),
                        },
                    ));
                    list.len() - 1
                });
                let sample = &mut list[at].1;
                sample.values.push(value as i64);
                sample
                    .timestamps_unix_nano
                    .push(unix_nanos(profile.meta.start_unix_ms + row.time_ms));
            }
            for (list, into) in [(on, &mut cpu), (off, &mut off_cpu)] {
                for (stack, mut sample) in list {
                    sample.stack_index = dict.stack(stack);
                    into.push(sample);
                }
            }
        }
        let profiles: Vec<proto::Profile> = [(cpu, kinds.cpu), (off_cpu, kinds.off_cpu)]
            .into_iter()
            .filter(|(samples, _)| !samples.is_empty())
            .map(|(samples, sample_type)| proto::Profile {
                sample_type: Some(sample_type),
                samples,
                time_unix_nano: unix_nanos(profile.meta.start_unix_ms),
                duration_nano: (profile.meta.duration_ms.max(0.0) * 1e6) as u64,
                period_type: Some(kinds.period_type),
                period: kinds.period,
                attribute_indices: Vec::new(),
            })
            .collect();
        if profiles.is_empty() {
            continue;
        }
        let service_name = service
            .clone()
            .unwrap_or_else(|| command_name(profile, process));
        resource_profiles.push(proto::ResourceProfiles {
            resource: Some(proto::Resource {
                attributes: resource_attributes(
                    process,
                    &service_name,
                    host.as_deref(),
                    just_recorded
                        .then(|| container_id(process.pid, !profile.meta.command.is_empty()))
                        .flatten(),
                ),
            }),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(proto::InstrumentationScope {
                    name: "sampler".to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    proto::ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.finish()),
    }
}

/// Milliseconds since the Unix epoch as nanoseconds (0 for a time before it).
fn unix_nanos(ms: f64) -> u64 {
    (ms.max(0.0) * 1e6) as u64
}

/// What the values of the two profiles are and what one on-CPU sample is worth.
struct ValueKinds {
    cpu: proto::ValueType,
    off_cpu: proto::ValueType,
    period_type: proto::ValueType,
    period: i64,
    /// The value of one on-CPU sample: its interval in nanoseconds for a time event, the
    /// fixed period for another event, 1 when the period varied (then the rows count
    /// events already).
    per_sample: u64,
}

impl ValueKinds {
    fn of(profile: &Profile, dict: &mut Dictionary) -> ValueKinds {
        let meta = &profile.meta;
        let mut kind = |name: &str, unit: &str| proto::ValueType {
            type_strindex: dict.string(name),
            unit_strindex: dict.string(unit),
        };
        // The names the proto's own comment gives: ["cpu","nanoseconds"] and
        // ["off_cpu","nanoseconds"].
        // Only named when used: a dictionary has no orphaned entries.
        let off_cpu = if meta.off_cpu {
            kind("off_cpu", "nanoseconds")
        } else {
            proto::ValueType::default()
        };
        let (cpu, per_sample) = match meta.period {
            _ if meta.time_event => (kind("cpu", "nanoseconds"), meta.interval_ns()),
            Some(period) => (kind(&meta.event, "count"), period),
            None => (kind(&meta.event, "count"), 1),
        };
        ValueKinds {
            cpu,
            off_cpu,
            period_type: cpu,
            period: if meta.time_event || meta.period.is_some() {
                per_sample as i64
            } else {
                0
            },
            per_sample,
        }
    }
}

/// The resource of one process, with the semantic conventions' names.
fn resource_attributes(
    process: &Process,
    service: &str,
    host: Option<&str>,
    container: Option<String>,
) -> Vec<KeyValue> {
    let kv = |key: &str, value: Value| KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    };
    let mut attributes = vec![
        kv("service.name", Value::String(service.to_string())),
        kv("process.pid", Value::Int(i64::from(process.pid))),
        kv(
            "process.executable.name",
            Value::String(process.name.clone()),
        ),
    ];
    if let Some(host) = host {
        attributes.push(kv("host.name", Value::String(host.to_string())));
    }
    if let Some(id) = container {
        attributes.push(kv("container.id", Value::String(id)));
    }
    attributes
}

/// `service.name` without `OTEL_SERVICE_NAME`: the recorded command's name, else (for
/// `-p` and `-a`) the process's.
fn command_name(profile: &Profile, process: &Process) -> String {
    profile
        .meta
        .command
        .first()
        .and_then(|c| std::path::Path::new(c).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| process.name.clone())
}

/// This machine's name, as the kernel has it.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().to_string()).filter(|n| !n.is_empty())
}

/// The most of `/proc/PID/cgroup` read: 64 KiB, far more than a process's few lines.
const MAX_CGROUP_TEXT: u64 = 64 << 10;

/// The container a process of this run's recording runs in, where its cgroup names one:
/// its own cgroup while it runs; once it has exited, for a recorded command
/// (`command`), sampler's, which the command inherited.
fn container_id(pid: i32, command: bool) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(format!("/proc/{pid}/cgroup"))
        .or_else(|e| match command {
            true => std::fs::File::open("/proc/self/cgroup"),
            false => Err(e),
        })
        .ok()?;
    let mut text = String::new();
    file.take(MAX_CGROUP_TEXT).read_to_string(&mut text).ok()?;
    container_id_in(&text)
}

/// The length of a container ID in a cgroup path: 64 hex digits (Docker, containerd,
/// CRI-O and Podman all name their cgroups by the full ID).
const CONTAINER_ID_LEN: usize = 64;

/// The container ID in the text of a `/proc/PID/cgroup`: the last 64-hex-digit name in a
/// cgroup path (`/docker/ID`, `/system.slice/docker-ID.scope`, `cri-containerd-ID.scope`,
/// `crio-ID`, `libpod-ID`).
fn container_id_in(cgroup: &str) -> Option<String> {
    cgroup.lines().rev().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(|part| {
            let part = part.strip_suffix(".scope").unwrap_or(part);
            let id = part.rsplit(['-', ':']).next()?;
            (id.len() == CONTAINER_ID_LEN && id.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| id.to_ascii_lowercase())
        })
    })
}

/// The dictionary being filled: every table starts with its zero value, which index 0
/// stands for.
struct Dictionary<'p> {
    profile: &'p Profile,
    strings: super::StringTable,
    attributes: Vec<KeyValueAndUnit>,
    attribute_of: HashMap<(i32, Value), i32>,
    mappings: Vec<proto::Mapping>,
    functions: Vec<proto::Function>,
    locations: Vec<proto::Location>,
    location_of: HashMap<Vec<FrameIndex>, i32>,
    stacks: Vec<proto::Stack>,
    stack_of: HashMap<Vec<i32>, i32>,
    /// The stack-table index of each profile stack already turned into one.
    leaf_of: HashMap<StackIndex, i32>,
}

impl<'p> Dictionary<'p> {
    fn new(profile: &'p Profile) -> Dictionary<'p> {
        let mut dict = Dictionary {
            profile,
            strings: super::StringTable::default(),
            attributes: vec![KeyValueAndUnit::default()],
            attribute_of: HashMap::new(),
            mappings: vec![proto::Mapping::default()],
            functions: vec![proto::Function::default()],
            locations: vec![proto::Location::default()],
            location_of: HashMap::new(),
            stacks: vec![proto::Stack::default()],
            stack_of: HashMap::new(),
            leaf_of: HashMap::new(),
        };
        dict.strings.get("");
        // Functions: func i is entry i + 1.
        for func in &profile.funcs {
            let name = dict.string(&func.name);
            let filename_strindex = func.file.as_deref().map_or(0, |f| dict.string(f));
            dict.functions.push(proto::Function {
                name_strindex: name,
                system_name_strindex: name,
                filename_strindex,
                start_line: 0,
            });
        }
        // Mappings: lib i is entry i + 1. Addresses are library-relative, so each covers
        // the addresses its locations use, from 0.
        let mut limits = vec![0u64; profile.libs.len()];
        for frame in &profile.frames {
            if let (Some(lib), Some(address)) = (frame.lib, frame.address) {
                limits[lib.index()] = limits[lib.index()].max(address + 1);
            }
        }
        for (lib, limit) in profile.libs.iter().zip(limits) {
            let filename_strindex = dict.string(&lib.path);
            let attribute_indices = match &lib.build_id {
                Some(id) => {
                    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                    vec![dict.attribute("process.executable.build_id.gnu", Value::String(hex))]
                }
                None => Vec::new(),
            };
            dict.mappings.push(proto::Mapping {
                memory_start: 0,
                memory_limit: limit,
                file_offset: 0,
                filename_strindex,
                attribute_indices,
            });
        }
        dict
    }

    fn string(&mut self, s: &str) -> i32 {
        self.strings.get(s) as i32
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key = self.string(key);
        if let Some(&i) = self.attribute_of.get(&(key, value.clone())) {
            return i;
        }
        let i = self.attributes.len() as i32;
        self.attributes.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue {
                value: Some(value.clone()),
            }),
            unit_strindex: 0,
        });
        self.attribute_of.insert((key, value), i);
        i
    }

    /// The stack-table entry of the profile's stack `leaf`: its locations leaf first.
    fn stack(&mut self, leaf: StackIndex) -> i32 {
        if let Some(&i) = self.leaf_of.get(&leaf) {
            return i;
        }
        let mut locations = Vec::new();
        let mut at = Some(leaf);
        while let Some(start) = at {
            // A location's frames: from the innermost inlined call out to the frame of
            // inline depth 0, whose code address it is.
            let mut frames = Vec::new();
            let mut s = start;
            loop {
                let stack = &self.profile.stacks[s.index()];
                frames.push(stack.frame);
                match stack.prefix {
                    Some(p) if self.profile.frames[stack.frame.index()].inline_depth > 0 => s = p,
                    prefix => {
                        at = prefix;
                        break;
                    }
                }
            }
            locations.push(self.location(frames));
        }
        let next = self.stacks.len() as i32;
        let i = *self.stack_of.entry(locations.clone()).or_insert(next);
        if i == next {
            self.stacks.push(proto::Stack {
                location_indices: locations,
            });
        }
        self.leaf_of.insert(leaf, i);
        i
    }

    /// The location-table entry of a run of frames, innermost first.
    fn location(&mut self, frames: Vec<FrameIndex>) -> i32 {
        if let Some(&i) = self.location_of.get(&frames) {
            return i;
        }
        let profile = self.profile;
        let outer = &profile.frames[frames.last().expect("a location has a frame").index()];
        let frame_type = match outer.kind {
            CodeKind::User => Some("native"),
            CodeKind::Kernel => Some("kernel"),
            CodeKind::Marker => None,
        };
        let attribute_indices = frame_type
            .map(|t| vec![self.attribute("profile.frame.type", Value::String(t.to_string()))])
            .unwrap_or_default();
        let lines = frames
            .iter()
            .map(|f| {
                let frame = &profile.frames[f.index()];
                proto::Line {
                    function_index: frame.func.index() as i32 + 1,
                    line: frame.line.map_or(0, i64::from),
                    column: 0,
                }
            })
            .collect();
        let i = self.locations.len() as i32;
        self.locations.push(proto::Location {
            mapping_index: outer.lib.map_or(0, |l| l.index() as i32 + 1),
            address: outer.address.unwrap_or(0),
            lines,
            attribute_indices,
        });
        self.location_of.insert(frames, i);
        i
    }

    fn finish(self) -> proto::ProfilesDictionary {
        proto::ProfilesDictionary {
            mapping_table: self.mappings,
            location_table: self.locations,
            function_table: self.functions,
            link_table: vec![proto::Link::default()],
            string_table: self.strings.into_list(),
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_id_is_found_in_the_usual_cgroup_paths() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for text in [
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("12:memory:/docker/{id}\n0::/\n"),
            format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope\n"),
            format!("0::/machine.slice/libpod-{id}.scope/container\n"),
        ] {
            assert_eq!(container_id_in(&text).as_deref(), Some(id), "{text}");
        }
        assert_eq!(
            container_id_in("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(container_id_in(""), None);
    }
}
