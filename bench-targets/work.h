/* The unit of work the bench targets' hot functions do: a floating-point sum that the
 * compiler cannot drop (the result goes to a volatile). Inlined into each caller, so a
 * hot function that calls it stays a leaf. */
#ifndef BENCH_WORK_H
#define BENCH_WORK_H

static volatile double work_sink;

static inline void sum_to(long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)i * 1.000001;
    work_sink = s;
}
#endif
