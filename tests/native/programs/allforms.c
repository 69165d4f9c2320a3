/* Every interposed entry point on large blocks, in rounds: malloc, calloc (zeros checked),
 * realloc (grow and shrink, data checked), reallocarray, posix_memalign, aligned_alloc, memalign,
 * valloc, pvalloc (alignment checked), malloc_usable_size (>= the request), free. Blocks are
 * freed and asked for again so that a caching layer serves them from its cache.
 * Prints one checksum line; exit 3 on a failed check. usage: allforms ROUNDS SIZE */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t sum;

static void use(unsigned char *p, size_t n, size_t align, int zero, const char *what) {
    if (!p) {
        fprintf(stderr, "%s failed\n", what);
        exit(3);
    }
    if (align && ((uintptr_t)p % align)) {
        fprintf(stderr, "%s misaligned\n", what);
        exit(3);
    }
    if (malloc_usable_size(p) < n) {
        fprintf(stderr, "%s: usable size below the request\n", what);
        exit(3);
    }
    for (size_t j = 0; j < n; j += 4096) {
        if (zero && p[j]) {
            fprintf(stderr, "%s: not zero\n", what);
            exit(3);
        }
        p[j] = (unsigned char)(j / 4096 + n);
        sum += p[j];
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    size_t n = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 300000;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int r = 0; r < rounds; r++) {
        size_t m = n + (size_t)(r % 3) * 5000;
        unsigned char *p = malloc(m);
        use(p, m, 16, 0, "malloc");
        free(p);
        p = calloc(m / 8, 8);
        use(p, m / 8 * 8, 16, 1, "calloc");
        unsigned char *g = realloc(p, 2 * m);
        if (!g) return 3;
        for (size_t j = 0; j < m / 8 * 8; j += 4096)
            if (g[j] != (unsigned char)(j / 4096 + m / 8 * 8)) return 3;
        use(g, 2 * m, 16, 0, "realloc up");
        g = realloc(g, m / 2);
        use(g, m / 2, 16, 0, "realloc down");
        g = reallocarray(g, m / 4, 8);
        use(g, m / 4 * 8, 16, 0, "reallocarray");
        free(g);
        void *q = NULL;
        if (posix_memalign(&q, 256, m) != 0) return 3;
        use(q, m, 256, 0, "posix_memalign");
        free(q);
        q = aligned_alloc(4096, m - m % 4096);
        use(q, m - m % 4096, 4096, 0, "aligned_alloc");
        free(q);
        q = memalign(64, m);
        use(q, m, 64, 0, "memalign");
        free(q);
        q = valloc(m);
        use(q, m, page, 0, "valloc");
        free(q);
        q = pvalloc(m);
        use(q, (m + page - 1) / page * page, page, 0, "pvalloc");
        free(q);
    }
    void *bad = NULL;
    if (posix_memalign(&bad, 3, 10) != EINVAL) return 3; /* a bad alignment is reported */
    printf("rounds=%d checksum=%llu\n", rounds, (unsigned long long)sum);
    return 0;
}
