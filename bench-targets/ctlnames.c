/* Names that carry terminal control sequences: a thread named with ESC ] 0 ; … BEL (which
 * sets a terminal's title) and a function whose symbol and debug names are patched, in a
 * copy of this program, from the placeholder `ctl_name_XXXXXXXXXX` to bytes with ESC and
 * BEL (tests/safety_files.rs does it; the placeholder has the length of the bytes).
 *   main > ctl_name_XXXXXXXXXX
 * Usage: ctlnames [seconds] (default 0.5). */
#include <stdlib.h>
#include <sys/prctl.h>
#include "now.h"

volatile unsigned long sink;

__attribute__((noinline)) void ctl_name_XXXXXXXXXX(void) {
    for (unsigned long i = 0; i < 10000; i++)
        sink += i;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.5;
    prctl(PR_SET_NAME, "th\033]0;owned\007", 0, 0, 0);
    double start = now();
    while (now() - start < seconds)
        ctl_name_XXXXXXXXXX();
    return 0;
}
