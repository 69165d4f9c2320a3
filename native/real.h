/*
 * The real functions behind an LD_PRELOAD library's hooks: the list of the allocator's functions
 * (HC_REAL_ALLOC, below: one list for the tracer, heapcast.c, and both layers, layers/layer.c and
 * layers/place.c), looked up once with dlsym(RTLD_NEXT, ...) (glibc, or the next preloaded
 * allocator), lazily, on the first call that needs one.
 *
 * Use, once per library (one translation unit):
 *
 *     #include "real.h"            (the allocator's functions: HC_REAL_ALLOC)
 *
 * or, with functions of its own in front of them (the tracer's exec family):
 *
 *     #define HC_REAL_FUNCS(X) MY_FUNCS(X) HC_REAL_ALLOC(X)
 *     #include "real.h"
 *
 * which defines `struct hc_real` (one function pointer per entry), `hc_real` (the pointers),
 * `hc_resolve()` (look them all up) and `HC_REAL(name)` (the real function `name`, looked up on
 * first use; NULL while dlsym runs). A function a library calls only where it is needed, outside
 * the list (jemalloc's mallocx, C++'s operators), is looked up on first use by HC_NEXT.
 *
 * Start-up: dlsym itself may call calloc (its error buffer), which reaches the library's own
 * hook while the lookup is under way. A nested hc_resolve returns at once and HC_REAL yields
 * NULL: the hook then serves from bootstrap_pool.h (or refuses, for a realloc of a block the
 * pool did not make).
 *
 * Order: the pointers are published in the order HC_REAL_FUNCS lists them, each with a release
 * store; malloc comes last, so that a thread that sees malloc sees every other one too (the hot
 * paths read the others without a check once malloc or the library's own start flag is seen).
 */
#ifndef HEAPCAST_REAL_H
#define HEAPCAST_REAL_H

#include <dlfcn.h>

/* The allocator's functions, X(name, return type, (parameter types)); malloc last (see Order).
 * A library looks them all up and calls those it needs: the tracer every one but mallopt, the
 * layer every one but reallocarray, placement neither of those nor pvalloc (place/hooks.c says
 * why). */
#define HC_REAL_ALLOC(X)                                                                          \
    X(mallopt, int, (int, int))                                                                   \
    X(malloc_usable_size, size_t, (void *))                                                       \
    X(free, void, (void *))                                                                       \
    X(realloc, void *, (void *, size_t))                                                          \
    X(reallocarray, void *, (void *, size_t, size_t))                                             \
    X(posix_memalign, int, (void **, size_t, size_t))                                             \
    X(aligned_alloc, void *, (size_t, size_t))                                                    \
    X(memalign, void *, (size_t, size_t))                                                         \
    X(valloc, void *, (size_t))                                                                   \
    X(pvalloc, void *, (size_t))                                                                  \
    X(calloc, void *, (size_t, size_t))                                                           \
    X(malloc, void *, (size_t))

#ifndef HC_REAL_FUNCS
#define HC_REAL_FUNCS(X) HC_REAL_ALLOC(X)
#endif

/* On cache lines of its own (the size rounds up to them): read at every call by every thread,
 * never next to a variable some thread writes. */
struct hc_real {
#define HC_REAL_FIELD_(name, ret, params) ret(*name) params;
    HC_REAL_FUNCS(HC_REAL_FIELD_)
#undef HC_REAL_FIELD_
} __attribute__((aligned(64)));
static struct hc_real hc_real;

/* Look every function up, then publish them in list order (malloc last). A nested call (dlsym
 * allocating) returns at once: its caller finds NULL and uses the pool. */
static void hc_resolve(void) {
    static int resolving;
    if (__atomic_exchange_n(&resolving, 1, __ATOMIC_ACQUIRE)) return;
    struct hc_real r;
#define HC_REAL_LOOKUP_(name, ret, params) r.name = (ret(*) params)dlsym(RTLD_NEXT, #name);
    HC_REAL_FUNCS(HC_REAL_LOOKUP_)
#undef HC_REAL_LOOKUP_
#define HC_REAL_PUBLISH_(name, ret, params) __atomic_store_n(&hc_real.name, r.name, __ATOMIC_RELEASE);
    HC_REAL_FUNCS(HC_REAL_PUBLISH_)
#undef HC_REAL_PUBLISH_
    __atomic_store_n(&resolving, 0, __ATOMIC_RELEASE);
}

/* The real function `name`, looked up on first use; NULL while dlsym runs (the caller uses the
 * bootstrap pool or refuses). One acquire load (a plain load on x86-64) once resolved. */
#define HC_REAL(name)                                                                             \
    ({                                                                                            \
        __typeof__(hc_real.name) hc_f_ = __atomic_load_n(&hc_real.name, __ATOMIC_ACQUIRE);         \
        if (__builtin_expect(hc_f_ == NULL, 0)) {                                                 \
            hc_resolve();                                                                         \
            hc_f_ = __atomic_load_n(&hc_real.name, __ATOMIC_ACQUIRE);                             \
        }                                                                                         \
        hc_f_;                                                                                    \
    })

/* A function of the next library that is not in the list, looked up on first use into `fn` (a
 * static pointer of its type; NULL if there is none). One acquire load once found. */
#define HC_NEXT(fn, name)                                                                         \
    ({                                                                                            \
        __typeof__(fn) hc_n_ = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);                            \
        if (__builtin_expect(hc_n_ == NULL, 0)) {                                                 \
            hc_n_ = (__typeof__(fn))dlsym(RTLD_NEXT, name);                                       \
            __atomic_store_n(&fn, hc_n_, __ATOMIC_RELEASE);                                       \
        }                                                                                         \
        hc_n_;                                                                                    \
    })

#endif
