/* Tiny functions for plthot: each call from plthot goes through a PLT stub, and the
 * function itself is about as short as the stub, so samples land in the stubs. */
long tiny_add(long a, long b) { return a + b; }

long tiny_xor(long a, long b) { return a ^ b; }
