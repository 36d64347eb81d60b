//! The worked examples of docs/design.md §3, through the public pipeline and without privileges:
//! seed 003 (stack interning and func grouping) from a synthetic recording.

use sampler::calltree::CallTree;
use sampler::events::{Event, EventKind, Mapping, Recording, RecordingInfo, Sample};
use sampler::profile::{self, CodeKind};
use sampler::symbolicate::{self, LibSymbols, Symbol, SymbolMap};

/// The library is mapped at this address, and the file does not exist, so lib-relative
/// addresses are file offsets: seed addresses are `BASE + 0x..`.
const BASE: u64 = 0x5000_0000;

fn sample(time_ns: u64, user_leaf_first: &[u64]) -> Event {
    Event {
        time_ns,
        kind: EventKind::Sample(Sample {
            pid: 10,
            tid: 10,
            user_callchain: user_leaf_first.to_vec(),
            ..Sample::default()
        }),
    }
}

fn mapping(path: &str, file_offset: u64) -> Event {
    let m = Mapping {
        pid: 10,
        start: BASE,
        len: 0x1000,
        file_offset,
        path: path.into(),
        file: None,
        executable: true,
    };
    Event {
        time_ns: 0,
        kind: EventKind::Mmap(m),
    }
}

fn recording(events: Vec<Event>) -> Recording {
    let info = RecordingInfo {
        end_ns: events.last().map_or(0, |e| e.time_ns + 1_000_000),
        kernel_included: false,
        root_pid: 10,
        ..RecordingInfo::example()
    };
    Recording { info, events }
}

fn seed_003_interning_and_func_grouping() {
    // Leaf first. Caller entries are return addresses: the call at 0x03 returns to 0x04.
    let rec = recording(vec![
        mapping("/nonexistent/seed003/app", 0),
        sample(1_000_000, &[BASE + 0x02]),
        sample(2_000_000, &[BASE + 0x11, BASE + 0x04]),
        sample(3_000_000, &[BASE + 0x11, BASE + 0x0a]),
        sample(4_000_000, &[BASE + 0x15, BASE + 0x07]),
        sample(5_000_000, &[BASE + 0x11, BASE + 0x04]),
    ]);
    let raw = sampler::replay::build(&rec).profile;

    // Frames: 0x02, 0x03, 0x11, 0x09, 0x06, 0x15 (callers at return address - 1).
    let mut addresses: Vec<u64> = raw.address_frames.iter().map(|f| f.address).collect();
    addresses.sort();
    assert_eq!(addresses, vec![0x02, 0x03, 0x06, 0x09, 0x11, 0x15]);
    assert!(raw
        .address_frames
        .iter()
        .all(|f| f.kind == CodeKind::User && f.lib.is_some()));
    // Stacks: 0x02; 0x03; 0x03>0x11; 0x09; 0x09>0x11; 0x06; 0x06>0x15. The repeated
    // sample reuses its stack.
    assert_eq!(raw.stacks.len(), 7);
    for (i, s) in raw.stacks.iter().enumerate() {
        assert!(
            s.prefix.is_none_or(|p| p.index() < i),
            "prefix after its stack"
        );
    }
    assert_eq!(
        raw.threads[0].samples[1].stack,
        raw.threads[0].samples[4].stack
    );
    assert_eq!(raw.threads[0].samples[2].time_ms, 3.0);

    let sym = |address, name: &str| Symbol {
        address,
        size: None,
        name: name.into(),
    };
    let symbols = SymbolMap::new(vec![
        sym(0x01, "main"),
        sym(0x0f, "doSomething"),
        sym(0x14, "someInterlude"),
    ]);
    let p = symbolicate::apply(
        raw,
        &[Ok(LibSymbols {
            symbols,
            ..LibSymbols::default()
        })],
    );
    assert_eq!(p.funcs.len(), 3, "one func per function, not per address");
    let tree = CallTree::all_threads(&p);
    assert_eq!(
        tree.to_compact_string(),
        "main:5,1 > { doSomething:3,3 ; someInterlude:1,1 }"
    );
    assert!(p.symbol_gaps.is_empty());
}

fn address_without_symbol_stays_hex_and_lib_is_reported() {
    let rec = recording(vec![
        mapping("/nonexistent/lib.so", 0x2000),
        sample(1_000_000, &[BASE + 0x10]),
    ]);
    let p = symbolicate::apply(
        sampler::replay::build(&rec).profile,
        &[Err("the file cannot be read".into())],
    );
    assert_eq!(p.funcs[0].name, "0x2010");
    let gap = &p.symbol_gaps[0];
    assert_eq!(p.libs[gap.lib.index()].name, "lib.so");
    assert_eq!(gap.missing, profile::Missing::Symbols);
    assert_eq!(gap.why, "the file cannot be read");
}

/// A thread's next sample interns only what differs from its last one; a library mapped
/// anew in between changes what the same addresses are, and the shared part is not
/// reused.
fn a_remapping_between_samples_renames_the_shared_frames() {
    let rec = recording(vec![
        mapping("/nonexistent/first/app", 0),
        sample(1_000_000, &[BASE + 0x11, BASE + 0x04]),
        sample(2_000_000, &[BASE + 0x15, BASE + 0x04]),
        mapping("/nonexistent/second/app", 0x2000),
        sample(3_000_000, &[BASE + 0x11, BASE + 0x04]),
    ]);
    let raw = sampler::replay::build(&rec).profile;
    let samples = &raw.threads[0].samples;
    let frames = |stack: profile::RawStackIndex| {
        let mut out = Vec::new();
        let mut at = Some(stack);
        while let Some(s) = at {
            let s = &raw.stacks[s.index()];
            let f = &raw.address_frames[s.frame.index()];
            out.push((raw.libs[f.lib.unwrap().index()].path.clone(), f.address));
            at = s.prefix;
        }
        out
    };
    let first = "/nonexistent/first/app".to_string();
    let second = "/nonexistent/second/app".to_string();
    assert_eq!(
        frames(samples[0].stack),
        [(first.clone(), 0x11), (first.clone(), 0x03)]
    );
    // The caller is shared with the sample before.
    assert_eq!(
        frames(samples[1].stack),
        [(first.clone(), 0x15), (first, 0x03)]
    );
    assert_eq!(
        frames(samples[2].stack),
        [(second.clone(), 0x2011), (second, 0x2003)]
    );
}

/// What the unwinder knows of a process is dropped once its main thread has exited and
/// nothing of it has come for half a second (event time); a thread that outlives the
/// main thread keeps it for as long as it is sampled.
fn an_exited_process_is_forgotten_after_its_last_event() {
    use sampler::replay::ProfileBuilder;
    let of = |time_ns: u64, pid: i32, tid: i32| Event {
        time_ns,
        kind: EventKind::Sample(Sample {
            pid,
            tid,
            user_callchain: vec![BASE + 0x11],
            ..Sample::default()
        }),
    };
    let ms = 1_000_000;
    let exit = Event {
        time_ns: 2 * ms,
        kind: EventKind::Exit { pid: 10, tid: 10 },
    };
    let mut builder = ProfileBuilder::new(sampler::unwind::UnwindMode::Fp);
    // Each batch is fed as recording hands them on; pid 99 is another process.
    let batches = [
        vec![
            mapping("/nonexistent/app", 0),
            of(ms, 10, 10),
            of(ms, 10, 11),
        ],
        vec![exit],
        vec![of(400 * ms, 10, 11)],
        vec![of(800 * ms, 99, 99)],
        vec![of(850 * ms, 10, 11)],
        vec![of(1400 * ms, 99, 99)],
        vec![of(1401 * ms, 10, 11)],
    ];
    for batch in &batches {
        builder.add_events(batch);
    }
    let rec = recording(batches.concat());
    let raw = builder.finish(&rec.info).profile;
    let thread = raw.threads.iter().find(|t| t.tid == 11).unwrap();
    let leaf_lib: Vec<bool> = thread
        .samples
        .iter()
        .map(|s| {
            let frame = raw.stacks[s.stack.index()].frame;
            raw.address_frames[frame.index()].lib.is_some()
        })
        .collect();
    // Known at 1 ms, 400 ms (within 500 ms of the exit) and 850 ms (within 500 ms of
    // the sample at 400); forgotten by 1,401 ms, 551 ms after the last one.
    assert_eq!(leaf_lib, [true, true, true, false]);
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        seed_003_interning_and_func_grouping;
        address_without_symbol_stays_hex_and_lib_is_reported;
        a_remapping_between_samples_renames_the_shared_frames;
        an_exited_process_is_forgotten_after_its_last_event;
    ]
}
