/* A library that the Makefile strips (libstripped.so; libstripped-full.so is the same
 * file before stripping): only stripped_round is exported, and the three static
 * functions it calls have no name left in the file but their .eh_frame ranges.
 * Call tree: stripped_round > hidden_alpha, hidden_beta, hidden_gamma. */
#include "work.h"
static volatile long hidden_calls;

__attribute__((noinline, noclone)) static void hidden_alpha(long n) { sum_to(n); }

__attribute__((noinline, noclone)) static void hidden_beta(long n) { sum_to(2 * n); }

__attribute__((noinline, noclone)) static void hidden_gamma(long n) { sum_to(3 * n); }

void stripped_round(long n) {
    hidden_alpha(n);
    hidden_beta(n);
    hidden_gamma(n);
    hidden_calls++; /* keeps hidden_gamma from being a tail call */
}
