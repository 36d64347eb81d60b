/* Named threads: three threads named "worker-red", "worker-green", "worker-blue", each
 * spinning in its own function (red_work, green_work, blue_work) while main waits.
 * Usage: threads [seconds] [delay] (default 2, 0): with a delay, main first sleeps that
 * many seconds, so that a profiler can attach before the threads exist. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "now.h"

static double seconds = 2.0;
static volatile double sink;

static void spin(double until) {
    while (now() < until) {
        double s = 0;
        for (long i = 0; i < 100000; i++) s += (double)i;
        sink = s;
    }
}

__attribute__((noinline)) void *red_work(void *arg) { (void)arg; spin(now() + seconds); return NULL; }
__attribute__((noinline)) void *green_work(void *arg) { (void)arg; spin(now() + seconds); return NULL; }
__attribute__((noinline)) void *blue_work(void *arg) { (void)arg; spin(now() + seconds); return NULL; }

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    if (argc > 2) {
        double delay = atof(argv[2]);
        struct timespec ts = {(time_t)delay, (long)((delay - (time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
    }
    void *(*fns[3])(void *) = {red_work, green_work, blue_work};
    const char *names[3] = {"worker-red", "worker-green", "worker-blue"};
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        pthread_create(&t[i], NULL, fns[i], NULL);
        pthread_setname_np(t[i], names[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    return 0;
}
