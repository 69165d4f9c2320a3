/* Large temporaries, as numerical code makes them: each round allocates a few large blocks
 * (malloc, calloc, posix_memalign), writes every page of them, grows one with realloc, checks
 * what it wrote (and that calloc's memory is zero), frees them in a varying order, and also
 * makes a few small blocks. Prints one checksum line that depends only on the data written, so
 * the output is the same under any allocator. Exit 3 if a check fails.
 *
 * calloc's zeros are checked after the block is written (at offsets the writes skip), so each
 * page of a block is first touched by a write: one page fault per page, the simulator's fault
 * model. BIGBLOCKS_READ_FIRST=1 checks them before (every page read first: a fault mapping the
 * shared zero page, then a copy-on-write fault at the write, two per page of a fresh block).
 *
 * usage: bigblocks ROUNDS THREADS SIZE... (sizes in bytes; THREADS >= 1 run the rounds each) */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 16
#define PAGE 4096

static int rounds, n_sizes;
static int read_first; /* BIGBLOCKS_READ_FIRST=1: check calloc's zeros before writing */
static size_t sizes[MAX_SIZES];

static void fail(const char *what, int round) {
    fprintf(stderr, "bigblocks: %s (round %d)\n", what, round);
    exit(3);
}

static uint64_t fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t sum = 0;
    for (size_t j = 0; j < n; j += PAGE) {
        unsigned char v = (unsigned char)((seed * 31 + j / PAGE) & 0xff);
        p[j] = v;
        sum += v;
    }
    p[n - 1] = (unsigned char)seed;
    return sum + (unsigned char)seed;
}

static uint64_t check(const unsigned char *p, size_t n, uint64_t seed) {
    uint64_t sum = 0;
    for (size_t j = 0; j < n; j += PAGE) {
        sum += p[j];
    }
    if (p[n - 1] != (unsigned char)seed) return UINT64_MAX;
    return sum;
}

static void *work(void *arg) {
    uint64_t id = (uint64_t)(uintptr_t)arg;
    uint64_t total = 0;
    void *blocks[MAX_SIZES + 1];
    size_t lens[MAX_SIZES + 1];
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < n_sizes; k++) {
            size_t n = sizes[k] + (size_t)((r * 7 + k) % 5) * 1000;
            unsigned char *p;
            if (k % 3 == 1) {
                p = calloc(1, n);
                if (!p) fail("calloc failed", r);
                if (read_first) {
                    for (size_t j = 0; j < n; j += PAGE / 2)
                        if (p[j]) fail("calloc memory not zero", r);
                    if (p[n - 1]) fail("calloc memory not zero", r);
                }
            } else if (k % 3 == 2) {
                void *q = NULL;
                if (posix_memalign(&q, 64, n) != 0) fail("posix_memalign failed", r);
                p = q;
            } else {
                p = malloc(n);
                if (!p) fail("malloc failed", r);
            }
            if (malloc_usable_size(p) < n) fail("malloc_usable_size below the request", r);
            uint64_t seed = id * 1000003 + (uint64_t)r * 131 + (uint64_t)k;
            total += fill(p, n, seed);
            if (k % 3 == 1 && !read_first) /* zero where fill wrote nothing */
                for (size_t j = PAGE / 2; j < n - 1; j += PAGE)
                    if (p[j]) fail("calloc memory not zero", r);
            blocks[k] = p;
            lens[k] = n;
        }
        /* grow the first block: content kept */
        uint64_t seed0 = id * 1000003 + (uint64_t)r * 131;
        size_t grown = lens[0] + lens[0] / 4;
        unsigned char *g = realloc(blocks[0], grown);
        if (!g) fail("realloc failed", r);
        for (size_t j = 0; j < lens[0]; j += PAGE)
            if (g[j] != (unsigned char)((seed0 * 31 + j / PAGE) & 0xff)) fail("realloc lost data", r);
        if (g[lens[0] - 1] != (unsigned char)seed0) fail("realloc lost data", r);
        g[grown - 1] = 7;
        blocks[0] = g;
        lens[0] = grown;
        /* small blocks in between */
        char *small[8];
        for (int s = 0; s < 8; s++) {
            small[s] = malloc(16 + 40 * (size_t)s);
            if (!small[s]) fail("malloc failed", r);
            memset(small[s], s, 16 + 40 * (size_t)s);
        }
        for (int k = 1; k < n_sizes; k++) {
            uint64_t seed = id * 1000003 + (uint64_t)r * 131 + (uint64_t)k;
            uint64_t c = check(blocks[k], lens[k], seed);
            if (c == UINT64_MAX) fail("data changed", r);
            total += c;
        }
        for (int s = 0; s < 8; s++) total += (unsigned char)small[s][15 + 40 * s], free(small[s]);
        for (int k = 0; k < n_sizes; k++) free(blocks[(k + r) % n_sizes]);
    }
    return (void *)(uintptr_t)total;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bigblocks ROUNDS THREADS SIZE...\n");
        return 2;
    }
    const char *rf = getenv("BIGBLOCKS_READ_FIRST");
    read_first = rf != NULL && rf[0] == '1';
    rounds = atoi(argv[1]);
    int threads = atoi(argv[2]);
    n_sizes = argc - 3 > MAX_SIZES ? MAX_SIZES : argc - 3;
    for (int k = 0; k < n_sizes; k++) sizes[k] = (size_t)strtoull(argv[3 + k], NULL, 10);
    uint64_t sum = 0;
    if (threads <= 1) {
        sum = (uint64_t)(uintptr_t)work((void *)0);
    } else {
        pthread_t t[64];
        if (threads > 64) threads = 64;
        for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, (void *)(uintptr_t)i);
        for (int i = 0; i < threads; i++) {
            void *v;
            pthread_join(t[i], &v);
            sum += (uint64_t)(uintptr_t)v;
        }
    }
    printf("rounds=%d threads=%d sizes=%d checksum=%llu\n", rounds, threads, n_sizes,
           (unsigned long long)sum);
    return 0;
}
