/* Shared by heapcast's multi-threaded allocation workloads (docker/workloads/threads/src).
 *
 * Every block carries a header (its stamp and size) written by the thread that allocated it and
 * checked by the thread that frees it; each free adds a hash of (stamp, size) to a checksum.
 * The set of blocks a run makes depends only on its arguments (each thread or round draws from
 * its own generator), and a sum does not depend on the order of its terms, so the checksum is
 * the same whatever the scheduling and whatever the allocator: it is the workload's output. */
#ifndef HEAPCAST_STRESS_H
#define HEAPCAST_STRESS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct block {
    uint64_t stamp;
    uint64_t size; /* bytes asked for, header included */
};

static inline uint64_t mix64(uint64_t x)
{ /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* a generator per thread or round: state = mix of (seed, a, b) */
static inline uint64_t rng_seed(uint64_t seed, uint64_t a, uint64_t b)
{
    return mix64(seed ^ mix64(a * 0x100000001b3ULL ^ mix64(b)));
}

static inline uint64_t rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rng_below(uint64_t *state, uint64_t n)
{
    return rng_next(state) % n;
}

static void die(const char *what)
{
    fprintf(stderr, "%s\n", what);
    exit(2);
}

/* Allocate `size` bytes (at least a header and a byte), stamp them: header, and the last byte. */
static inline struct block *block_new(size_t size, uint64_t stamp)
{
    if (size <= sizeof(struct block))
        size = sizeof(struct block) + 1;
    struct block *b = malloc(size);
    if (b == NULL)
        die("out of memory");
    b->stamp = stamp;
    b->size = size;
    ((unsigned char *)b)[size - 1] = (unsigned char)stamp;
    return b;
}

/* Check a block, free it, return its share of the checksum. A block damaged in between (an
 * allocator handing one block out twice) stops the program with exit code 3. */
static inline uint64_t block_free(struct block *b)
{
    uint64_t stamp = b->stamp, size = b->size;
    if (((unsigned char *)b)[size - 1] != (unsigned char)stamp) {
        fprintf(stderr, "block %p (stamp %016llx, %llu bytes) damaged\n", (void *)b,
                (unsigned long long)stamp, (unsigned long long)size);
        exit(3);
    }
    free(b);
    return mix64(stamp ^ (size << 40));
}

/* A size in [lo, hi), with a heavier tail: one draw in `big_every` is up to `big` bytes. */
static inline size_t draw_size(uint64_t *rng, size_t lo, size_t hi, uint64_t big_every, size_t big)
{
    if (big_every && rng_below(rng, big_every) == 0)
        return hi + rng_below(rng, big - hi);
    return lo + rng_below(rng, hi - lo);
}

static long arg_long(const char *s, const char *name, long lo, long hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "bad %s %s: expected an integer in [%ld, %ld]\n", name, s, lo, hi);
        exit(2);
    }
    return v;
}

#endif
