/* Calls into the stripped library libstripped.so for the given time.
 * Usage: stripcall [seconds] (default 2). */
#include <stdlib.h>
#include "now.h"

void stripped_round(long n);

int main(int argc, char **argv) {
    double until = now() + (argc > 1 ? atof(argv[1]) : 2.0);
    while (now() < until) stripped_round(10000);
    return 0;
}
