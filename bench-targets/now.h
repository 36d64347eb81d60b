/* The monotonic clock in seconds, for the bench targets that run for a given time. */
#ifndef BENCH_NOW_H
#define BENCH_NOW_H
#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
#endif
