/* Where a thread waits: the thread "waiter" runs 10 ms cycles for the given time, each
 * computing 5 ms (compute_part), sleeping 3 ms (sleep_part, nanosleep) and waiting 2 ms
 * for a mutex another thread holds (lock_part, a futex wait): 50% on the CPU, 30% asleep,
 * 20% blocked on the lock, by deadlines on the monotonic clock so that the shares hold
 * whatever the sleeps' slack. Beside it, "holder" takes the mutex for those 2 ms (and
 * otherwise waits for its turn), "reader" blocks in read() on a pipe until the end, and
 * the main thread waits in pthread_join throughout. Prints the shares it measured.
 * Usage: waiter [seconds] (default 2). */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "now.h"

#define CYCLE 0.010
#define COMPUTE 0.005
#define SLEEP 0.003

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sem_t go, locked;
static volatile double release_at;
static volatile int done;
static volatile double sink;
static int pipe_fds[2];

static void sleep_until(double t) {
    struct timespec ts = {(time_t)t, (long)((t - (time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

__attribute__((noinline)) static void compute_part(double until) {
    while (now() < until) {
        double s = 0;
        for (long i = 0; i < 20000; i++) s += (double)i;
        sink = s;
    }
}

__attribute__((noinline)) static void sleep_part(double until) { sleep_until(until); }

__attribute__((noinline)) static void lock_part(void) {
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}

/* The time the waiter thread spent in each part and in all, as it measured it. */
static double in_compute, in_sleep, in_lock, in_all;

static void *waiter(void *arg) {
    double start = now();
    double end = start + *(double *)arg;
    for (double t0 = start; t0 < end; t0 += CYCLE) {
        /* The holder takes the lock now, to give it back at the cycle's end. */
        release_at = t0 + CYCLE;
        sem_post(&go);
        double t = now();
        compute_part(t0 + COMPUTE);
        in_compute += now() - t;
        t = now();
        sleep_part(t0 + COMPUTE + SLEEP);
        in_sleep += now() - t;
        sem_wait(&locked);
        t = now();
        lock_part();
        in_lock += now() - t;
    }
    in_all = now() - start;
    done = 1;
    sem_post(&go);
    return NULL;
}

static void *holder(void *arg) {
    (void)arg;
    for (;;) {
        sem_wait(&go);
        if (done) return NULL;
        pthread_mutex_lock(&lock);
        sem_post(&locked);
        sleep_until(release_at);
        pthread_mutex_unlock(&lock);
    }
}

__attribute__((noinline)) static void *reader(void *arg) {
    (void)arg;
    char byte;
    while (read(pipe_fds[0], &byte, 1) < 0) {
    }
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    if (pipe(pipe_fds) != 0) return 1;
    sem_init(&go, 0, 0);
    sem_init(&locked, 0, 0);
    pthread_t w, h, r;
    pthread_create(&h, NULL, holder, NULL);
    pthread_setname_np(h, "holder");
    pthread_create(&r, NULL, reader, NULL);
    pthread_setname_np(r, "reader");
    pthread_create(&w, NULL, waiter, &seconds);
    pthread_setname_np(w, "waiter");
    pthread_join(w, NULL);
    pthread_join(h, NULL);
    if (write(pipe_fds[1], "x", 1) != 1) return 1;
    pthread_join(r, NULL);
    /* What the shares were on this run: a thread delayed past its deadlines (the holder
     * late to give the lock back) shortens the next cycle's compute part. */
    printf("waiter: compute %.1f%%, sleep %.1f%%, lock %.1f%% of %.3f s\n",
           100 * in_compute / in_all, 100 * in_sleep / in_all, 100 * in_lock / in_all, in_all);
    return 0;
}
