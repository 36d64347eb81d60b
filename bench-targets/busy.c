/* Load target: N threads (default 64), each spinning in busy_work for the given time.
 * Usage: busy [threads] [seconds] (default 64, 2). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include "now.h"
#include "work.h"

static double seconds = 2.0;
__attribute__((noinline)) void *busy_work(void *arg) {
    (void)arg;
    double until = now() + seconds;
    while (now() < until) sum_to(100000);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    if (argc > 2) seconds = atof(argv[2]);
    pthread_t *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, busy_work, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return 0;
}
