/* A recursion 2,000 frames deep that spends its time at the bottom:
 *   main > descend > descend > ... (2,000 times) > bottom
 * Usage: deep [seconds] [depth] (default 2, 2000). */
#include <stdlib.h>
#include "now.h"

static volatile double sink;
static double end;

__attribute__((noinline)) void bottom(void) {
    while (now() < end) {
        double s = 0;
        for (long i = 0; i < 100000; i++) s += (double)i;
        sink = s;
    }
}

__attribute__((noinline)) int descend(int depth) {
    /* A local that lives across the call keeps a real frame at every level: without it
     * gcc turns the recursion into a loop. */
    volatile int here = depth;
    if (depth <= 1) {
        bottom();
        return 1;
    }
    int below = descend(depth - 1);
    return below + (here > 0);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    int depth = argc > 2 ? atoi(argv[2]) : 2000;
    end = now() + seconds;
    return descend(depth) == depth ? 0 : 1;
}
