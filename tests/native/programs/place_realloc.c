/* Blocks that change arena under the placement layer (mode=size,big=1000: requests of >= 1000
 * bytes go to the long arena): realloc growing a short block past 1000 (moved to the long
 * arena), shrinking it back (the real realloc on a long-arena block), reallocarray, calloc's
 * zeros on a block reused from a dirtied freed one, and blocks made by one thread, grown and
 * freed by another. Contents checked at every step; one checksum line, exit 3 on a failed check.
 * usage: place_realloc ROUNDS */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 7);
}
static void check(const unsigned char *p, size_t n, unsigned seed, const char *what) {
    if (!p) {
        fprintf(stderr, "%s failed\n", what);
        exit(3);
    }
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed + i * 7)) {
            fprintf(stderr, "%s: byte %zu changed\n", what, i);
            exit(3);
        }
}

#define HANDOFF 64
static unsigned char *handed[HANDOFF];

static void *grower(void *arg) {
    uint64_t *sum = arg;
    for (int i = 0; i < HANDOFF; i++) {
        check(handed[i], 500, (unsigned)i, "handed");
        handed[i] = realloc(handed[i], 3000 + (size_t)i);
        check(handed[i], 500, (unsigned)i, "handed grown");
        *sum += handed[i][i];
        free(handed[i]);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    uint64_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        size_t n = 64 + (size_t)(r % 13) * 40;
        unsigned char *p = malloc(n);
        fill(p, n, (unsigned)r);
        p = realloc(p, 5000 + (size_t)r); /* short -> long */
        check(p, n, (unsigned)r, "grown");
        fill(p, 5000 + (size_t)r, (unsigned)r + 1);
        p = realloc(p, 300); /* long -> short request */
        check(p, 300, (unsigned)r + 1, "shrunk");
        p = reallocarray(p, 40, 100); /* 4000: long again */
        check(p, 300, (unsigned)r + 1, "reallocarray");
        sum += p[r % 300];
        memset(p, 0xab, 4000);
        free(p);
        unsigned char *z = calloc(40, 100); /* may reuse the dirtied block: must be zeros */
        for (size_t i = 0; i < 4000; i++)
            if (z[i]) {
                fprintf(stderr, "calloc: byte %zu not zero\n", i);
                return 3;
            }
        free(z);
    }
    volatile size_t half = SIZE_MAX / 2; /* volatile: an overflow gcc cannot see coming */
    if (reallocarray(NULL, half, 4) != NULL) return 3;
    for (int i = 0; i < HANDOFF; i++) {
        handed[i] = malloc(500);
        fill(handed[i], 500, (unsigned)i);
    }
    pthread_t t;
    pthread_create(&t, NULL, grower, &sum);
    pthread_join(t, NULL);
    printf("rounds=%d sum=%llu\n", rounds, (unsigned long long)sum);
    return 0;
}
