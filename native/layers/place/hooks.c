/* Part of layers/place.c (one translation unit; never compiled alone).
 * The exported entry points of the malloc family. malloc and calloc first ask the short path
 * (decide.c hp_short: a load, a decrement, a jump to the real function), and otherwise jump to
 * their whole path; free jumps through hp_free_now (the real free, or once the counter learns a
 * function that asks the block's sample slot first). The whole path:
 * the real function not yet known (start-up: the bootstrap pool, ../real.h), the layer not on
 * (passed through), else the decision (decide.c).
 * realloc: a long site's realloc asks rallocx for the long arena (jemalloc grows in place where it
 * can, else moves the block there), otherwise the real realloc. The aligned family: a valid
 * alignment goes to mallocx with MALLOCX_ALIGN, an invalid one to the real function, for its own
 * error. The site of each call: HP_SITE (site_here.c). */

/* malloc's whole path (hp_short: start-up, a long site, a sample due, a context); HP_UNDO: the
 * countdown put back first */
static inline __attribute__((always_inline)) void *hp_malloc_whole(size_t n) {
    void *(*f)(size_t) = HC_REAL(malloc);
    if (HP_UNLIKELY(!f)) return hp_pool_alloc(n, 16);
    if (HP_UNLIKELY(!__atomic_load_n(&hp_plain, __ATOMIC_ACQUIRE)) && HP_UNLIKELY(!hp_on()))
        return f(n);
    return hp_alloc(n, 0, HP_SITE);
}
static __attribute__((noinline)) void *hp_malloc_slow(size_t n) { return hp_malloc_whole(n); }
static __attribute__((noinline)) void *hp_malloc_undo(size_t n) {
    hp_tls_countdown++;
    return hp_malloc_whole(n);
}

static __attribute__((noinline)) HP_SHORT_FN void *hp_malloc_gated(size_t n) {
    int how = hp_gated((uintptr_t)__builtin_return_address(0));
    if (HP_LIKELY(how == HP_SHORT)) return hc_real.malloc(n);
    if (how == HP_UNDO) return hp_malloc_undo(n);
    return hp_malloc_slow(n);
}

HP_EXPORT HP_SHORT_FN void *malloc(size_t n) {
    int how = hp_short();
    if (HP_LIKELY(how == HP_SHORT)) return hc_real.malloc(n);
    if (how == HP_GATED) return hp_malloc_gated(n);
    if (how == HP_UNDO) return hp_malloc_undo(n);
    return hp_malloc_slow(n);
}

/* free past a sampled block's verdict, or at start-up (out of line: free itself then only
 * jumps) */
static __attribute__((noinline)) void hp_free_rest(void *p) {
    if (HP_UNLIKELY(hc_in_pool(p))) return; /* the start-up pool's blocks are never reused */
    void (*f)(void *) = HC_REAL(free);
    if (HP_UNLIKELY(!f)) return; /* start-up: no real free yet, and p is not the pool's: leak */
    if (__atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE)) hp_free_sampled(p);
    f(p);
}

/* free's body while the real free is not known or the pool gave blocks (hp_free_now) */
static __attribute__((noinline)) void hp_free_whole(void *p) {
    void (*f)(void *) = __atomic_load_n(&hc_real.free, __ATOMIC_ACQUIRE);
    if (HP_LIKELY(f != NULL) && HP_LIKELY(!hc_in_pool(p)) &&
        !(__atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE) && hp_is_sampled(p))) {
        f(p);
        return;
    }
    hp_free_rest(p);
}

/* free's body once the counter learns (watch.c): a block not sampled (its sample slot does not
 * hold it) goes to the real free by a jump */
static void hp_free_watch(void *p) {
    if (HP_UNLIKELY(hp_is_sampled(p))) {
        hp_free_rest(p);
        return;
    }
    HP_JUMP(hc_real.free)(p);
}

/* One jump: to the real free while the counter waits, else to hp_free_watch (or at start-up
 * hp_free_whole): init.c hp_free_direct, watch.c. */
HP_EXPORT void free(void *p) { HP_JUMP(hp_free_now)(p); }

static inline __attribute__((always_inline)) void *hp_calloc_whole(size_t total, size_t m,
                                                                    size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(calloc);
    if (HP_UNLIKELY(!f)) return hp_pool_alloc(total, 16);
    if (HP_UNLIKELY(!hp_on())) return f(m, n);
    return hp_alloc(total, 1, HP_SITE);
}
static __attribute__((noinline)) void *hp_calloc_slow(size_t total, size_t m, size_t n) {
    return hp_calloc_whole(total, m, n);
}
static __attribute__((noinline)) void *hp_calloc_undo(size_t total, size_t m, size_t n) {
    hp_tls_countdown++;
    return hp_calloc_whole(total, m, n);
}

static __attribute__((noinline)) HP_SHORT_FN void *hp_calloc_gated(size_t total, size_t m,
                                                                    size_t n) {
    int how = hp_gated((uintptr_t)__builtin_return_address(0));
    if (HP_LIKELY(how == HP_SHORT)) return hc_real.calloc(m, n);
    if (how == HP_UNDO) return hp_calloc_undo(total, m, n);
    return hp_calloc_slow(total, m, n);
}

HP_EXPORT HP_SHORT_FN void *calloc(size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    int how = hp_short();
    if (HP_LIKELY(how == HP_SHORT)) return hc_real.calloc(m, n);
    if (how == HP_GATED) return hp_calloc_gated(total, m, n);
    if (how == HP_UNDO) return hp_calloc_undo(total, m, n);
    return hp_calloc_slow(total, m, n);
}

HP_EXPORT void *realloc(void *old, size_t n) {
    uintptr_t site = HP_SITE;
    if (old == NULL) {
        void *(*f)(size_t) = HC_REAL(malloc);
        if (HP_UNLIKELY(!f)) return hp_pool_alloc(n, 16);
        if (HP_UNLIKELY(!hp_on())) return f(n);
        return hp_alloc(n, 0, site);
    }
    if (HP_UNLIKELY(hc_in_pool(old))) {
        void *q = malloc(n ? n : 1);
        if (q) {
            size_t o = hc_pool_size(old);
            memcpy(q, old, o < n ? o : n);
        }
        return q;
    }
    void *(*real_realloc)(void *, size_t) = HC_REAL(realloc);
    if (HP_UNLIKELY(!real_realloc)) {
        errno = ENOMEM; /* start-up, a block not the pool's: a failed realloc keeps it */
        return NULL;
    }
    if (HP_UNLIKELY(!hp_on()) || n == 0) {
        if (n == 0 && hp_watching) hp_free_sampled(old);
        return real_realloc(old, n);
    }
    /* the old block's sample (if any) ends here: its life as this block is over */
    if (hp_watching) hp_free_sampled(old);
    void *q;
    int lng = hp_long(n, site);
    if (lng) {
        HP_COUNT(hp_stripe(), long_allocs);
        q = hp_rallocx(old, n, hp_flags); /* in place where it can, else moved to the arena */
        if (q == NULL) errno = ENOMEM;
    } else {
        q = real_realloc(old, n);
    }
    if (hp_sampling()) hp_sample(q, site, lng);
    return q;
}

HP_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

HP_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    int (*f)(void **, size_t, size_t) = HC_REAL(posix_memalign);
    if (HP_UNLIKELY(!f)) {
        if (!hp_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
        void *p = hp_pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (align % sizeof(void *) != 0) return f(out, align, n);
    int handled, saved = errno;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    if (!handled) return f(out, align, n);
    if (p == NULL) return errno = saved, ENOMEM;
    *out = p;
    return 0;
}

HP_EXPORT void *aligned_alloc(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(aligned_alloc);
    if (HP_UNLIKELY(!f)) return hp_pow2(align) ? hp_pool_alloc(n, align) : NULL;
    int handled;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    return handled ? p : f(align, n);
}

HP_EXPORT void *memalign(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (HP_UNLIKELY(!f)) return hp_pow2(align) ? hp_pool_alloc(n, align) : NULL;
    int handled;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    return handled ? p : f(align, n);
}

HP_EXPORT void *valloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(valloc);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (HP_UNLIKELY(!f)) return hp_pool_alloc(n, page);
    int handled;
    void *p = hp_aligned(page, n, HP_SITE, &handled);
    return handled ? p : f(n);
}

/* obsolete: valloc of n rounded up to whole pages (one page for 0), as glibc's. Never the next
 * allocator's own pvalloc: jemalloc 5.3 exports none, so dlsym finds glibc's, whose block
 * jemalloc's free then takes for its own (tests/native/programs/allforms.c crashes under jemalloc
 * alone); memalign is in both. */
HP_EXPORT void *pvalloc(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = n == 0 ? page : (n + page - 1) & ~(page - 1);
    if (rounded < n) {
        errno = ENOMEM;
        return NULL;
    }
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (HP_UNLIKELY(!f)) return hp_pool_alloc(rounded, page);
    int handled;
    void *p = hp_aligned(page, rounded, HP_SITE, &handled);
    return handled ? p : f(page, rounded);
}

HP_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (hc_in_pool(p)) return hc_pool_size(p);
    size_t (*f)(void *) = HC_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}
