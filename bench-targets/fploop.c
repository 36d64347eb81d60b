/* A frame-pointer chain that loops: while it spins, RBP points at a frame whose saved
 * RBP is the frame itself, as corrupted or hand-written code can leave it. The kernel's
 * frame-pointer walk never ends on such a chain; it stops only at its frame limit, so
 * every sample's callchain is as long as the limit allows.
 *   main > spin_in_loop (the chain then repeats loop_frame's return address)
 * Usage: fploop [seconds] (default 1). */
#include <stdlib.h>
#include "now.h"

__attribute__((noinline)) void spin_in_loop(long rounds) {
    /* A 16-byte frame on the stack: [saved RBP = the frame's own address, a return
     * address inside this function]. RBP points at it while the loop runs, and is put
     * back before anything else can see it. */
    __asm__ volatile(
        "push %%rbp\n\t"
        "sub $16, %%rsp\n\t"
        "mov %%rsp, %%rbp\n\t"
        "mov %%rbp, (%%rbp)\n\t"
        "lea 1f(%%rip), %%rax\n\t"
        "mov %%rax, 8(%%rbp)\n"
        "1:\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "add $16, %%rsp\n\t"
        "pop %%rbp\n\t"
        : "+r"(rounds)
        :
        : "rax", "memory", "cc");
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    double end = now() + seconds;
    while (now() < end) spin_in_loop(10000000);
    return 0;
}
