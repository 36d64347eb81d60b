/* PLT target: a loop that does little but call functions of other files through the
 * PLT (libtiny.so's tiny_add and tiny_xor, now and then libc's strlen of a short
 * string), so that a
 * good share of its samples land in the stubs tiny_add@plt, tiny_xor@plt and strlen@plt.
 * Usage: plthot [seconds] (default 2). */
#include <stdlib.h>
#include <string.h>
#include "now.h"

long tiny_add(long a, long b);
long tiny_xor(long a, long b);

static const char *volatile word = "plt";
static volatile long sink;

int main(int argc, char **argv) {
    double until = now() + (argc > 1 ? atof(argv[1]) : 2.0);
    long acc = 0;
    while (now() < until) {
        for (int i = 0; i < 100000; i++) {
            acc = tiny_add(acc, i);
            acc = tiny_xor(acc, i);
            /* libc's strlen costs more than the tiny functions: called less often. */
            if ((i & 7) == 0) acc += (long)strlen(word);
        }
    }
    sink = acc;
    return 0;
}
