/* Half of its CPU time in a signal handler: main calls raise(SIGUSR1) in a loop, and
 * on_usr1 does as much work (handler_work) as main does between two raises (main_work).
 * A CPU-time interval timer (ITIMER_PROF, every 3 ms of CPU) also interrupts the thread
 * wherever it is with SIGPROF, whose handler on_prof works half as long as on_usr1
 * (prof_work).
 * Each handler blocks the other's signal, so they never nest.
 * Usage: sigloop [seconds] (default 1). Built with frame pointers (sigloop) and without
 * (sigloop_nofp). */
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>
#include "now.h"
#include "work.h"

/* Work per round of main_work and of handler_work: about 0.2 ms. */
#define UNIT 200000

static volatile long handled;

__attribute__((noinline)) void main_work(long n) { sum_to(n); }

__attribute__((noinline)) void handler_work(long n) { sum_to(n); }

__attribute__((noinline)) void prof_work(long n) { sum_to(n); }

/* The counts after each call keep the calls from being tail calls, which would hide the
 * handlers. */
__attribute__((noinline)) void on_usr1(int sig) {
    (void)sig;
    handler_work(UNIT);
    handled++;
}

__attribute__((noinline)) void on_prof(int sig) {
    (void)sig;
    prof_work(UNIT / 2);
    handled++;
}

static void handle(int sig, void (*handler)(int), int blocked) {
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, blocked);
    sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    handle(SIGUSR1, on_usr1, SIGPROF);
    handle(SIGPROF, on_prof, SIGUSR1);
    struct itimerval every = {{0, 3000}, {0, 3000}};
    setitimer(ITIMER_PROF, &every, NULL);
    double end = now() + seconds;
    while (now() < end) {
        main_work(UNIT);
        raise(SIGUSR1);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    return handled > 0 ? 0 : 1;
}
