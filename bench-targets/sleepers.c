/* Many threads that only sleep: for attaching to a large process without loading the
 * CPUs. Usage: sleepers [threads] [seconds] (default 1000, 10). Prints "ready" once
 * every thread is running. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static double seconds = 10.0;

static void *sleeper(void *arg) {
    (void)arg;
    usleep((useconds_t)(seconds * 1e6));
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    if (argc > 2) seconds = atof(argv[2]);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    /* Small stacks: 5,000 threads of the default 8 MiB would reserve 40 GiB. */
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&t[i], &attr, sleeper, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return 0;
}
