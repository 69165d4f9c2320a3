/* A double free of a large block, then two allocations of its size. Under glibc the second free
 * of an mmapped block crashes the program (its chunk header is gone with the unmap; a heap block
 * aborts with "double free detected"); a layer must pass the double free through to that real
 * free, never keep the block twice and hand it out twice.
 * Prints "distinct" or "same" (the two later blocks) if it survives; exit 1 on "same".
 * usage: doublefree SIZE [realloc]: with "realloc", the second free is a realloc of the freed
 * block instead (glibc: the same crash; the layer must not let the cache and the program both
 * own it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 300000;
    char *p = malloc(n);
    if (!p) return 2;
    memset(p, 1, n);
    free(p);
    if (argc > 2) {
        char *g = realloc(p, 2 * n);
        if (g) memset(g, 2, 2 * n);
    } else {
        free(p);
    }
    char *q = malloc(n), *r = malloc(n);
    if (!q || !r) return 2;
    printf("%s\n", q == r ? "same" : "distinct");
    fflush(stdout);
    return q == r ? 1 : 0;
}
