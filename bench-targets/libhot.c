/* A shared library for the symbolication tests, linked with -Ttext-segment so that its
 * addresses differ from its file offsets (p_vaddr = p_offset + 0x100000): its frames are
 * named right only when the ELF program headers are used, not the mapping start alone.
 * Call tree: lib_outer > lib_hot. */
#include "work.h"
static volatile long lib_calls;

__attribute__((noinline)) void lib_hot(long n) { sum_to(n); }

__attribute__((noinline)) void lib_outer(long n) {
    lib_hot(n);
    lib_calls++; /* keeps lib_hot from being a tail call */
}
