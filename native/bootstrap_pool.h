/*
 * The start-up memory pool of every heapcast LD_PRELOAD library (the tracer, heapcast.c, and the
 * allocator layers in layers/): one copy, included once per library.
 *
 * Why: the real allocator functions come from dlsym(RTLD_NEXT, ...), and dlsym itself may call
 * calloc (glibc's dlerror buffer), which is our own hook: while the lookup runs there is no real
 * function to call. A static bump pool serves those calls. Blocks are never reused: free() must
 * ignore pool pointers (hc_in_pool), realloc() copies out of the pool (hc_pool_size gives the
 * old length), malloc_usable_size reports hc_pool_size. The pool is static, so already zero
 * (fine for calloc). Each block is preceded by its size, with the word's top bit set
 * (HC_POOL_MARK): no glibc chunk word has it, so a free path that tells glibc's small blocks by
 * that word (layers/layer/hooks.c free) never takes a pool block for one.
 *
 * Lock-free (one compare-and-swap per block): the first calls may come from any thread.
 */
#ifndef HEAPCAST_BOOTSTRAP_POOL_H
#define HEAPCAST_BOOTSTRAP_POOL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* 64 KiB: dlsym's lookups take a few hundred bytes; the rest is margin for other libraries'
 * constructors that allocate before the lookup has finished. */
#define HC_POOL_BYTES (64u * 1024u)

#define HC_POOL_MARK ((size_t)1 << (8 * sizeof(size_t) - 1))

static unsigned char hc_pool[HC_POOL_BYTES] __attribute__((aligned(64)));
static size_t hc_pool_used;

static inline int hc_in_pool(const void *p) {
    return (const unsigned char *)p >= hc_pool && (const unsigned char *)p < hc_pool + HC_POOL_BYTES;
}

/* n bytes aligned to `align` (a power of two; below 16: 16), or NULL with errno ENOMEM. */
static void *hc_pool_alloc(size_t n, size_t align) {
    if (align < 16) align = 16;
    if (align > HC_POOL_BYTES / 2) {
        errno = ENOMEM;
        return NULL;
    }
    size_t old = __atomic_load_n(&hc_pool_used, __ATOMIC_RELAXED);
    for (;;) {
        /* the address is aligned, not the offset: the pool itself is only 64-aligned */
        uintptr_t base = (uintptr_t)hc_pool;
        size_t start = (size_t)(((base + old + 16 + align - 1) & ~(uintptr_t)(align - 1)) - base);
        if (start > HC_POOL_BYTES || n > HC_POOL_BYTES - start) {
            errno = ENOMEM;
            return NULL;
        }
        if (__atomic_compare_exchange_n(&hc_pool_used, &old, start + n, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            ((size_t *)(hc_pool + start))[-1] = n | HC_POOL_MARK;
            return hc_pool + start;
        }
    }
}

/* The length asked for when the pool block p was made. */
static inline size_t hc_pool_size(const void *p) {
    return ((const size_t *)p)[-1] & ~HC_POOL_MARK;
}

#endif
