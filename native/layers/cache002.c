/*
 * cache002: an LD_PRELOAD layer that keeps the N largest recently freed large blocks of a process
 * and hands them out again (the policy of /work/shared/seeds/002, simulated as `seed002` by
 * tasks/whatif/simulate.py). Build: `make -C native cache002` -> native/build/libcache002.so (source: native/layers/cache002.c).
 *
 * Why: glibc serves blocks >= M_MMAP_THRESHOLD (128 KiB by default) with a fresh mmap and unmaps
 * them on free, so every large temporary is faulted in (and zeroed by the kernel) again. Kept
 * here instead, a block is reused with its pages already resident.
 *
 * Ownership: the layer never makes blocks of its own. Every block it hands out is a block the
 * next allocator (dlsym(RTLD_NEXT): glibc, or another preloaded library) returned earlier and the
 * program freed, so realloc, free, malloc_usable_size, memalign & co. of any pointer simply go to
 * that allocator: no header, no table of owned pointers. The only state is the cache itself: at
 * most HEAPCAST_CACHE_N (pointer, usable size) slots under one mutex (pthread_atfork keeps it
 * consistent across fork). A block freed while it is cached (a double free) leaves the cache and
 * both frees reach the next allocator's free, which reports it as it would without the layer.
 * While dlsym runs (start-up), every entry point serves from the pool or refuses (realloc of a
 * block the pool did not make: NULL, ENOMEM); none calls a function not yet looked up.
 *
 * The policy (usable sizes from the next allocator's malloc_usable_size):
 *  - free(p) with usable(p) >= HEAPCAST_CACHE_MIN: kept if fewer than N blocks are cached, or if
 *    it is at least as large as the smallest cached block, which is then released (ties: the
 *    oldest of the smallest). Otherwise released at once (the next allocator's free).
 *  - malloc(n) / calloc with n >= HEAPCAST_CACHE_MIN: the most recently cached block that FITS:
 *    usable >= n and usable - n < n + 4096 (at most half of a block, plus a page of rounding,
 *    wasted; the simulator's seed002 applies this very rule to glibc's usable sizes, which it
 *    computes from the requested ones). calloc clears the n bytes it returns. No fit: the next
 *    malloc.
 *  - realloc(p, n) where p's block or n is large: a cached block that fits n, p copied into it
 *    and freed (into the cache); no fit: the next allocator's realloc (in place, or mremap for
 *    an mmapped block: no copy, only the growth is faulted in), as the simulator models it.
 *    realloc(NULL, n) = malloc(n); realloc(p, 0) = free(p) and NULL (glibc's behaviour).
 *  - posix_memalign, aligned_alloc, memalign, valloc, pvalloc: like malloc, but only a cached
 *    block whose address has the alignment asked for serves them (glibc's mmapped blocks are
 *    16-aligned; blocks that came from an aligned call keep their alignment). Their blocks are
 *    ordinary blocks of the next allocator: freed, they may serve plain mallocs too.
 *
 * Variables: HEAPCAST_CACHE_N (default 4, 0 disables, at most 64), HEAPCAST_CACHE_MIN (bytes,
 * default 131072), HEAPCAST_CACHE_MADV_FREE=1 (madvise(MADV_FREE) a block's whole pages when
 * it is cached: the kernel may take them back under memory pressure, and a reuse then faults in
 * zero pages; the header page of the chunk is never advised), HEAPCAST_CACHE_STATS=<file>
 * (append one line of counters per process at exit). The layer writes nothing else, never to
 * stdout or stderr, and changes no exit code.
 *
 * Bootstrap: while dlsym looks up the next allocator (dlsym may call calloc), the static bump
 * pool of ../bootstrap_pool.h (shared with the tracer) serves allocations; free ignores pool
 * blocks, realloc copies out of the pool.
 * Not async-signal-safe (neither is glibc's malloc): a handler that allocates while its thread
 * holds the layer's lock would deadlock, as it would on glibc's arena lock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../bootstrap_pool.h"

#define C2_EXPORT __attribute__((visibility("default")))
#define C2_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define C2_LIKELY(x) __builtin_expect(!!(x), 1)
#define C2_MAX_N 64

/* The next allocator's functions (../real.h: hc_real, HC_REAL); malloc last. */
#define HC_REAL_FUNCS(X)                                                                          \
    X(free, void, (void *))                                                                       \
    X(malloc_usable_size, size_t, (void *))                                                       \
    X(calloc, void *, (size_t, size_t))                                                           \
    X(realloc, void *, (void *, size_t))                                                          \
    X(posix_memalign, int, (void **, size_t, size_t))                                             \
    X(aligned_alloc, void *, (size_t, size_t))                                                    \
    X(memalign, void *, (size_t, size_t))                                                         \
    X(valloc, void *, (size_t))                                                                   \
    X(pvalloc, void *, (size_t))                                                                  \
    X(malloc, void *, (size_t))
#include "../real.h"

struct c2_slot {
    void *p;
    size_t usable;
    uint64_t stamp; /* insertion order: larger = more recent */
};

static pthread_mutex_t c2_lock = PTHREAD_MUTEX_INITIALIZER;
static struct c2_slot c2_slots[C2_MAX_N];
static int c2_count;
static uint64_t c2_stamp;
static int c2_active;        /* set by the constructor once the settings are read */
static int c2_n = 4;         /* HEAPCAST_CACHE_N */
static size_t c2_min = 131072; /* HEAPCAST_CACHE_MIN */
static int c2_madv;          /* HEAPCAST_CACHE_MADV_FREE */
static size_t c2_page = 4096;

/* counters, under c2_lock */
static uint64_t c2_hits, c2_misses, c2_kept, c2_released, c2_evicted, c2_hit_bytes;
static uint64_t c2_double_frees;
static uint64_t c2_idle, c2_idle_peak;

/* ------------------------------------------------------------------------------------------- */
/* The cache                                                                                      */

static inline int c2_fits(size_t usable, size_t n) { return usable >= n && usable - n < n + 4096; }

/* The most recently cached fitting block for n bytes whose address is a multiple of `align`
 * (a power of two; 0 or 1: any), taken out of the cache; NULL if none. */
static void *c2_take_aligned(size_t n, size_t align) {
    if (!c2_active || n < c2_min || c2_n == 0) return NULL;
    uintptr_t mask = align > 1 ? (uintptr_t)(align - 1) : 0;
    void *p = NULL;
    pthread_mutex_lock(&c2_lock);
    int best = -1;
    for (int i = 0; i < c2_count; i++)
        if (c2_fits(c2_slots[i].usable, n) && ((uintptr_t)c2_slots[i].p & mask) == 0 &&
            (best < 0 || c2_slots[i].stamp > c2_slots[best].stamp))
            best = i;
    if (best >= 0) {
        p = c2_slots[best].p;
        c2_idle -= c2_slots[best].usable;
        c2_slots[best] = c2_slots[--c2_count];
        c2_hits++;
        c2_hit_bytes += n;
    } else {
        c2_misses++;
    }
    pthread_mutex_unlock(&c2_lock);
    return p;
}

static inline void *c2_take(size_t n) { return c2_take_aligned(n, 0); }

static inline int c2_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

static void c2_madvise(void *p, size_t usable) {
#ifdef MADV_FREE
    uintptr_t a = ((uintptr_t)p + c2_page - 1) & ~(uintptr_t)(c2_page - 1);
    uintptr_t b = ((uintptr_t)p + usable) & ~(uintptr_t)(c2_page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_FREE);
#else
    (void)p;
    (void)usable;
#endif
}

#define C2_DOUBLE_FREE ((void *)1)

/* Offer a freed block to the cache; returns the block to release (p, an evicted one, or NULL),
 * or C2_DOUBLE_FREE when p is already cached: the program freed it twice. */
static void *c2_offer(void *p, size_t usable) {
    void *out = p;
    pthread_mutex_lock(&c2_lock);
    for (int i = 0; i < c2_count; i++)
        if (c2_slots[i].p == p) {
            /* a double free: the block leaves the cache (it must never be handed out twice) */
            c2_idle -= c2_slots[i].usable;
            c2_slots[i] = c2_slots[--c2_count];
            c2_double_frees++;
            pthread_mutex_unlock(&c2_lock);
            return C2_DOUBLE_FREE;
        }
    pthread_mutex_unlock(&c2_lock);
    if (c2_madv) c2_madvise(p, usable); /* before it is visible to other threads */
    pthread_mutex_lock(&c2_lock);
    if (c2_count < c2_n) {
        c2_slots[c2_count++] = (struct c2_slot){p, usable, ++c2_stamp};
        c2_idle += usable;
        c2_kept++;
        out = NULL;
    } else {
        int small = 0;
        for (int i = 1; i < c2_count; i++)
            if (c2_slots[i].usable < c2_slots[small].usable ||
                (c2_slots[i].usable == c2_slots[small].usable &&
                 c2_slots[i].stamp < c2_slots[small].stamp))
                small = i;
        if (usable >= c2_slots[small].usable) {
            out = c2_slots[small].p;
            c2_idle -= c2_slots[small].usable;
            c2_slots[small] = (struct c2_slot){p, usable, ++c2_stamp};
            c2_idle += usable;
            c2_kept++;
            c2_evicted++;
        } else {
            c2_released++;
        }
    }
    if (c2_idle > c2_idle_peak) c2_idle_peak = c2_idle;
    pthread_mutex_unlock(&c2_lock);
    return out;
}

static void c2_free(void *p) {
    if (p == NULL || C2_UNLIKELY(hc_in_pool(p))) return;
    void (*real_free)(void *) = HC_REAL(free);
    if (C2_UNLIKELY(!real_free)) return; /* cannot happen: p came from somewhere */
    size_t (*usable_size)(void *) = HC_REAL(malloc_usable_size);
    if (c2_active && c2_n > 0 && usable_size) {
        size_t usable = usable_size(p);
        if (usable >= c2_min) {
            void *out = c2_offer(p, usable);
            if (out == NULL) return;
            if (C2_UNLIKELY(out == C2_DOUBLE_FREE)) {
                /* what the program did, in order, reaches the real free: the first free that
                 * the cache held back, then the second one, which glibc reports (it aborts, or
                 * faults on the unmapped header) exactly as it would without the layer */
                real_free(p);
            } else {
                p = out;
            }
        }
    }
    real_free(p);
}

static void *c2_malloc(size_t n) {
    void *p = c2_take(n);
    if (p) return p;
    void *(*f)(size_t) = HC_REAL(malloc);
    return f ? f(n) : hc_pool_alloc(n, 16);
}

/* ------------------------------------------------------------------------------------------- */
/* Hooks                                                                                          */

C2_EXPORT void *malloc(size_t n) { return c2_malloc(n); }

C2_EXPORT void free(void *p) { c2_free(p); }

C2_EXPORT void *calloc(size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = c2_take(total);
    if (p) return memset(p, 0, total);
    void *(*f)(size_t, size_t) = HC_REAL(calloc);
    return f ? f(m, n) : hc_pool_alloc(total, 16);
}

C2_EXPORT void *realloc(void *old, size_t n) {
    if (old == NULL) return c2_malloc(n);
    if (C2_UNLIKELY(hc_in_pool(old))) {
        void *q = c2_malloc(n);
        if (q) {
            size_t o = hc_pool_size(old);
            memcpy(q, old, o < n ? o : n);
        }
        return q;
    }
    if (n == 0) {
        c2_free(old);
        return NULL;
    }
    size_t (*usable_size)(void *) = HC_REAL(malloc_usable_size);
    size_t usable = usable_size ? usable_size(old) : 0;
    if (c2_active && c2_n > 0 && usable_size && (usable >= c2_min || n >= c2_min)) {
        void *q = c2_take(n);
        if (q) {
            memcpy(q, old, usable < n ? usable : n);
            c2_free(old);
            return q;
        }
    }
    void *(*real_realloc)(void *, size_t) = HC_REAL(realloc);
    if (C2_UNLIKELY(!real_realloc)) {
        /* still looking up the real allocator (dlsym re-entry) and old is not a pool block: it
         * cannot be resized yet; a failed realloc keeps the old block, as C allows */
        errno = ENOMEM;
        return NULL;
    }
    return real_realloc(old, n); /* glibc: in place, or mremap for mmapped blocks */
}

C2_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

/* Aligned requests: a cached block serves one only if its address has the alignment; invalid
 * arguments go to the next allocator, which reports them as it does. */
C2_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    if (c2_pow2(align) && align % sizeof(void *) == 0) {
        void *p = c2_take_aligned(n, align);
        if (p) {
            *out = p;
            return 0;
        }
    }
    int (*f)(void **, size_t, size_t) = HC_REAL(posix_memalign);
    if (C2_LIKELY(f != NULL)) return f(out, align, n);
    /* start-up (dlsym re-entry): the pool, with glibc's argument check */
    if (!c2_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
    void *p = hc_pool_alloc(n, align);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

C2_EXPORT void *aligned_alloc(size_t align, size_t n) {
    void *p = c2_pow2(align) ? c2_take_aligned(n, align) : NULL;
    if (p) return p;
    void *(*f)(size_t, size_t) = HC_REAL(aligned_alloc);
    if (C2_LIKELY(f != NULL)) return f(align, n);
    return c2_pow2(align) ? hc_pool_alloc(n, align) : NULL; /* start-up: the pool */
}

C2_EXPORT void *memalign(size_t align, size_t n) {
    void *p = c2_pow2(align) ? c2_take_aligned(n, align) : NULL;
    if (p) return p;
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (C2_LIKELY(f != NULL)) return f(align, n);
    return c2_pow2(align) ? hc_pool_alloc(n, align) : NULL; /* start-up: the pool */
}

C2_EXPORT void *valloc(size_t n) {
    void *p = c2_take_aligned(n, c2_page);
    if (p) return p;
    void *(*f)(size_t) = HC_REAL(valloc);
    return C2_LIKELY(f != NULL) ? f(n) : hc_pool_alloc(n, c2_page); /* start-up: the pool */
}

C2_EXPORT void *pvalloc(size_t n) {
    size_t rounded = (n + c2_page - 1) & ~(c2_page - 1);
    void *p = rounded >= n ? c2_take_aligned(rounded, c2_page) : NULL;
    if (p) return p;
    void *(*f)(size_t) = HC_REAL(pvalloc);
    if (C2_LIKELY(f != NULL)) return f(n);
    return rounded >= n ? hc_pool_alloc(rounded, c2_page) : NULL; /* start-up: the pool */
}

C2_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (C2_UNLIKELY(hc_in_pool(p))) return hc_pool_size(p);
    size_t (*f)(void *) = HC_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}

/* ------------------------------------------------------------------------------------------- */
/* Start, fork, exit                                                                              */

static void c2_fork_prepare(void) { pthread_mutex_lock(&c2_lock); }
static void c2_fork_parent(void) { pthread_mutex_unlock(&c2_lock); }
static void c2_fork_child(void) { pthread_mutex_unlock(&c2_lock); }

static long c2_env_long(const char *name, long dflt, long lo, long hi) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return dflt;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0') return dflt;
    return v < lo ? lo : v > hi ? hi : v;
}

__attribute__((constructor)) static void c2_init(void) {
    hc_resolve();
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) c2_page = (size_t)page;
    c2_n = (int)c2_env_long("HEAPCAST_CACHE_N", 4, 0, C2_MAX_N);
    c2_min = (size_t)c2_env_long("HEAPCAST_CACHE_MIN", 131072, 1, (long)1 << 50);
    c2_madv = c2_env_long("HEAPCAST_CACHE_MADV_FREE", 0, 0, 1) != 0;
    pthread_atfork(c2_fork_prepare, c2_fork_parent, c2_fork_child);
    __atomic_store_n(&c2_active, 1, __ATOMIC_RELEASE);
}

static char *c2_put(char *p, const char *key, uint64_t v) {
    while (*key) *p++ = *key++;
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = digits[--n];
    *p++ = ' ';
    return p;
}

__attribute__((destructor)) static void c2_fini(void) {
    const char *path = getenv("HEAPCAST_CACHE_STATS");
    if (path == NULL || *path == '\0') return;
    char line[512];
    char *p = line;
    pthread_mutex_lock(&c2_lock);
    p = c2_put(p, "pid=", (uint64_t)getpid());
    p = c2_put(p, "n=", (uint64_t)c2_n);
    p = c2_put(p, "min=", (uint64_t)c2_min);
    p = c2_put(p, "hits=", c2_hits);
    p = c2_put(p, "misses=", c2_misses);
    p = c2_put(p, "hit_bytes=", c2_hit_bytes);
    p = c2_put(p, "kept=", c2_kept);
    p = c2_put(p, "released=", c2_released);
    p = c2_put(p, "evicted=", c2_evicted);
    p = c2_put(p, "idle_peak=", c2_idle_peak);
    p = c2_put(p, "cached_at_exit=", (uint64_t)c2_count);
    p = c2_put(p, "double_frees=", c2_double_frees);
    pthread_mutex_unlock(&c2_lock);
    p[-1] = '\n';
    int saved = errno;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t left = p - line;
        const char *q = line;
        while (left > 0) {
            ssize_t w = write(fd, q, (size_t)left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            q += w;
            left -= w;
        }
        close(fd);
    }
    errno = saved;
}
