/* The cost of the two Debian allocators' "separate heap" APIs beside their plain malloc/free, per
 * pair of malloc(64)/free in a tight loop (one thread, its CPU time): the choice of placement's
 * backend (docs/layer.md, Placement). Built twice:
 *   cc -O2 -DJE heapapi.c /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 -o heapapi_je
 *   cc -O2 -DMI heapapi.c /usr/lib/x86_64-linux-gnu/libmimalloc.so.2 -o heapapi_mi
 * jemalloc: malloc; mallocx(MALLOCX_ARENA(a) | MALLOCX_TCACHE_NONE) of a created arena (what the
 * layer uses); the same with an explicit tcache (tcache.create: one per thread, which a layer
 * would have to create and destroy per thread). mimalloc: malloc; mi_heap_malloc of an
 * mi_heap_new heap (thread-local: only its creating thread may allocate from it).
 * Prints "name ns_per_pair" lines. usage: heapapi_{je,mi} ITERS */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#define LOOP(name, ALLOC, FREE)                                                                   \
    do {                                                                                          \
        double start_ = now_ns();                                                                     \
        for (long i = 0; i < iters; i++) {                                                        \
            char *volatile p = ALLOC;                                                             \
            p[0] = (char)i;                                                                       \
            FREE;                                                                                 \
        }                                                                                         \
        printf("%s %.2f\n", name, (now_ns() - start_) / (double)iters);                               \
    } while (0)

#ifdef JE
void *mallocx(size_t, int);
void dallocx(void *, int);
int mallctl(const char *, void *, size_t *, void *, size_t);
#define ARENA(a) ((((int)(a)) + 1) << 20)
#define TCACHE(t) ((int)(((t) + 2) << 8))
#define TCACHE_NONE TCACHE(-1)
#endif
#ifdef MI
typedef struct mi_heap_s mi_heap_t;
mi_heap_t *mi_heap_new(void);
void *mi_heap_malloc(mi_heap_t *, size_t);
void mi_free(void *);
#endif

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 5000000;
    for (int round = 0; round < 3; round++) {
        LOOP("malloc", malloc(64), free(p));
#ifdef JE
        unsigned arena, tc;
        size_t sz = sizeof arena;
        if (round == 0 && mallctl("arenas.create", &arena, &sz, NULL, 0)) return 3;
        static unsigned a0, t0;
        if (round == 0) {
            a0 = arena;
            sz = sizeof tc;
            if (mallctl("tcache.create", &tc, &sz, NULL, 0)) return 3;
            t0 = tc;
        }
        LOOP("jemalloc_arena_no_tcache", mallocx(64, ARENA(a0) | TCACHE_NONE), free(p));
        LOOP("jemalloc_arena_no_tcache_dallocx", mallocx(64, ARENA(a0) | TCACHE_NONE),
             dallocx(p, TCACHE_NONE));
        LOOP("jemalloc_arena_own_tcache", mallocx(64, ARENA(a0) | TCACHE(t0)),
             dallocx(p, TCACHE(t0)));
#endif
#ifdef MI
        static mi_heap_t *h;
        if (round == 0) h = mi_heap_new();
        LOOP("mimalloc_heap", mi_heap_malloc(h, 64), mi_free(p));
#endif
    }
    return 0;
}
