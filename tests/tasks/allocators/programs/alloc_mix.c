/* alloc_mix: a heap workout whose output is the same under every allocator.
 *
 *   alloc_mix [ITERATIONS]          (default 20000 per thread)
 *
 * Three threads (the main one and two more) each run a seeded random mix of malloc, calloc,
 * realloc (growing and shrinking), posix_memalign, aligned_alloc and free over 512 slots, with
 * sizes from 8 bytes to 1 MiB (a few from 128 KiB up: mmap territory for glibc). Every block is
 * filled with bytes from the thread's generator and checked before it is freed or moved, so the
 * checksums printed on stdout depend only on the seeds, never on addresses or the allocator.
 *
 * On stderr it says which allocator serves malloc (looked up by a symbol only that allocator
 * exports), so a test can see that LD_PRELOAD took effect. With ALLOC_MIX_FAIL_UNDER=<name> it
 * exits 3 under that allocator: a workload that fails under one allocator only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 512
#define THREADS 3

struct slot {
    unsigned char *p;
    size_t size;
    uint64_t seed; /* the bytes of the block are a function of (seed, index) */
};

struct work {
    uint64_t state;
    long iterations;
    uint64_t checksum;
    long errors;
    long calls;
};

static uint64_t next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static unsigned char byte_at(uint64_t seed, size_t i) {
    return (unsigned char)((seed >> ((i % 8) * 8)) ^ (i * 131));
}

static void fill(struct slot *s, size_t from) {
    for (size_t i = from; i < s->size; i++) s->p[i] = byte_at(s->seed, i);
}

static void check(struct work *w, struct slot *s, size_t upto) {
    uint64_t sum = 0;
    for (size_t i = 0; i < upto; i++) {
        if (s->p[i] != byte_at(s->seed, i)) w->errors++;
        sum = sum * 31 + s->p[i];
    }
    w->checksum ^= sum + upto;
}

static size_t pick_size(struct work *w) {
    uint64_t r = next(&w->state) % 1000;
    uint64_t x = next(&w->state);
    if (r < 600) return 8 + x % 57;                /* <= 64 B */
    if (r < 900) return 65 + x % 960;              /* <= 1 KiB */
    if (r < 990) return 1025 + x % (64 * 1024);    /* up to 65 KiB */
    return 128 * 1024 + x % (896 * 1024);          /* 128 KiB - 1 MiB */
}

static void *run(void *arg) {
    struct work *w = arg;
    struct slot slots[SLOTS];
    memset(slots, 0, sizeof slots);
    for (long it = 0; it < w->iterations; it++) {
        struct slot *s = &slots[next(&w->state) % SLOTS];
        uint64_t what = next(&w->state) % 10;
        w->calls++;
        if (s->p == NULL) {
            size_t size = pick_size(w);
            s->seed = next(&w->state);
            if (what < 6) {
                s->p = malloc(size);
            } else if (what < 8) {
                s->p = calloc(1, size);
                if (s->p)
                    for (size_t i = 0; i < size; i++) w->errors += s->p[i] != 0;
            } else if (what < 9) {
                void *q = NULL;
                if (posix_memalign(&q, 64, size) == 0) s->p = q;
                if (((uintptr_t)s->p & 63) != 0) w->errors++;
            } else {
                s->p = aligned_alloc(256, (size + 255) / 256 * 256);
                size = (size + 255) / 256 * 256;
                if (((uintptr_t)s->p & 255) != 0) w->errors++;
            }
            if (s->p == NULL) {
                w->errors++;
                continue;
            }
            s->size = size;
            if (malloc_usable_size(s->p) < size) w->errors++;
            fill(s, 0);
        } else if (what < 3 && s->size < (2u << 20)) {
            size_t size = s->size + 1 + next(&w->state) % (s->size + 64); /* grow */
            size_t keep = s->size;
            check(w, s, keep);
            unsigned char *q = realloc(s->p, size);
            if (q == NULL) {
                w->errors++;
                continue;
            }
            s->p = q;
            check(w, s, keep); /* realloc kept the contents */
            s->size = size;
            fill(s, keep);
        } else if (what < 4) {
            size_t size = 1 + s->size / 2; /* shrink */
            unsigned char *q = realloc(s->p, size);
            if (q == NULL) {
                w->errors++;
                continue;
            }
            s->p = q;
            s->size = size;
            check(w, s, size);
        } else {
            check(w, s, s->size);
            free(s->p);
            s->p = NULL;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].p) {
            check(w, &slots[i], slots[i].size);
            free(slots[i].p);
        }
    return NULL;
}

static const char *allocator(void) {
    if (dlsym(RTLD_DEFAULT, "mallctl")) return "jemalloc";
    if (dlsym(RTLD_DEFAULT, "tc_malloc")) return "tcmalloc";
    if (dlsym(RTLD_DEFAULT, "mi_malloc")) return "mimalloc";
    return "glibc";
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 20000;
    const char *name = allocator();
    fprintf(stderr, "alloc_mix: allocator=%s\n", name);
    const char *fail = getenv("ALLOC_MIX_FAIL_UNDER");
    if (fail && strcmp(fail, name) == 0) {
        fprintf(stderr, "alloc_mix: failing on purpose under %s\n", name);
        return 3;
    }
    struct work w[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct work){.state = 1000 + (uint64_t)i, .iterations = iterations};
        if (i > 0) pthread_create(&t[i], NULL, run, &w[i]);
    }
    run(&w[0]);
    long errors = w[0].errors;
    for (int i = 1; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    for (int i = 0; i < THREADS; i++)
        printf("thread %d: %ld calls, checksum %016llx\n", i, w[i].calls,
               (unsigned long long)w[i].checksum);
    printf("errors %ld\n", errors);
    return errors ? 1 : 0;
}
