//! Off-CPU time: the intervals in which a followed thread was switched out, each with the
//! stack at which it left the CPU and whether it blocked (waited on a lock, I/O, a sleep,
//! a pipe) or was preempted while it could still run. Built from the context switches
//! recording sees, in time order: a switch out (the `PERF_RECORD_SWITCH` record, which
//! says whether the thread was preempted, and the context-switch sample, which carries
//! the stack; they come in either order, at the same moment), the switch back in, the
//! thread's samples (it ran: a switch in was lost), and its exit.
//!
//! Pure bookkeeping over plain values, generic over what a stack is, so that the rules
//! below are tested on synthetic sequences:
//! - out, then in: one interval, from the switch out to the switch in;
//! - out, then a sample of the thread, or another switch out: the switch in was lost,
//!   and the interval ends there;
//! - out, then the thread's exit: the interval ends at the exit;
//! - out, and nothing until the recording ends: the interval ends with the recording;
//! - in without an out, for a thread that existed when recording started (`-p`): it was
//!   blocked from the start, at a stack no switch-out showed;
//! - such a thread never seen at all was blocked from the start to the end.
//!
//! `OffCpu` is the replay's side of it: the tracker over interned stacks, and the time
//! of intervals whose stack was not taken, shared out at the end.

use std::collections::{HashMap, HashSet};

use crate::events::Scope;
use crate::profile::{OffCpuKind, RawStackIndex};

use super::threads::OffCpuRow;

/// One interval off the CPU. Times are CLOCK_MONOTONIC ns, `start_ns <= end_ns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffCpuInterval<S> {
    pub tid: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// `None` when no record said (the switch-out record was lost): counted as blocked.
    pub kind: Option<OffCpuKind>,
    /// The stack at which it left the CPU; `None` when no switch-out sample showed it
    /// (blocked since before the recording, or the sample was lost).
    pub stack: Option<S>,
}

impl<S> OffCpuInterval<S> {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// A thread that is switched out now: since when, and what is known of why and where.
#[derive(Debug)]
struct Pending<S> {
    since_ns: u64,
    kind: Option<OffCpuKind>,
    stack: Option<S>,
}

/// The threads switched out now, and the intervals that ended.
#[derive(Debug)]
pub struct OffCpuTracker<S> {
    start_ns: u64,
    /// Threads that existed when recording started and have not been seen since: a
    /// switch in of one of them ends a block that began before the recording.
    unseen_at_start: HashSet<i32>,
    out: HashMap<i32, Pending<S>>,
    done: Vec<OffCpuInterval<S>>,
    /// Threads that exited (and whose tid was not reused since): per-CPU events see
    /// such a thread's last switch away, in `do_task_dead`, which starts no interval.
    exited: HashSet<i32>,
}

impl<S> OffCpuTracker<S> {
    /// A tracker for a recording that starts at `start_ns`, of which `existing` threads
    /// were already running (attached to; empty for a launched command).
    pub fn new(start_ns: u64, existing: impl IntoIterator<Item = i32>) -> OffCpuTracker<S> {
        OffCpuTracker {
            start_ns,
            unseen_at_start: existing.into_iter().collect(),
            out: HashMap::new(),
            done: Vec::new(),
            exited: HashSet::new(),
        }
    }

    /// A thread `tid` was created (perhaps under the tid of one that exited).
    pub fn born(&mut self, tid: i32) {
        self.exited.remove(&tid);
    }

    /// When the recording started.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// `tid` was there when recording started (described as `-p` attached).
    pub fn existed_at_start(&mut self, tid: i32) {
        self.unseen_at_start.insert(tid);
    }

    /// The switch-out record of `tid` at `time_ns`: `preempted` when the thread could
    /// still run.
    pub fn switch_out(&mut self, tid: i32, time_ns: u64, preempted: bool) {
        let kind = match preempted {
            true => OffCpuKind::Preempted,
            false => OffCpuKind::Blocked,
        };
        // The record is written as the thread leaves the CPU; the sample is taken a few
        // microseconds before, and taking it (the callchain, the stack copy) is time the
        // thread spent on the CPU. So the interval starts at the record.
        self.out_part(
            tid,
            time_ns,
            |p| p.kind.is_none(),
            |p| {
                p.kind = Some(kind);
                p.since_ns = p.since_ns.max(time_ns);
            },
        );
    }

    /// The stack `tid` left the CPU at, `time_ns` (the context-switch sample).
    pub fn switch_out_stack(&mut self, tid: i32, time_ns: u64, stack: S) {
        let mut stack = Some(stack);
        self.out_part(
            tid,
            time_ns,
            |p| p.stack.is_none(),
            |p| p.stack = stack.take(),
        );
    }

    /// One half of a switch out: completes the pending switch out of `tid` when that
    /// one lacks this half (`lacks`) and is of the same moment, else ends it (a switch in
    /// was lost) and starts another.
    fn out_part(
        &mut self,
        tid: i32,
        time_ns: u64,
        lacks: impl Fn(&Pending<S>) -> bool,
        mut fill: impl FnMut(&mut Pending<S>),
    ) {
        self.unseen_at_start.remove(&tid);
        if self.exited.contains(&tid) {
            return;
        }
        if let Some(pending) = self.out.get_mut(&tid) {
            if lacks(pending) && time_ns.abs_diff(pending.since_ns) <= SAME_SWITCH_NS {
                fill(pending);
                return;
            }
            self.end(tid, time_ns);
        }
        let mut pending = Pending {
            since_ns: time_ns,
            kind: None,
            stack: None,
        };
        fill(&mut pending);
        self.out.insert(tid, pending);
    }

    /// `tid` was switched back in at `time_ns`.
    pub fn switch_in(&mut self, tid: i32, time_ns: u64) {
        if self.unseen_at_start.remove(&tid) && !self.out.contains_key(&tid) {
            self.done.push(OffCpuInterval {
                tid,
                start_ns: self.start_ns,
                end_ns: time_ns.max(self.start_ns),
                kind: Some(OffCpuKind::Blocked),
                stack: None,
            });
            return;
        }
        self.end(tid, time_ns);
    }

    /// A sample showed `tid` running at `time_ns`: if it was out, its switch in was lost.
    pub fn ran(&mut self, tid: i32, time_ns: u64) {
        self.unseen_at_start.remove(&tid);
        self.end(tid, time_ns);
    }

    /// `tid` exited at `time_ns`.
    pub fn exit(&mut self, tid: i32, time_ns: u64) {
        self.unseen_at_start.remove(&tid);
        self.exited.insert(tid);
        self.end(tid, time_ns);
    }

    /// Ends the pending interval of `tid`, if any, at `time_ns`.
    fn end(&mut self, tid: i32, time_ns: u64) {
        if let Some(p) = self.out.remove(&tid) {
            self.done.push(OffCpuInterval {
                tid,
                start_ns: p.since_ns,
                end_ns: time_ns.max(p.since_ns),
                kind: p.kind,
                stack: p.stack,
            });
        }
    }

    /// The intervals that ended so far, handed over (in the order they ended).
    pub fn take_done(&mut self) -> Vec<OffCpuInterval<S>> {
        std::mem::take(&mut self.done)
    }

    /// Forgets the threads that existed at the start and have not been seen since: in a
    /// recording of the whole machine, the hundreds of threads that slept throughout are
    /// not what it is about (and would each get an interval of the whole recording).
    pub fn forget_unseen(&mut self) {
        self.unseen_at_start.clear();
    }

    /// Every interval not yet handed over, once the recording ended at `end_ns`: those
    /// still open end there, and threads that existed at the start and were never seen
    /// since (asleep throughout, at a stack no switch out showed) were blocked from the
    /// start to the end.
    pub fn finish(&mut self, end_ns: u64) -> Vec<OffCpuInterval<S>> {
        let mut open: Vec<i32> = self.out.keys().copied().collect();
        open.sort_unstable();
        for tid in open {
            self.end(tid, end_ns);
        }
        let mut asleep: Vec<i32> = self.unseen_at_start.drain().collect();
        asleep.sort_unstable();
        for tid in asleep {
            self.done.push(OffCpuInterval {
                tid,
                start_ns: self.start_ns,
                end_ns: end_ns.max(self.start_ns),
                kind: Some(OffCpuKind::Blocked),
                stack: None,
            });
        }
        std::mem::take(&mut self.done)
    }
}

/// How far apart the two halves of one switch out (its record and its sample) may be
/// stamped: 100 µs. The kernel writes both within the same call into the scheduler,
/// microseconds apart; a thread cannot block, run and block again in that time.
const SAME_SWITCH_NS: u64 = 100_000;

/// Off-CPU time while it is recorded (`--off-cpu`).
pub(super) struct OffCpu {
    /// Created at the first event: its time is the start of the recording.
    tracker: Option<OffCpuTracker<RawStackIndex>>,
    /// The stack of every `switch_period`th switch out was taken.
    switch_period: u64,
    /// Per thread, the off-CPU time (ns) of intervals without a stack, by kind, when
    /// not every switch's stack is taken: shared out at the end over the thread's
    /// intervals of that kind with a stack, in proportion to their durations.
    unstacked: HashMap<i32, [u64; 2]>,
}

/// Where an interval off the CPU goes (see [`OffCpu::place`]).
pub(super) enum Placed {
    /// A row of thread `tid`, at its stack or, when `None`, the unknown-stack marker's.
    Row {
        tid: i32,
        start_ns: u64,
        stack: Option<RawStackIndex>,
        kind: OffCpuKind,
        ns: u64,
    },
    /// Its time was added to the thread's time without a stack.
    SharedOut,
}

impl OffCpu {
    /// The stack of every `switch_period`th switch out is taken.
    pub(super) fn new(switch_period: u64) -> OffCpu {
        OffCpu {
            tracker: None,
            switch_period: switch_period.max(1),
            unstacked: HashMap::new(),
        }
    }

    /// The recording's events start at `time_ns`, or started before.
    pub(super) fn started(&mut self, time_ns: u64) {
        self.tracker
            .get_or_insert_with(|| OffCpuTracker::new(time_ns, []));
    }

    /// The tracker, once the first event came.
    pub(super) fn tracker(&mut self) -> Option<&mut OffCpuTracker<RawStackIndex>> {
        self.tracker.as_mut()
    }

    /// Thread `tid` was named at `time_ns`, `first_sight` when nothing of it came before
    /// and not by an exec: at the start, it is a thread described as it was when `-p`
    /// attached.
    pub(super) fn described(&mut self, tid: i32, time_ns: u64, first_sight: bool) {
        if let Some(tracker) = &mut self.tracker {
            if first_sight && time_ns <= tracker.start_ns() {
                tracker.existed_at_start(tid);
            }
        }
    }

    /// The intervals that ended so far.
    pub(super) fn take_done(&mut self) -> Vec<OffCpuInterval<RawStackIndex>> {
        match &mut self.tracker {
            Some(tracker) => tracker.take_done(),
            None => Vec::new(),
        }
    }

    /// When the tracking started (0 before the first event).
    pub(super) fn start_ns(&self) -> u64 {
        self.tracker.as_ref().map_or(0, |t| t.start_ns())
    }

    /// Where one interval goes. Without a stack: when not every switch's stack is taken,
    /// its time is shared out at the end (see [`OffCpu::unstacked`]); else (a lost
    /// sample, a thread blocked since before `-p` attached) it is shown under the
    /// unknown-stack marker.
    pub(super) fn place(&mut self, interval: OffCpuInterval<RawStackIndex>) -> Placed {
        let start = self.start_ns();
        let kind = interval.kind.unwrap_or(OffCpuKind::Blocked);
        let ns = interval.duration_ns();
        if interval.stack.is_none() && self.switch_period > 1 && interval.start_ns > start {
            self.unstacked.entry(interval.tid).or_default()[kind.index()] += ns;
            return Placed::SharedOut;
        }
        Placed::Row {
            tid: interval.tid,
            start_ns: interval.start_ns,
            stack: interval.stack,
            kind,
            ns,
        }
    }

    /// Every interval still open at `end_ns` (the end of the recording), including those
    /// of threads asleep since before `-p` attached and never seen since (not for the
    /// whole machine, where they are most threads).
    pub(super) fn finish(
        &mut self,
        end_ns: u64,
        scope: Scope,
    ) -> Vec<OffCpuInterval<RawStackIndex>> {
        let Some(tracker) = &mut self.tracker else {
            return Vec::new();
        };
        if scope == Scope::System {
            tracker.forget_unseen();
        }
        tracker.finish(end_ns)
    }

    /// Takes the time without a stack, per thread in the order of their tids.
    pub(super) fn take_unstacked(&mut self) -> Vec<(i32, [u64; 2])> {
        let mut unstacked: Vec<(i32, [u64; 2])> =
            std::mem::take(&mut self.unstacked).into_iter().collect();
        unstacked.sort_unstable_by_key(|(tid, _)| *tid);
        unstacked
    }
}

/// Shares out `extra` ns of a thread's `kind` of off-CPU time without a stack over its
/// `rows` of that kind, in proportion to their durations, which keeps the thread's total
/// exact; when it has none, a row at `start_ns` at the stack `unknown` gives holds it.
pub(super) fn share_out(
    rows: &mut Vec<OffCpuRow>,
    kind: OffCpuKind,
    extra: u64,
    start_ns: u64,
    unknown: impl FnOnce() -> RawStackIndex,
) {
    if extra == 0 {
        return;
    }
    let stacked: u64 = rows.iter().filter(|r| r.2 == kind).map(|r| r.3).sum();
    if stacked == 0 {
        rows.push((start_ns, unknown(), kind, extra));
        return;
    }
    let scale = (stacked + extra) as f64 / stacked as f64;
    for row in rows.iter_mut().filter(|r| r.2 == kind) {
        row.3 = (row.3 as f64 * scale).round() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgotten_sleepers_get_no_interval() {
        let mut t: OffCpuTracker<u32> = OffCpuTracker::new(0, [1, 2]);
        t.switch_in(1, 5 * MS);
        t.forget_unseen();
        let done = t.finish(10 * MS);
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!((done[0].tid, done[0].end_ns), (1, 5 * MS));
    }

    const MS: u64 = 1_000_000;

    fn interval(
        tid: i32,
        start_ms: u64,
        end_ms: u64,
        kind: Option<OffCpuKind>,
        stack: Option<&'static str>,
    ) -> OffCpuInterval<&'static str> {
        OffCpuInterval {
            tid,
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
            kind,
            stack,
        }
    }

    /// Both halves of one switch out of `tid`, the record and the sample with `stack`.
    fn left(
        t: &mut OffCpuTracker<&'static str>,
        tid: i32,
        time_ns: u64,
        preempted: bool,
        stack: &'static str,
    ) {
        t.switch_out(tid, time_ns, preempted);
        t.switch_out_stack(tid, time_ns, stack);
    }

    #[test]
    fn a_switch_out_then_in_is_one_interval_with_its_stack() {
        let mut t = OffCpuTracker::new(0, []);
        left(&mut t, 7, 10 * MS, false, "futex_wait");
        t.switch_in(7, 25 * MS);
        assert_eq!(
            t.finish(100 * MS),
            [interval(
                7,
                10,
                25,
                Some(OffCpuKind::Blocked),
                Some("futex_wait")
            )]
        );
    }

    #[test]
    fn the_sample_may_come_before_the_record_and_a_little_apart() {
        // The interval starts at the record: taking the sample was time on the CPU.
        let mut t = OffCpuTracker::new(0, []);
        t.switch_out_stack(7, 10 * MS, "pipe_read");
        t.switch_out(7, 10 * MS + 3_000, true);
        t.switch_in(7, 12 * MS);
        let mut expected = interval(7, 10, 12, Some(OffCpuKind::Preempted), Some("pipe_read"));
        expected.start_ns += 3_000;
        assert_eq!(t.finish(100 * MS), [expected]);
        // The other order: the record first, then its sample.
        let mut t = OffCpuTracker::new(0, []);
        t.switch_out(7, 10 * MS, false);
        t.switch_out_stack(7, 10 * MS + 2_000, "pipe_read");
        t.switch_in(7, 12 * MS);
        let expected = interval(7, 10, 12, Some(OffCpuKind::Blocked), Some("pipe_read"));
        assert_eq!(t.finish(100 * MS), [expected]);
    }

    #[test]
    fn preemption_is_told_apart_from_blocking() {
        let mut t = OffCpuTracker::new(0, []);
        left(&mut t, 1, 0, true, "compute");
        t.switch_in(1, 2 * MS);
        left(&mut t, 1, 5 * MS, false, "do_nanosleep");
        t.switch_in(1, 35 * MS);
        let kinds: Vec<_> = t
            .finish(40 * MS)
            .iter()
            .map(|i| (i.kind, i.duration_ns()))
            .collect();
        assert_eq!(
            kinds,
            [
                (Some(OffCpuKind::Preempted), 2 * MS),
                (Some(OffCpuKind::Blocked), 30 * MS)
            ]
        );
    }

    #[test]
    fn a_lost_switch_in_ends_at_the_next_sample_or_switch_out() {
        let mut t = OffCpuTracker::new(0, []);
        left(&mut t, 3, 10 * MS, false, "a");
        t.ran(3, 14 * MS);
        left(&mut t, 3, 20 * MS, false, "b");
        // Its switch in is lost, and it blocks again.
        left(&mut t, 3, 30 * MS, false, "c");
        t.switch_in(3, 31 * MS);
        assert_eq!(
            t.finish(100 * MS),
            [
                interval(3, 10, 14, Some(OffCpuKind::Blocked), Some("a")),
                interval(3, 20, 30, Some(OffCpuKind::Blocked), Some("b")),
                interval(3, 30, 31, Some(OffCpuKind::Blocked), Some("c")),
            ]
        );
    }

    #[test]
    fn a_thread_exiting_while_switched_out_ends_its_interval_at_the_exit() {
        let mut t = OffCpuTracker::new(0, []);
        left(&mut t, 4, 10 * MS, false, "wait");
        t.exit(4, 50 * MS);
        // Nothing of it is open when the recording ends.
        assert_eq!(
            t.finish(100 * MS),
            [interval(4, 10, 50, Some(OffCpuKind::Blocked), Some("wait"))]
        );
    }

    #[test]
    fn a_thread_switching_away_after_its_exit_starts_nothing_until_its_tid_is_reused() {
        let mut t = OffCpuTracker::new(0, []);
        t.exit(4, 50 * MS);
        // Per-CPU events see its last switch away, in do_task_dead.
        left(&mut t, 4, 51 * MS, false, "do_task_dead");
        assert_eq!(t.finish(100 * MS), []);
        let mut t = OffCpuTracker::new(0, []);
        t.exit(4, 50 * MS);
        t.born(4);
        left(&mut t, 4, 60 * MS, false, "wait");
        assert_eq!(
            t.finish(100 * MS),
            [interval(
                4,
                60,
                100,
                Some(OffCpuKind::Blocked),
                Some("wait")
            )]
        );
    }

    #[test]
    fn a_thread_still_out_at_the_end_is_out_until_the_end() {
        let mut t = OffCpuTracker::new(0, []);
        left(&mut t, 5, 10 * MS, false, "sleep");
        t.switch_out(6, 20 * MS, false);
        assert_eq!(
            t.finish(100 * MS),
            [
                interval(5, 10, 100, Some(OffCpuKind::Blocked), Some("sleep")),
                interval(6, 20, 100, Some(OffCpuKind::Blocked), None),
            ]
        );
    }

    #[test]
    fn a_thread_blocked_when_attached_to_is_blocked_from_the_start() {
        let mut t = OffCpuTracker::new(5 * MS, [10, 11, 12]);
        // 10 was blocked when recording started; 11 runs first (a sample), so its later
        // switch in ends a block that began in the recording; 12 is never seen.
        t.switch_in(10, 40 * MS);
        t.ran(11, 6 * MS);
        t.switch_out(11, 7 * MS, false);
        t.switch_in(11, 9 * MS);
        assert_eq!(
            t.finish(100 * MS),
            [
                interval(10, 5, 40, Some(OffCpuKind::Blocked), None),
                interval(11, 7, 9, Some(OffCpuKind::Blocked), None),
                // 12 was asleep throughout: blocked from the start to the end.
                interval(12, 5, 100, Some(OffCpuKind::Blocked), None),
            ]
        );
    }

    #[test]
    fn a_new_threads_first_switch_in_is_no_interval() {
        let mut t: OffCpuTracker<&str> = OffCpuTracker::new(0, []);
        t.switch_in(9, 3 * MS);
        assert!(t.finish(10 * MS).is_empty());
    }

    #[test]
    fn the_switches_of_50_30_20_add_up_to_the_shares() {
        // A thread that computes 50 ms, sleeps 30 ms and waits on a mutex 20 ms, in
        // slices: what it is off the CPU for, by stack, is exactly the sleep and the wait.
        let mut t = OffCpuTracker::new(0, []);
        let mut now = 0;
        for _ in 0..10 {
            now += 5 * MS;
            left(&mut t, 1, now, false, "do_nanosleep");
            now += 3 * MS;
            t.switch_in(1, now);
            left(&mut t, 1, now, false, "futex_wait");
            now += 2 * MS;
            t.switch_in(1, now);
        }
        let mut by_stack: HashMap<&str, u64> = HashMap::new();
        for i in t.finish(now) {
            *by_stack.entry(i.stack.unwrap()).or_default() += i.duration_ns();
        }
        assert_eq!(by_stack["do_nanosleep"], 30 * MS);
        assert_eq!(by_stack["futex_wait"], 20 * MS);
    }

    /// The replay's side, fed hand-built switch events through the builder.
    mod replayed {
        use super::MS;
        use crate::events::{Event, EventKind, Sample, Scope};
        use crate::profile::{OffCpuKind, RawStackIndex};
        use crate::replay::offcpu::share_out;
        use crate::replay::tests::{at, fork};
        use crate::replay::ProfileBuilder;
        use crate::unwind::UnwindMode;

        fn out(time_ns: u64, preempted: bool) -> Event {
            let (pid, tid) = (10, 10);
            at(
                time_ns,
                EventKind::SwitchOut {
                    pid,
                    tid,
                    preempted,
                },
            )
        }

        fn stack(time_ns: u64) -> Event {
            let s = Sample {
                pid: 10,
                tid: 10,
                user_callchain: vec![0x1000],
                ..Sample::default()
            };
            at(time_ns, EventKind::SwitchSample(s))
        }

        fn back(time_ns: u64) -> Event {
            at(time_ns, EventKind::SwitchIn { pid: 10, tid: 10 })
        }

        /// The thread's off-CPU rows as (start ms, stack, kind, ms).
        fn rows(b: &ProfileBuilder) -> Vec<(u64, RawStackIndex, OffCpuKind, u64)> {
            let rows = &b.threads.threads[0].off_cpu;
            rows.iter()
                .map(|&(t, stack, kind, ns)| (t / MS, stack, kind, ns / MS))
                .collect()
        }

        #[test]
        fn a_switch_out_and_back_is_a_row_at_the_stack_it_left_at() {
            let mut b = ProfileBuilder::new(UnwindMode::Fp);
            b.record_off_cpu(1);
            b.add_events(&[
                fork(0, 10, 10),
                stack(10 * MS),
                out(10 * MS, true),
                back(25 * MS),
                // A switch in without a switch out starts nothing.
                back(40 * MS),
                // A switch out whose sample was lost: at the unknown stack.
                out(50 * MS, false),
            ]);
            b.add_events(&[back(52 * MS)]);
            let unknown = RawStackIndex::new(1);
            assert_eq!(b.stacks.unknown_off_cpu(), unknown);
            let left = RawStackIndex::new(0);
            assert_eq!(
                rows(&b),
                [
                    (10, left, OffCpuKind::Preempted, 15),
                    (50, unknown, OffCpuKind::Blocked, 2)
                ]
            );
        }

        #[test]
        fn time_without_a_stack_is_shared_out_when_not_every_stack_is_taken() {
            let mut b = ProfileBuilder::new(UnwindMode::Fp);
            b.record_off_cpu(2);
            b.add_events(&[
                fork(0, 10, 10),
                stack(10 * MS),
                out(10 * MS, false),
                back(20 * MS),
                // Its stack was not taken: its 5 ms go to the 10 ms with a stack.
                out(30 * MS, false),
                back(35 * MS),
                // Still out when the recording ends.
                out(90 * MS, true),
            ]);
            assert_eq!(rows(&b).len(), 1);
            b.finish_off_cpu(100 * MS, Scope::Tasks);
            let left = RawStackIndex::new(0);
            let unknown = RawStackIndex::new(1);
            assert_eq!(
                rows(&b),
                [
                    (10, left, OffCpuKind::Blocked, 15),
                    // No preempted time had a stack: it is shown at the marker.
                    (0, unknown, OffCpuKind::Preempted, 10)
                ]
            );
        }

        #[test]
        fn sharing_out_keeps_the_total_and_the_proportions() {
            let (a, b) = (RawStackIndex::new(3), RawStackIndex::new(4));
            let blocked = OffCpuKind::Blocked;
            let preempted = OffCpuKind::Preempted;
            let mut rows = vec![
                (0, a, blocked, 10),
                (5, b, blocked, 30),
                (7, a, preempted, 4),
            ];
            share_out(&mut rows, blocked, 40, 0, || unreachable!());
            share_out(&mut rows, preempted, 0, 0, || unreachable!());
            assert_eq!(
                rows,
                [
                    (0, a, blocked, 20),
                    (5, b, blocked, 60),
                    (7, a, preempted, 4)
                ]
            );
        }
    }
}
