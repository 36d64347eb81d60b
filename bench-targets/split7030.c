/* Single-threaded target with a known call tree: main > outer > {hot_a ~70%, hot_b ~30%}.
 * Both hot functions run the same loop; hot_a gets 7 units of work per round, hot_b 3.
 * Usage: split7030 [seconds] (default 2), or split7030 -n ROUNDS for a fixed amount of
 * work (what overhead benchmarks time). With --unlink-self first, it deletes its own
 * executable before it starts working (a profiler must then read the file through
 * /proc/PID/map_files). With --even first (after --unlink-self, if both), hot_a and
 * hot_b get 5 units each: a 50/50 run to compare a 70/30 one with (`sampler diff`). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "now.h"
#include "work.h"


__attribute__((noinline)) void hot_a(long n) { sum_to(n); }

__attribute__((noinline)) void hot_b(long n) { sum_to(n); }

static volatile long rounds;
/* Units of work per round of hot_a and hot_b (of 10). */
static long units_a = 7, units_b = 3;

/* The size of a round's unit: 100,000 on average, but each round's drawn from
 * 50,000..150,000 by a fixed pseudo-random sequence (so `-n` always does the same work).
 * Rounds of one fixed length would be a period that the sampling period can lock onto:
 * where a round takes exactly 1 ms (or 0.5 ms) of CPU on a slower or busier machine, a
 * 1000 Hz profiler samples the same phase of it every time, and the 70/30 split it
 * sees can be anything (a test once saw 57% in hot_a). */
static long next_unit(void) {
    static unsigned long long state = 0x9E3779B97F4A7C15ull;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return 50000 + (long)((state >> 33) % 100001);
}

__attribute__((noinline)) void outer(long unit) {
    hot_a(units_a * unit);
    hot_b(units_b * unit);
    rounds++; /* keeps hot_b from being a tail call, which would hide outer */
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--unlink-self") == 0) {
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len < 0) return 2;
        self[len] = 0;
        if (unlink(self) != 0) return 2;
        argc--;
        argv++;
    }
    if (argc > 1 && strcmp(argv[1], "--even") == 0) {
        units_a = units_b = 5;
        argc--;
        argv++;
    }
    if (argc > 2 && strcmp(argv[1], "-n") == 0) {
        for (long r = atol(argv[2]); r > 0; r--) outer(next_unit());
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    while (now() < end) outer(next_unit());
    return 0;
}
