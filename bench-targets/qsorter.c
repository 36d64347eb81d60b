/* A hot function reached through a library built without frame pointers: libc's qsort
 * calls compare (here) from its merge-sort recursion.
 *   main > sort_all > qsort > ... > compare
 * Usage: qsorter [seconds] (default 2). */
#include <stdlib.h>
#include "now.h"

enum { N = 1 << 16 };

static double data[N];
static volatile long calls;

__attribute__((noinline)) int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    calls++;
    return (x > y) - (x < y);
}

__attribute__((noinline)) void sort_all(unsigned seed) {
    for (int i = 0; i < N; i++) data[i] = (double)rand_r(&seed);
    qsort(data, N, sizeof data[0], compare);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    unsigned seed = 1;
    while (now() < end) sort_all(seed++);
    return 0;
}
