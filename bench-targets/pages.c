/* Page-fault target: maps N pages of anonymous memory (default 20,000; 80 MB), asks for
 * small pages (no transparent huge pages, which would fault 512 pages at once), and
 * touches each page once in touch_pages: exactly N page faults there. Prints N.
 * Usage: pages [N] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) void touch_pages(volatile char *memory, long pages, long page) {
    for (long i = 0; i < pages; i++) memory[i * page] = 1;
}

int main(int argc, char **argv) {
    long pages = argc > 1 ? atol(argv[1]) : 20000;
    long page = sysconf(_SC_PAGESIZE);
    char *memory = mmap(NULL, pages * page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    madvise(memory, pages * page, MADV_NOHUGEPAGE);
    touch_pages(memory, pages, page);
    printf("pages: touched %ld pages\n", pages);
    return 0;
}
