/* Generates machine code at run time into anonymous executable memory and names it in
 * /tmp/perf-PID.map, as JIT compilers do for perf. Call tree:
 *   main > run_jit > {jit_hot_a ~70%, jit_hot_b ~30%}   (jit_* live only in the perf map)
 * The generated functions keep frame pointers, so stacks through them unwind.
 * Usage: jit [seconds] (default 2). The map file is left behind for the profiler to read;
 * whoever runs this removes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "now.h"

/* long f(long n): counts n down to zero.
 *   push rbp; mov rbp, rsp; mov rax, rdi; 1: dec rax; jnz 1b; pop rbp; ret */
static const unsigned char countdown[] = {
    0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0x5d, 0xc3,
};

/* The two functions' offsets in the page; apart, so each has its own name. */
enum { OFFSET_A = 0, OFFSET_B = 64 };

typedef long (*jit_fn)(long);
static volatile long rounds;

__attribute__((noinline)) void run_jit(jit_fn a, jit_fn b, long unit) {
    a(7 * unit);
    b(3 * unit);
    rounds++; /* keeps b from being a tail call */
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *code =
        mmap(NULL, page, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("jit: mmap");
        return 1;
    }
    memcpy(code + OFFSET_A, countdown, sizeof countdown);
    memcpy(code + OFFSET_B, countdown, sizeof countdown);

    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map) {
        perror("jit: perf map");
        return 1;
    }
    fprintf(map, "%lx %zx jit_hot_a\n", (unsigned long)(code + OFFSET_A), sizeof countdown);
    fprintf(map, "%lx %zx jit_hot_b\n", (unsigned long)(code + OFFSET_B), sizeof countdown);
    fclose(map);

    double end = now() + seconds;
    while (now() < end) run_jit((jit_fn)(code + OFFSET_A), (jit_fn)(code + OFFSET_B), 1000000);
    return 0;
}
