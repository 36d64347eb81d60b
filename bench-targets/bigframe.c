/* Frames larger than any stack copy, without frame pointers (built with
 * -fomit-frame-pointer): main > outer > big > hot, where big keeps 96 KiB of locals on
 * its stack. The kernel caps a sample's stack copy below 64 KiB, so unwinding from a
 * copy stops inside big's frame; walking the stack where it lies does not.
 * Usage: bigframe [seconds] (default 2). */
#include <stdlib.h>
#include "now.h"
#include "work.h"

/* Larger than the largest stack copy (65,528 bytes). */
#define BIG_FRAME_BYTES (96 * 1024)

static volatile long rounds;

__attribute__((noinline)) void hot(long n) { sum_to(n); }

__attribute__((noinline)) void big(long unit) {
    volatile char buffer[BIG_FRAME_BYTES];
    buffer[0] = (char)unit;
    buffer[BIG_FRAME_BYTES - 1] = (char)rounds;
    hot(unit + buffer[0] - buffer[0]);
    rounds += buffer[BIG_FRAME_BYTES - 1] & 1;
}

__attribute__((noinline)) void outer(long unit) {
    big(unit);
    rounds++;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    while (now() < end) outer(100000);
    return 0;
}
