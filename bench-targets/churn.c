/* Thread churn: for the given time, keeps starting short-lived threads (a few at a time),
 * each doing a little work in churn_work and exiting. Prints how many threads it started.
 * Usage: churn [seconds] (default 2). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "now.h"
#include "work.h"

/* Threads alive at once: enough to keep both CPUs busy, few enough to start thousands. */
enum { BATCH = 4 };

__attribute__((noinline)) void *churn_work(void *arg) {
    (void)arg;
    sum_to(200000);
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now() + seconds;
    long started = 0;
    while (now() < end) {
        pthread_t t[BATCH];
        for (int i = 0; i < BATCH; i++) pthread_create(&t[i], NULL, churn_work, NULL);
        for (int i = 0; i < BATCH; i++) pthread_join(t[i], NULL);
        started += BATCH;
    }
    printf("churn: started %ld threads\n", started);
    return 0;
}
