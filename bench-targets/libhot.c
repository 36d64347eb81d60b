/* A shared library for the symbolication tests, linked with -Ttext-segment so that its
 * addresses differ from its file offsets (p_vaddr = p_offset + 0x100000): its frames are
 * named right only when the ELF program headers are used, not the mapping start alone.
 * Call tree: lib_outer > lib_hot. */
static volatile double lib_sink;

__attribute__((noinline)) void lib_hot(long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)i * 1.000001;
    lib_sink = s;
}

__attribute__((noinline)) void lib_outer(long n) {
    lib_hot(n);
    lib_sink += 1; /* keeps lib_hot from being a tail call */
}
