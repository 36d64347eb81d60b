/* A process that forks: the child runs child_work() and exits with code 3; the parent
 * runs parent_work() meanwhile, waits, and exits with the child's code + 4 (so 7).
 * Usage: forker [seconds] (default 1). */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "now.h"

static double seconds = 1.0;
static volatile double sink;

__attribute__((noinline)) void child_work(void) {
    double end = now() + seconds;
    while (now() < end) {
        double s = 0;
        for (long i = 0; i < 100000; i++) s += (double)i;
        sink = s;
    }
}

__attribute__((noinline)) void parent_work(void) {
    double end = now() + seconds / 2;
    while (now() < end) {
        double s = 0;
        for (long i = 0; i < 100000; i++) s += (double)i;
        sink = s;
    }
}

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    pid_t pid = fork();
    if (pid == 0) {
        child_work();
        _exit(3);
    }
    parent_work();
    int status = 0;
    waitpid(pid, &status, 0);
    return WEXITSTATUS(status) + 4;
}
