// SPDX-License-Identifier: GPL-2.0 OR MIT
//
// sampler's kernel unwinder: an eBPF program attached to the sampling events that walks
// each sample's user stack at the sample, by the unwind tables sampler compiles from the
// mapped files' call frame information (src/unwind/table: Row::to_bytes is the layout
// of `struct row`, Row::step the rules followed here), and writes the walked sample into
// the CPU's perf ring, beside the perf samples (as the raw data of a sample of the CPU's
// `bpf-output` event, whose output sampler points at that ring): its kernel frames (the
// kernel's callchain), then its user frames, leaf first.
//
// A walk that reaches a thread's outermost frame (or a step that does not move up the
// stack: a loop) is sent here and the perf sample is dropped (the program returns 0), as
// is a sample of a process sampler has said it does not follow (`strangers`).
// Any other walk (a mapping or row the tables do not have yet, a rule the walker cannot
// follow, memory it cannot read, the frame limit) sends nothing: the program returns 1
// and the perf sample, with its stack copy and the kernel's frame-pointer chain, goes
// to sampler's user-space unwinder as without this program. Each ending is counted by
// reason. Where what was missing may be what sampler has yet to read, the program also
// wakes sampler (`wake_sampler`).
//
// Built by build.rs with `clang -target bpf`, against the kernel's UAPI headers only
// (no vmlinux.h, no libbpf headers): the few helpers used are declared below.

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <asm/ptrace.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name
#define __array(name, val) __typeof__(val) *name[]
#define INLINE static inline __attribute__((always_inline))

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *src) =
	(void *)BPF_FUNC_probe_read_user;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) =
	(void *)BPF_FUNC_probe_read_kernel;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)BPF_FUNC_get_current_pid_tgid;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static __u32 (*bpf_get_smp_processor_id)(void) = (void *)BPF_FUNC_get_smp_processor_id;
static long (*bpf_get_stack)(void *ctx, void *buf, __u32 size, __u64 flags) =
	(void *)BPF_FUNC_get_stack;
static long (*bpf_perf_event_output)(void *ctx, void *map, __u64 flags, void *data, __u64 size) =
	(void *)BPF_FUNC_perf_event_output;
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx, __u64 flags) =
	(void *)BPF_FUNC_loop;
struct task_struct;
static struct task_struct *(*bpf_get_current_task_btf)(void) =
	(void *)BPF_FUNC_get_current_task_btf;
static struct pt_regs *(*bpf_task_pt_regs)(struct task_struct *task) =
	(void *)BPF_FUNC_task_pt_regs;

// The most user frames a walk takes: sampler's default --max-stack (the bound:
// at least 1,000). With MAX_KERNEL, a record of 4,224 frames (34 KB) stays within a perf
// record's 64 KiB.
#define MAX_FRAMES 4096
// The most kernel frames kept: the kernel's own callchain limit, perf_event_max_stack,
// is 127 by default.
#define MAX_KERNEL 128
// Slots of a record's frames: a power of two at least MAX_KERNEL + MAX_FRAMES, so that
// an index masked with SLOTS - 1 is in bounds for the verifier.
#define SLOTS 8192
// unwind::table::SEARCH_STEPS: enough for MAX_ROWS = 2^22 rows.
#define SEARCH_STEPS 23
// Steps of the search among one process's mappings: enough for the loader's 256.
#define MAPPING_STEPS 9
// A user frame's address with this bit set is an instruction where a signal interrupted
// the code (looked up as it is), not a return address. User addresses are below 2^47.
#define INTERRUPTED_BIT (1ULL << 63)
// A mapping's `first_row` while its table is being compiled (KernelWalker's COMPILING).
#define COMPILING 0xffffffffu

// Why a walk ended (the record's `stop`, and the index of `stops`).
enum stop {
	STOP_OUTERMOST = 0, // the thread's first frame: complete
	STOP_LIMIT = 1, // MAX_FRAMES frames
	STOP_NOT_UP = 2, // a step did not move the stack pointer up (a loop)
	STOP_NO_MAPPING = 3, // an address in no mapping with a table, without a frame pointer
	STOP_NO_ENTRY = 4, // the table has no row for the address
	STOP_UNSUPPORTED = 5, // a rule the walker cannot follow
	STOP_RA_UNKNOWN = 6, // the return address's rule is not CFA - 8
	STOP_RBP_LOST = 7, // the CFA is RBP-based but RBP was lost
	STOP_UNREADABLE = 8, // stack memory could not be read
	STOP_COMPILING = 9, // a mapping whose table is still being compiled
	STOP_NO_PROCESS = 10, // the process has no tables (not counted as a walk)
	STOP_REASONS = 11,
};

// One row of a table, as Row::to_bytes writes it (12 bytes, little-endian).
struct row {
	__u32 start;
	__s32 cfa_offset;
	__s16 rbp_offset;
	__u8 cfa; // bits 0-3: kind; 4-7: the PLT's threshold
	__u8 rules; // bits 0-1: return address; 2-3: RBP
} __attribute__((packed));

// CFA kinds (row.rs's `kind`) and the return-address and RBP rules.
#define CFA_NO_ENTRY 0
#define CFA_RSP 1
#define CFA_RBP 2
#define CFA_PLT 3
#define CFA_SIGNAL_FRAME 4
#define RA_AT_CFA 1
#define RA_OUTERMOST 2
#define RBP_AT_CFA 1
#define RBP_UNKNOWN 2

// One mapping of a process: process addresses [start, end) whose table offsets are
// `address - to_table`, its rows `rows` from `first_row` of `rows` (none: a mapping
// without a table, walked by its frame pointers, or, with `first_row` COMPILING, one
// whose table sampler is still compiling, handed back).
struct mapping {
	__u64 start;
	__u64 end;
	__u64 to_table;
	__u32 first_row;
	__u32 rows;
};

// A process's mappings: `count` of `mappings` from `first`, sorted by start, not
// overlapping.
struct process {
	__u32 first;
	__u32 count;
};

// What is sent for a sample: this header, then `kernel_nr` kernel frames and `user_nr`
// user frames, 8 bytes each.
struct record {
	__u64 time;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u16 kernel_nr;
	__u16 user_nr;
	__u64 period;
	__u32 stop;
	__u32 pad;
	__u64 ips[SLOTS];
};

#define HEADER_BYTES 40

// The rows of every file's table, and every walked process's mappings, are each one
// array indexed from 0, kept in chunks: array maps of a fixed size that sampler makes as
// the array grows and puts in an array of maps. The kernel memory taken is what the
// recording's files and processes need, not the most they could.
//
// (Their sizes are given as numbers: the types of an inner map's elements would reach
// the BTF only as forward declarations.)
//
// A chunk of rows: 2^16 rows (1 MiB: the kernel rounds each 12-byte row up to 16),
// mappable, so that sampler writes rows into it directly (kernel_walk's ROW_CHUNK).
#define ROW_CHUNK_SHIFT 16
#define ROW_CHUNKS 64
struct row_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << ROW_CHUNK_SHIFT);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct row));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, ROW_CHUNKS);
	__type(key, __u32);
	__array(values, struct row_chunk);
} rows SEC(".maps");

// A chunk of mappings: 16 processes' slots of 256 (128 KiB; kernel_walk's
// MAPPING_CHUNK).
#define MAPPING_CHUNK_SHIFT 12
#define MAPPING_CHUNKS 64
struct mapping_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << MAPPING_CHUNK_SHIFT);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct mapping));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAPPING_CHUNKS);
	__type(key, __u32);
	__array(values, struct mapping_chunk);
} mappings SEC(".maps");

// Defines `name(index)`: element `index` of the chunked array `chunks` (chunks of
// 2^`shift` elements of type `type`); 0 where its chunk is not made yet.
#define CHUNKED_LOOKUP(name, chunks, type, shift)                              \
	INLINE type *name(__u32 index)                                         \
	{                                                                      \
		__u32 chunk = index >> (shift);                                \
		__u32 at = index & ((1u << (shift)) - 1);                      \
		void *inner = bpf_map_lookup_elem(&(chunks), &chunk);          \
		if (!inner)                                                    \
			return 0;                                              \
		return bpf_map_lookup_elem(inner, &at);                        \
	}

CHUNKED_LOOKUP(row_lookup, rows, struct row, ROW_CHUNK_SHIFT)
CHUNKED_LOOKUP(mapping_lookup, mappings, struct mapping, MAPPING_CHUNK_SHIFT)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct process);
} processes SEC(".maps");

// Processes that per-CPU events of a command or attached processes sample but that
// sampler does not follow (someone else's, sampler's own): their samples are dropped
// here, so that their stack copies are never written. sampler names them from their
// first samples and takes a pid out again when it exits or becomes followed.
#define STRANGERS 4096
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STRANGERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u8);
} strangers SEC(".maps");

// Each CPU's `bpf-output` event, by CPU number (libbpf sizes it to the possible CPUs).
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} walks SEC(".maps");

// Each CPU's `bpf-output` event that wakes sampler (its records wake whoever polls the
// ring they share with the CPU's other events, each time), by CPU number.
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} wakes SEC(".maps");

// When sampler was last woken, how long after that it may be woken again (set by
// sampler: a millisecond at the start of a recording, then ten), and sampler's own
// process (with -a not a stranger, and its samples never a reason to wake it).
struct wake {
	__u64 last;
	__u64 gap;
	__u32 own;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wake);
} wake SEC(".maps");

// Wakes sampler, unless it was woken less than the gap ago: at a sample it could not
// walk for want of what sampler may have yet to read (a new process, a new mapping, a
// table being compiled; also code that no table will ever cover, JIT code, which wakes
// it every gap as its rings were polled before there were wake-ups). Otherwise sampler
// reads the rings every 100 ms, or at half a ring. Two CPUs that wake it at once only
// wake it twice.
INLINE void wake_sampler(void *ctx, __u32 tgid)
{
	__u32 zero = 0;
	struct wake *w = bpf_map_lookup_elem(&wake, &zero);
	if (!w || tgid == w->own)
		return;
	__u64 now = bpf_ktime_get_ns();
	if (now - w->last < w->gap)
		return;
	w->last = now;
	__u64 nothing = 0;
	bpf_perf_event_output(ctx, &wakes, BPF_F_CURRENT_CPU, &nothing, sizeof(nothing));
}

// Each CPU's record, by CPU number (sampler sets the size to the possible CPUs at load):
// a per-CPU array's values can be at most 32 KiB, a record is 64 KiB.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct record);
} scratch SEC(".maps");

// This CPU's record. A program on a perf event runs with preemption off and does not
// nest with itself on one CPU, so the record is its own while it runs.
INLINE struct record *this_cpu_record(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	return bpf_map_lookup_elem(&scratch, &cpu);
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STOP_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} stops SEC(".maps");

// Set by the loader: whether kernel frames are recorded.
const volatile __u32 with_kernel = 1;

// The state of one walk (`walk_state`), shared with each step.
struct walk {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 tgid;
	__u32 n; // user frames recorded
	__u32 kernel_nr;
	__u32 bp_ok;
	__u32 is_ip; // `ip` is an instruction (the sampled one, or an interrupted one)
	__u32 stop;
	// The last frame's address (with a table) and the row found for it: a recursion
	// returns to one address over and over, and its mapping and row are searched once.
	__u64 last_pc;
	struct row last_row;
};

// The walk in progress on each CPU. It lives in a map rather than on the program's
// stack: the verifier takes a map value's fields as any number, where it would follow
// each constant a step stores on the stack (a stop reason, a flag) as a state of its
// own, and check the steps again for each combination (17,813 instructions checked
// that way, 1,147 this way).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk);
} walk_state SEC(".maps");

INLINE void count_stop(__u32 reason)
{
	__u64 *count = bpf_map_lookup_elem(&stops, &reason);
	if (count)
		*count += 1;
}

INLINE __u64 read_word(__u64 address, int *failed)
{
	__u64 value = 0;
	if (bpf_probe_read_user(&value, 8, (void *)address))
		*failed = 1;
	return value;
}

// One search among `n` elements of an array map from key `first`, sorted by their
// `start`: the state of `search_step`, run by bpf_loop.
struct search {
	__u32 first;
	__u32 low;
	__u32 high;
	__u32 failed;
	__u64 at;
};

// Defines `name(first, n, at)`: the last of the `n` elements of array map `map` from
// key `first` (of type `type`, sorted by their `start`) whose start is at or below `at`,
// by a binary search of at most `steps` steps; 0 below the first. Each step is a
// bpf_loop callback, which the verifier checks once rather than once per step and path;
// lookups go by key, so it need not follow each index's exact value.
#define LAST_STARTING_AT_OR_BELOW(name, lookup, type, steps)                   \
	static long name##_step(__u32 index, struct search *s)                 \
	{                                                                      \
		if (s->low >= s->high)                                         \
			return 1;                                              \
		__u32 mid = s->low + (s->high - s->low) / 2;                   \
		__u32 key = s->first + mid;                                    \
		type *e = lookup(key);                                         \
		if (!e) {                                                      \
			s->failed = 1;                                         \
			return 1;                                              \
		}                                                              \
		if (e->start <= s->at)                                         \
			s->low = mid + 1;                                      \
		else                                                           \
			s->high = mid;                                         \
		return 0;                                                      \
	}                                                                      \
	INLINE type *name(__u32 first, __u32 n, __u64 at)                      \
	{                                                                      \
		struct search s = { .first = first, .high = n, .at = at };     \
		bpf_loop((steps), name##_step, &s, 0);                         \
		if (s.failed || s.low == 0 || s.low > n)                       \
			return 0;                                              \
		__u32 key = first + s.low - 1;                                 \
		return lookup(key);                                            \
	}

LAST_STARTING_AT_OR_BELOW(mapping_starting_below, mapping_lookup, struct mapping, MAPPING_STEPS)

// The row covering table offset `offset` among `n` rows from `first`: the last one
// starting at or before it (UnwindTable::row_at).
LAST_STARTING_AT_OR_BELOW(row_at, row_lookup, struct row, SEARCH_STEPS)

// The mapping of process `p` that holds `pc`.
INLINE struct mapping *mapping_at(struct process *p, __u64 pc)
{
	struct mapping *m = mapping_starting_below(p->first, p->count, pc);
	return m && pc < m->end ? m : 0;
}

// Records the caller's frame and moves the walk to it; ends the walk when the stack
// pointer did not move up (except into the code a signal interrupted, which may be on
// another stack than its handler).
INLINE long to_caller(struct walk *w, __u64 ip, __u64 sp, __u64 bp, __u32 interrupted)
{
	if (sp <= w->sp && !interrupted) {
		w->stop = STOP_NOT_UP;
		return 1;
	}
	struct record *r = this_cpu_record();
	if (!r) {
		w->stop = STOP_UNREADABLE;
		return 1;
	}
	r->ips[(w->kernel_nr + w->n) & (SLOTS - 1)] = interrupted ? ip | INTERRUPTED_BIT : ip;
	w->n += 1;
	w->ip = ip;
	w->sp = sp;
	w->bp = bp;
	w->is_ip = interrupted;
	return 0;
}

// One step of the walk: from the frame at `w`'s registers to its caller's.
static long step(__u32 index, void *unused)
{
	__u32 zero = 0;
	struct walk *w = bpf_map_lookup_elem(&walk_state, &zero);
	if (!w)
		return 1;
	if (w->n >= MAX_FRAMES) {
		w->stop = STOP_LIMIT;
		return 1;
	}
	// A return address's call is the byte before it.
	__u64 pc = w->is_ip ? w->ip : w->ip - 1;
	struct row *r = &w->last_row;
	int failed = 0;
	if (pc != w->last_pc) {
		struct process *p = bpf_map_lookup_elem(&processes, &w->tgid);
		if (!p) {
			w->stop = STOP_NO_PROCESS;
			return 1;
		}
		struct mapping *m = mapping_at(p, pc);
		if (m && m->rows == 0 && m->first_row == COMPILING) {
			w->stop = STOP_COMPILING;
			return 1;
		}
		if (!m || m->rows == 0) {
			// Code without a table (JIT code, a file without CFI): its frame pointer,
			// when there is one to follow.
			if (!w->bp_ok || w->bp <= w->sp || (w->bp & 7)) {
				w->stop = STOP_NO_MAPPING;
				return 1;
			}
			__u64 ip = read_word(w->bp + 8, &failed);
			__u64 bp = read_word(w->bp, &failed);
			if (failed) {
				w->stop = STOP_UNREADABLE;
				return 1;
			}
			return to_caller(w, ip, w->bp + 16, bp, 0);
		}
		__u64 offset = pc - m->to_table;
		if (offset >> 32) {
			w->stop = STOP_NO_ENTRY;
			return 1;
		}
		struct row *found = row_at(m->first_row, m->rows, offset);
		if (!found) {
			w->stop = STOP_NO_ENTRY;
			return 1;
		}
		w->last_row = *found;
		w->last_pc = pc;
	}
	__u64 cfa;
	switch (r->cfa & 15) {
	case CFA_RSP:
		cfa = w->sp + (__s64)r->cfa_offset;
		break;
	case CFA_RBP:
		if (!w->bp_ok) {
			w->stop = STOP_RBP_LOST;
			return 1;
		}
		cfa = w->bp + (__s64)r->cfa_offset;
		break;
	case CFA_PLT:
		cfa = w->sp + (__s64)r->cfa_offset + ((w->ip & 15) >= (__u64)(r->cfa >> 4) ? 8 : 0);
		break;
	case CFA_SIGNAL_FRAME: {
		// The trampoline's frame is named by its own address, not by the call before
		// it (its FDE starts a byte before it, so that a return address finds it): it
		// is marked as an instruction.
		struct record *rec = this_cpu_record();
		if (rec && !w->is_ip && w->n > 0)
			rec->ips[(w->kernel_nr + w->n - 1) & (SLOTS - 1)] |= INTERRUPTED_BIT;
		// The interrupted code's registers, in the ucontext at RSP (unwind::signal).
		__u64 bp = read_word(w->sp + 120, &failed);
		__u64 sp = read_word(w->sp + 160, &failed);
		__u64 ip = read_word(w->sp + 168, &failed);
		if (failed) {
			w->stop = STOP_UNREADABLE;
			return 1;
		}
		w->bp_ok = 1;
		return to_caller(w, ip, sp, bp, 1);
	}
	case CFA_NO_ENTRY:
		w->stop = STOP_NO_ENTRY;
		return 1;
	default:
		w->stop = STOP_UNSUPPORTED;
		return 1;
	}
	__u32 ra = r->rules & 3, rbp = (r->rules >> 2) & 3;
	if (ra == RA_OUTERMOST) {
		w->stop = STOP_OUTERMOST;
		return 1;
	}
	if (ra != RA_AT_CFA) {
		w->stop = STOP_RA_UNKNOWN;
		return 1;
	}
	__u64 ip = read_word(cfa - 8, &failed);
	__u64 bp = w->bp;
	if (rbp == RBP_AT_CFA)
		bp = read_word(cfa + (__s64)r->rbp_offset, &failed);
	else if (rbp == RBP_UNKNOWN)
		w->bp_ok = 0;
	if (failed) {
		w->stop = STOP_UNREADABLE;
		return 1;
	}
	return to_caller(w, ip, cfa, bp, 0);
}

// The sampled thread's user registers: the sampled ones in user mode (CS's privilege
// level 3; the context allows 8-byte reads only), else those saved on kernel entry
// (zeros for a kernel thread); 0 when they cannot be read.
INLINE int user_registers(struct bpf_perf_event_data *ctx, __u64 *ip, __u64 *sp, __u64 *bp)
{
	if ((((__u64 *)&ctx->regs)[17] & 3) == 3) {
		*ip = ctx->regs.rip;
		*sp = ctx->regs.rsp;
		*bp = ctx->regs.rbp;
		return 1;
	}
	struct pt_regs *user = bpf_task_pt_regs(bpf_get_current_task_btf());
	return !bpf_probe_read_kernel(ip, 8, &user->rip) &&
	       !bpf_probe_read_kernel(sp, 8, &user->rsp) &&
	       !bpf_probe_read_kernel(bp, 8, &user->rbp);
}

SEC("perf_event")
int walk_stack(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	struct walk *wp = bpf_map_lookup_elem(&walk_state, &zero);
	if (!wp)
		return 1;
	__builtin_memset(wp, 0, sizeof(*wp));
	wp->tgid = id >> 32;
	if (wp->tgid == 0)
		return 1;
	__u64 ip = 0, sp = 0, bp = 0;
	if (!bpf_map_lookup_elem(&processes, &wp->tgid)) {
		if (bpf_map_lookup_elem(&strangers, &wp->tgid))
			return 0;
		// A process sampler has yet to read of or to name as a stranger; not a kernel
		// thread (no user code), which it never walks.
		if (user_registers(ctx, &ip, &sp, &bp) && ip)
			wake_sampler(ctx, wp->tgid);
		return 1;
	}
	struct record *r = this_cpu_record();
	if (!r || !user_registers(ctx, &ip, &sp, &bp))
		return 1;
	long kernel_bytes = 0;
	if (with_kernel) {
		kernel_bytes = bpf_get_stack(ctx, r->ips, MAX_KERNEL * 8, 0);
		if (kernel_bytes < 0)
			kernel_bytes = 0;
	}
	__u32 kernel_nr = (__u32)kernel_bytes / 8;
	if (kernel_nr > MAX_KERNEL)
		kernel_nr = MAX_KERNEL;
	r->ips[kernel_nr & (SLOTS - 1)] = ip;
	wp->kernel_nr = kernel_nr;
	wp->n = 1;
	wp->ip = ip;
	wp->sp = sp;
	wp->bp = bp;
	wp->bp_ok = 1;
	wp->is_ip = 1;
	wp->stop = STOP_LIMIT;
	wp->last_pc = 0;
	bpf_loop(MAX_FRAMES, step, 0, 0);
	struct walk w = *wp;
	count_stop(w.stop);
	if (w.stop == STOP_NO_MAPPING || w.stop == STOP_COMPILING || w.stop == STOP_NO_PROCESS)
		wake_sampler(ctx, w.tgid);
	if (w.stop != STOP_OUTERMOST && w.stop != STOP_NOT_UP)
		return 1;
	r->time = bpf_ktime_get_ns();
	r->pid = w.tgid;
	r->tid = (__u32)id;
	r->cpu = bpf_get_smp_processor_id();
	r->kernel_nr = w.kernel_nr;
	r->user_nr = w.n;
	r->period = ctx->sample_period;
	r->stop = w.stop;
	__u64 bytes = HEADER_BYTES + 8 * (__u64)(w.kernel_nr + w.n);
	if (bytes > sizeof(*r))
		bytes = sizeof(*r);
	if (bpf_perf_event_output(ctx, &walks, BPF_F_CURRENT_CPU, r, bytes))
		return 1;
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
