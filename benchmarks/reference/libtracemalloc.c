/*
 * libtracemalloc: the seed article's LD_PRELOAD tracer (libtracemalloc), re-implemented from its
 * description for benchmarks/bench_convert.py. It is the *reference*: it must cost per call what
 * the article's design costs, so it is deliberately not optimised.
 *
 * The article's design, kept as is:
 *   - one log file, opened with O_WRONLY | O_CREAT | O_EXCL (O_EXCL so that two processes that
 *     inherit the preload never share or overwrite one log: the second one's open fails and it
 *     runs untraced); its path comes from $TRACEMALLOC_LOG; no variable or a failed open: every
 *     call passes straight through, untraced;
 *   - per call: gettimeofday(), sprintf() of one text line, and one write() syscall, the write
 *     under one global pthread mutex (so lines of different threads never interleave);
 *   - the line formats (time is sec.usec since the first logged call, the thread is
 *     pthread_self() printed as a long, %p prints NULL as "(nil)" in glibc):
 *       allocation               "%ld.%06ld\t%ld\t%zu\t%p\n"        size, pointer
 *       free                     "%ld.%06ld\t%ld\t-1\t%p\n"         (free(NULL) is logged too)
 *       realloc / reallocarray   "%ld.%06ld\t%ld\t%zu\t%p\t%p\n"    new size, new ptr, old ptr
 *     calloc(n, m) and reallocarray(p, n, m) log n * m bytes (wrapping like C's size_t product);
 *     posix_memalign, aligned_alloc, memalign, valloc and pvalloc log the size asked for.
 *   - the time of an allocation is read before the real call and the line written after it; a
 *     free's line is written before the block is released (so no other thread can be handed the
 *     same address and log it first). realloc releases the old block inside the real call, before
 *     its line is written; the article did not hook realloc, and holding the mutex across the
 *     call would serialise the allocator, which is not the article's cost.
 *
 * What the article glossed over and a working preload needs (each explained where it is):
 *   - the real functions are found lazily with dlsym(RTLD_NEXT, ...);
 *   - a thread-local re-entrancy guard: calls made while this thread is inside the tracer pass
 *     through untraced;
 *   - a small static bootstrap buffer for the malloc/calloc calls that dlsym itself makes before
 *     the real allocator is known.
 *
 * Build: cc -O2 -shared -fPIC -o libtracemalloc.so libtracemalloc.c -ldl -lpthread
 * (benchmarks/reference/article_log.py does it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------- */
/* The real functions, found with dlsym(RTLD_NEXT) on the first call (lazily: a preloaded library
 * has no reliable earlier moment; its constructor may run after other libraries already called
 * malloc). */

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void *(*real_reallocarray)(void *, size_t, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);

/* ------------------------------------------------------------------------------------------- */
/* Re-entrancy guard. While a thread is inside the tracer (looking up the real functions, or
 * formatting and writing a line), anything it allocates (dlsym's own buffers, stdio's locale
 * data in sprintf, ...) would re-enter these hooks: it would recurse into the initialisation
 * (deadlock in pthread_once) or try to take the log mutex it already holds. With the guard set,
 * such calls go straight to the real function (or the bootstrap buffer), untraced.
 * initial-exec TLS: the variable lives in static TLS, so reading it never calls __tls_get_addr,
 * which may itself allocate. */
static __thread int in_tracer __attribute__((tls_model("initial-exec")));

/* ------------------------------------------------------------------------------------------- */
/* Bootstrap buffer. dlsym() may call calloc/malloc (e.g. for its error state) while we are still
 * looking up the real malloc: those calls cannot be passed on to a function we do not know yet.
 * They are served from this static buffer by bumping a pointer; blocks are never reused. free()
 * of a pointer inside it is ignored; realloc() of one copies it out to the real allocator. Each
 * block is preceded by its size (for that copy). */
#define BOOT_BYTES (16u * 1024u)
static unsigned char boot_buf[BOOT_BYTES] __attribute__((aligned(16)));
static size_t boot_used;

static int in_boot(const void *p) {
    return (const unsigned char *)p >= boot_buf && (const unsigned char *)p < boot_buf + BOOT_BYTES;
}

static void *boot_alloc(size_t n) {
    size_t need = 16 + ((n + 15) & ~(size_t)15);
    if (n > BOOT_BYTES) {
        errno = ENOMEM;
        return NULL;
    }
    size_t start = __atomic_fetch_add(&boot_used, need, __ATOMIC_RELAXED);
    if (start + need > BOOT_BYTES) {
        errno = ENOMEM;
        return NULL;
    }
    unsigned char *p = boot_buf + start + 16;
    ((size_t *)p)[-1] = n;
    return p; /* static storage: already zero, so good for calloc too */
}

/* ------------------------------------------------------------------------------------------- */
/* The log. */

static int log_fd = -1;
static int tracing;                 /* 1 once the log is open */
static struct timeval t0;           /* time of the first logged call: the log starts at 0.000000 */
static int t0_state;                /* 0: not taken yet, 1: being taken, 2: taken */
static pthread_mutex_t write_sync = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void) {
    in_tracer = 1;
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    real_reallocarray = (void *(*)(void *, size_t, size_t))dlsym(RTLD_NEXT, "reallocarray");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
    real_valloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "valloc");
    real_pvalloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "pvalloc");
    const char *path = getenv("TRACEMALLOC_LOG");
    if (path && *path && real_malloc && real_free) {
        log_fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (log_fd >= 0) tracing = 1;
    }
    in_tracer = 0;
}

/* 1 when this call is to be logged. Every hook asks first; the first one to ask (in any thread)
 * runs init, the others wait for it in pthread_once. Never called with the guard set, so init's
 * own allocations cannot re-enter pthread_once. */
static inline int should_log(void) {
    if (in_tracer) return 0;
    pthread_once(&init_once, init);
    return tracing;
}

/* The article's get_time: wall-clock seconds and microseconds since the first logged call. The
 * first call to get here takes its own time as t0 (so the log starts at 0.000000); a thread that
 * races it waits the few nanoseconds until t0 is published. */
static inline void get_time(long *sec, long *usec) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if (__builtin_expect(__atomic_load_n(&t0_state, __ATOMIC_ACQUIRE) != 2, 0)) {
        int expected = 0;
        if (__atomic_compare_exchange_n(&t0_state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            t0 = tv;
            __atomic_store_n(&t0_state, 2, __ATOMIC_RELEASE);
        } else {
            while (__atomic_load_n(&t0_state, __ATOMIC_ACQUIRE) != 2) {
            }
        }
    }
    long d = (long)(tv.tv_sec - t0.tv_sec) * 1000000L + (long)(tv.tv_usec - t0.tv_usec);
    if (d < 0) d = 0; /* a thread that lost the race for t0, or the wall clock stepped back */
    *sec = d / 1000000L;
    *usec = d % 1000000L;
}

/* One line, one write(), under the global mutex (called with the guard set). */
static void log_alloc(long sec, long usec, size_t size, void *ptr) {
    char record[128];
    pthread_mutex_lock(&write_sync);
    ssize_t r = write(log_fd, record,
                      sprintf(record, "%ld.%06ld\t%ld\t%zu\t%p\n", sec, usec,
                              (long)pthread_self(), size, ptr));
    pthread_mutex_unlock(&write_sync);
    (void)r;
}

static void log_free(long sec, long usec, void *ptr) {
    char record[128];
    pthread_mutex_lock(&write_sync);
    ssize_t r = write(log_fd, record,
                      sprintf(record, "%ld.%06ld\t%ld\t-1\t%p\n", sec, usec,
                              (long)pthread_self(), ptr));
    pthread_mutex_unlock(&write_sync);
    (void)r;
}

static void log_realloc(long sec, long usec, size_t size, void *ptr, void *old) {
    char record[128];
    pthread_mutex_lock(&write_sync);
    ssize_t r = write(log_fd, record,
                      sprintf(record, "%ld.%06ld\t%ld\t%zu\t%p\t%p\n", sec, usec,
                              (long)pthread_self(), size, ptr, old));
    pthread_mutex_unlock(&write_sync);
    (void)r;
}

/* ------------------------------------------------------------------------------------------- */
/* The hooks. Untraced path: the real function, or the bootstrap buffer while it is unknown. */

void *malloc(size_t size) {
    if (!should_log()) return real_malloc ? real_malloc(size) : boot_alloc(size);
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    void *ptr = real_malloc(size);
    log_alloc(sec, usec, size, ptr);
    in_tracer = 0;
    return ptr;
}

void *calloc(size_t n, size_t m) {
    if (!should_log()) {
        if (real_calloc) return real_calloc(n, m);
        size_t total;
        if (__builtin_mul_overflow(n, m, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        return boot_alloc(total);
    }
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    void *ptr = real_calloc(n, m);
    log_alloc(sec, usec, n * m, ptr);
    in_tracer = 0;
    return ptr;
}

/* realloc of a bootstrap block: a new real block with the old contents (the old one stays). */
static void *realloc_from_boot(void *old, size_t size) {
    void *ptr = real_malloc(size);
    if (ptr) {
        size_t n = ((size_t *)old)[-1];
        memcpy(ptr, old, n < size ? n : size);
    }
    return ptr;
}

void *realloc(void *old, size_t size) {
    if (!should_log()) {
        if (!real_realloc) {
            void *ptr = boot_alloc(size);
            if (ptr && old) {
                size_t n = ((size_t *)old)[-1];
                memcpy(ptr, old, n < size ? n : size);
            }
            return ptr;
        }
        return in_boot(old) ? realloc_from_boot(old, size) : real_realloc(old, size);
    }
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    void *ptr = in_boot(old) ? realloc_from_boot(old, size) : real_realloc(old, size);
    log_realloc(sec, usec, size, ptr, old);
    in_tracer = 0;
    return ptr;
}

void *reallocarray(void *old, size_t n, size_t m) {
    if (!should_log() || in_boot(old)) {
        size_t total;
        if (__builtin_mul_overflow(n, m, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        if (in_boot(old)) return realloc(old, total);
        return real_reallocarray ? real_reallocarray(old, n, m) : NULL;
    }
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    void *ptr = real_reallocarray(old, n, m);
    log_realloc(sec, usec, n * m, ptr, old);
    in_tracer = 0;
    return ptr;
}

void free(void *ptr) {
    if (in_boot(ptr)) return; /* bootstrap blocks are never reused: nothing to release */
    if (!should_log()) {
        if (real_free) real_free(ptr);
        return;
    }
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    log_free(sec, usec, ptr);
    real_free(ptr);
    in_tracer = 0;
}

int posix_memalign(void **out, size_t align, size_t size) {
    if (!should_log()) return real_posix_memalign ? real_posix_memalign(out, align, size) : ENOMEM;
    in_tracer = 1;
    long sec, usec;
    get_time(&sec, &usec);
    int rc = real_posix_memalign(out, align, size);
    log_alloc(sec, usec, size, rc == 0 ? *out : NULL);
    in_tracer = 0;
    return rc;
}

/* aligned_alloc, memalign, valloc, pvalloc: the same shape, one macro. */
#define ALIGNED_HOOK(name, params, args, size)                                                   \
    void *name params {                                                                        \
        if (!should_log()) return real_##name ? real_##name args : NULL;                       \
        in_tracer = 1;                                                                         \
        long sec, usec;                                                                        \
        get_time(&sec, &usec);                                                                 \
        void *ptr = real_##name args;                                                          \
        log_alloc(sec, usec, size, ptr);                                                       \
        in_tracer = 0;                                                                         \
        return ptr;                                                                            \
    }

ALIGNED_HOOK(aligned_alloc, (size_t align, size_t size), (align, size), size)
ALIGNED_HOOK(memalign, (size_t align, size_t size), (align, size), size)
ALIGNED_HOOK(valloc, (size_t size), (size), size)
ALIGNED_HOOK(pvalloc, (size_t size), (size), size)
