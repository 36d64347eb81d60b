/* A PIE program that spends its time in one library after another, each phase under a
 * function of its own, so that a profile shows which library each frame is in:
 *   main > in_own_lib > lib_outer > lib_hot    libhot.so (bench-targets)
 *   main > in_libm > (sin, log)                libm.so.6
 *   main > in_libc > (memchr)                  libc.so.6 (internal name: needs its debug file)
 *   main > in_libstdcxx > std::_Hash_bytes     libstdc++.so.6
 *   main > in_vdso > clock_gettime             [vdso]
 * Usage: uselibs [seconds per phase] (default 0.4) */
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include "now.h"

extern "C" void lib_outer(long n);

static volatile double sink;
static volatile long counter;

/* Each phase runs its body in batches until its time is up; the clock is read once per
 * batch, so the phases other than in_vdso spend next to nothing in the vdso. */
#define PHASE(name, batch)                                      \
    __attribute__((noinline)) void name(double seconds) {      \
        double end = now() + seconds;                           \
        while (now() < end) {                                   \
            batch;                                              \
        }                                                       \
        counter++;                                              \
    }

PHASE(in_own_lib, lib_outer(200000))

PHASE(in_libm, {
    double s = 0;
    for (int i = 1; i < 20000; i++) s += std::sin(i * 0.001 + sink) + std::log(i + sink);
    sink = s;
})

static char haystack[1 << 16];
PHASE(in_libc, {
    long found = 0;
    for (int i = 0; i < 64; i++) found += std::memchr(haystack, 1, sizeof haystack) != nullptr;
    counter += found;
})

static std::string text(1 << 14, 'x');
PHASE(in_libstdcxx, {
    size_t h = 0;
    for (int i = 0; i < 64; i++) h += std::hash<std::string>{}(text);
    counter += (long)h;
})

PHASE(in_vdso, {
    struct timespec ts;
    for (int i = 0; i < 1000; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
    counter += ts.tv_nsec;
})

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 0.4;
    in_own_lib(seconds);
    in_libm(seconds);
    in_libc(seconds);
    in_libstdcxx(seconds);
    in_vdso(seconds);
    return 0;
}
