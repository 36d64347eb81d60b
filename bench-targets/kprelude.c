/* A prelude in the kernel and in libc before another program's work: kprelude spends
 * 10 ms of its CPU time reading /dev/zero (the kernel's clear_user and copy paths) and
 * sorting and searching what it read (libc's qsort, memchr), then execs the program it
 * is given, in the same process. A profiler of `kprelude CMD ARGS...` then sees kernel
 * and libc samples in almost every run, as runs as root do, whatever CMD is (/bin/true
 * included). Usage: kprelude CMD [ARGS...]. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The CPU time spent before the exec: 10 ms, some ten samples at 1000 Hz. */
#define PRELUDE_NS 10000000L
/* Bytes read per system call: 1 MiB, some 50 microseconds of clearing in the kernel. */
#define CHUNK 1048576
/* Numbers sorted per read: 128, some 5 microseconds in libc's qsort. */
#define SORTED 128

static int by_value(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: kprelude CMD [ARGS...]\n");
        return 2;
    }
    static int buf[CHUNK / sizeof(int)];
    int zero = open("/dev/zero", O_RDONLY);
    if (zero < 0) {
        perror("/dev/zero");
        return 1;
    }
    long start = cpu_ns();
    volatile long found = 0;
    for (unsigned round = 0; cpu_ns() - start < PRELUDE_NS; round++) {
        if (read(zero, buf, sizeof buf) != (ssize_t)sizeof buf) {
            perror("read /dev/zero");
            return 1;
        }
        for (size_t i = 0; i < SORTED; i++) buf[i] = (int)((i * 2654435761u) ^ round);
        qsort(buf, SORTED, sizeof buf[0], by_value);
        found += memchr(buf, 7, sizeof buf) != NULL;
    }
    close(zero);
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
