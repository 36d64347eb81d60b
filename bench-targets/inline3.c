/* Inline frames: work() is a real (non-inlined) function into which three always-inline
 * helpers are nested: work > level1 > level2 > level3, where level3 does the work.
 * Built with -O2 -g. Usage: inline3 [seconds] (default 2). */
#include <stdlib.h>
#include <time.h>
#include "now.h"

static volatile double sink;

static inline __attribute__((always_inline)) double level3(long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)i * 0.999999;
    return s;
}

static inline __attribute__((always_inline)) double level2(long n) {
    return level3(n) + 2.0;
}

static inline __attribute__((always_inline)) double level1(long n) {
    return level2(n) * 1.5;
}

__attribute__((noinline)) void work(long n) {
    sink = level1(n);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    while (now() < end) work(1000000);
    return 0;
}
