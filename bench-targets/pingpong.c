/* Context switches as fast as two threads can make them: "ping" and "pong" hand a token
 * back and forth through two pipes for the given time (each handoff wakes the other
 * thread and puts this one to sleep), then print how many handoffs there were. Both
 * threads run on one CPU (the first the process may use), where a handoff is a direct
 * switch from one to the other: some 100,000 switches a second in a VM, where a wakeup
 * across CPUs costs several times that.
 * With a rate, ping spins between handoffs to make about that many a second.
 * With -n, a fixed amount of work instead (for wall-time comparisons): that many
 * handoffs, ping spinning the given number of loop iterations before each.
 * Usage: pingpong [seconds] [handoffs per second] (default 2, as many as it can)
 *        pingpong -n HANDOFFS SPIN */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "now.h"

static int to_pong[2], to_ping[2];

__attribute__((noinline)) static void pace(double until) {
    while (now() < until) {
    }
}

/* Work that takes the same CPU time however the program is observed. */
__attribute__((noinline)) static void spin(long iterations) {
    for (volatile long i = 0; i < iterations; i++) {
    }
}

__attribute__((noinline)) static long ping_fixed(long handoffs, long iterations) {
    char token = 't';
    long done = 0;
    while (done < handoffs) {
        spin(iterations);
        if (write(to_pong[1], &token, 1) != 1 || read(to_ping[0], &token, 1) != 1) break;
        done += 2;
    }
    token = 'q';
    if (write(to_pong[1], &token, 1) != 1) return -1;
    return done;
}

__attribute__((noinline)) static long ping_side(double seconds, double rate) {
    char token = 't';
    long handoffs = 0;
    double start = now(), end = start + seconds;
    while (now() < end) {
        if (rate > 0) pace(start + handoffs / rate);
        if (write(to_pong[1], &token, 1) != 1 || read(to_ping[0], &token, 1) != 1) break;
        handoffs += 2;
    }
    token = 'q';
    if (write(to_pong[1], &token, 1) != 1) return -1;
    return handoffs;
}

__attribute__((noinline)) static void *pong_side(void *arg) {
    (void)arg;
    char token;
    while (read(to_pong[0], &token, 1) == 1 && token != 'q') {
        if (write(to_ping[1], &token, 1) != 1) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int fixed = argc > 2 && argv[1][0] == '-' && argv[1][1] == 'n';
    double seconds = argc > 1 && !fixed ? atof(argv[1]) : 2.0;
    if (pipe(to_pong) != 0 || pipe(to_ping) != 0) return 1;
    cpu_set_t cpus, one;
    CPU_ZERO(&one);
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (CPU_ISSET(cpu, &cpus)) {
                CPU_SET(cpu, &one);
                break;
            }
        }
        sched_setaffinity(0, sizeof one, &one);
    }
    pthread_t pong;
    pthread_create(&pong, NULL, pong_side, NULL);
    pthread_setname_np(pong, "pong");
    pthread_setname_np(pthread_self(), "ping");
    double start = now();
    long handoffs = fixed ? ping_fixed(atol(argv[2]), argc > 3 ? atol(argv[3]) : 0)
                          : ping_side(seconds, argc > 2 ? atof(argv[2]) : 0);
    pthread_join(pong, NULL);
    fprintf(stderr, "pingpong: %ld handoffs in %.2f s (%.0f per second)\n", handoffs,
            now() - start, handoffs / (now() - start));
    return 0;
}
