/* The 70/30 call tree without frame pointers (built with -fomit-frame-pointer):
 *   main > outer > middle > {hot_a ~70%, hot_b ~30%}
 * The kernel's frame-pointer walk cannot follow it; CFI can.
 * Usage: nofp [seconds] (default 2), or nofp -n ROUNDS for a fixed amount of work. */
#include <stdlib.h>
#include <string.h>
#include "now.h"
#include "work.h"

static volatile long rounds;

__attribute__((noinline)) void hot_a(long n) { sum_to(n); }

__attribute__((noinline)) void hot_b(long n) { sum_to(n); }

/* Locals in registers and on the stack, so that RBP is used as a general register. */
__attribute__((noinline)) void middle(long unit) {
    long parts[8];
    for (int i = 0; i < 8; i++) parts[i] = unit + i + rounds;
    hot_a(7 * unit + parts[rounds & 7] - parts[rounds & 7]);
    hot_b(3 * unit);
    rounds++;
}

__attribute__((noinline)) void outer(long unit) {
    middle(unit);
    rounds++;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "-n") == 0) {
        for (long r = atol(argv[2]); r > 0; r--) outer(100000);
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    while (now() < end) outer(100000);
    return 0;
}
