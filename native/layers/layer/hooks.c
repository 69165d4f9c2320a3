/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The exported entry points of the malloc family (mallopt is in follow.c). Each: the real
 * function looked up (../../real.h; the bootstrap pool while dlsym runs), a request below
 * hl_active_min straight to it (one compare), else the request path (alloc.c) or the free path
 * (free.c). */

/* malloc's start-up: the real malloc looked up, or the pool while dlsym runs (out of line, so
 * that malloc itself needs no stack frame: a pass-through malloc is a compare and a jump) */
static __attribute__((noinline, cold)) void *hl_malloc_start(size_t n) {
    void *(*f)(size_t) = HC_REAL(malloc);
    if (!f) return hc_pool_alloc(n, 16);
    if (n < hl_active_min) return f(n);
    return hl_malloc_large(n, __builtin_return_address(0));
}

HL_EXPORT void *malloc(size_t n) {
    void *(*f)(size_t) = __atomic_load_n(&hc_real.malloc, __ATOMIC_ACQUIRE);
    if (HL_UNLIKELY(!f)) return hl_malloc_start(n);
    if (HL_LIKELY(n < hl_active_min)) return f(n);
    return hl_malloc_large(n, __builtin_return_address(0));
}

/* free's full path, out of line (free.c hl_free_from) */
static __attribute__((noinline)) void hl_free_full(void *p, const void *caller) {
    hl_free_from(p, caller);
}

/* Most frees are of small blocks: over glibc, one read of the chunk word and one compare
 * (options.c hl_free_small) send them to the real free, as hl_free_from would; the rest (large
 * blocks, before the start, over another allocator) take the full path, and so do the start-up
 * pool's blocks, whose word has the top bit set (../../bootstrap_pool.h HC_POOL_MARK). */
HL_EXPORT void free(void *p) {
    if (HL_LIKELY(p != NULL) &&
        HL_LIKELY(hl_chunk_word(p) < __atomic_load_n(&hl_free_small, __ATOMIC_ACQUIRE))) {
        hc_real.free(p); /* published before hl_free_small (init.c hl_set_free_small) */
        return;
    }
    hl_free_full(p, __builtin_return_address(0));
}

/* The large paths of calloc, posix_memalign, valloc and pvalloc, out of line: their request's
 * context (struct hl_ask, predict.c) then costs their pass-through path nothing. `ret`: where
 * the program's call returns. */
static __attribute__((noinline)) void *hl_calloc_large(size_t m, size_t n, size_t total,
                                                       void *(*f)(size_t, size_t),
                                                       const void *ret) {
    struct hl_ask a = {ret, 0, 0};
    hl_learn_alloc(total);
    void *p = hl_take(total, 0, &a);
    if (p) return memset(p, 0, total);
    p = f(m, n);
    hl_track(p, total, &a);
    return p;
}

static __attribute__((noinline)) int hl_memalign_large(void **out, size_t align, size_t n,
                                                       int (*f)(void **, size_t, size_t),
                                                       const void *ret) {
    struct hl_ask a = {ret, 0, 0};
    hl_learn_alloc(n);
    void *p = hl_take(n, align, &a);
    if (p) {
        *out = p;
        return 0;
    }
    int rc = f(out, align, n);
    if (rc == 0) hl_track(*out, n, &a);
    return rc;
}

/* valloc (n == req) and pvalloc (req: n rounded up to a page) */
static __attribute__((noinline)) void *hl_valloc_large(size_t n, size_t req, void *(*f)(size_t),
                                                       const void *ret) {
    struct hl_ask a = {ret, 0, 0};
    hl_learn_alloc(req);
    void *p = hl_take(req, hl_page, &a);
    if (p) return p;
    p = f(n);
    hl_track(p, req, &a);
    return p;
}

HL_EXPORT void *calloc(size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    void *(*f)(size_t, size_t) = HC_REAL(calloc);
    if (HL_UNLIKELY(!f)) return hc_pool_alloc(total, 16);
    if (HL_LIKELY(total < hl_active_min)) return f(m, n);
    return hl_calloc_large(m, n, total, f, __builtin_return_address(0));
}

HL_EXPORT void *realloc(void *old, size_t n) {
    if (old == NULL) return malloc(n);
    if (HL_UNLIKELY(hc_in_pool(old))) {
        void *q = malloc(n);
        if (q) {
            size_t o = hc_pool_size(old);
            memcpy(q, old, o < n ? o : n);
        }
        return q;
    }
    if (n == 0) {
        hl_free_from(old, __builtin_return_address(0));
        return NULL;
    }
    void *(*real_realloc)(void *, size_t) = HC_REAL(realloc);
    if (HL_UNLIKELY(!real_realloc)) {
        /* start-up (dlsym re-entry), and old is not a pool block: it cannot be resized yet; a
         * failed realloc keeps the old block, as C allows */
        errno = ENOMEM;
        return NULL;
    }
    if (hl_active_min == SIZE_MAX) return real_realloc(old, n);
    /* a small block to a small size (over glibc: its chunk word, as free) */
    if (hl_chunk_word(old) < __atomic_load_n(&hl_free_small, __ATOMIC_ACQUIRE) &&
        n < hl_active_min)
        return real_realloc(old, n);
    size_t usable = hc_real.malloc_usable_size(old);
    if (usable < hl_active_min && n < hl_active_min) return real_realloc(old, n);
    /* a large block on either side: a kept block that fits n, old copied and freed (into the
     * cache); otherwise the real realloc (in place, or mremap: no copy) */
    struct hl_ask a = HL_ASK();
    if (n >= hl_active_min) {
        hl_learn_alloc(n);
        void *q = hl_take(n, 0, &a);
        if (q) {
            memcpy(q, old, usable < n ? usable : n);
            hl_free_from(old, __builtin_return_address(0));
            return q;
        }
    }
    size_t req = 0;
    int kept = 0;
    if (usable >= hl_active_min && hl_in_scope(old)) { /* out of scope: untracked, never kept */
        struct hl_shard *s = hl_shard_of(old);
        hl_live_lock(s);
        struct hl_live_slot *e = hl_live_find(s, old);
        if (e != NULL && e->ticket != 0) kept = 1; /* realloc of a freed block a front holds */
        else if (e != NULL) req = e->req ? e->req : 1;
        if (e != NULL) hl_live_remove(s, e);
        hl_live_unlock(s);
        if (e == NULL) {
            hl_lock_take();
            kept = hl_unkeep(old); /* realloc of a freed block the shared cache holds */
            hl_lock_give();
        }
    }
    if (HL_UNLIKELY(kept)) {
        /* the program freed old and then reallocs it: the free the cache held back reaches
         * the real allocator first, then the realloc, as without the layer (never two owners) */
        hc_real.free(old);
    }
    void *q = real_realloc(old, n);
    if (q == NULL) {
        if (req) hl_live_track(old, req, &a); /* failed: old stays the program's, asked for before */
        return NULL;
    }
    if (n >= hl_active_min) hl_track(q, n, &a);
    return q;
}

HL_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

HL_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    int (*f)(void **, size_t, size_t) = HC_REAL(posix_memalign);
    if (HL_UNLIKELY(!f)) {
        if (!hl_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
        void *p = hc_pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align) || align % sizeof(void *) != 0)
        return f(out, align, n);
    return hl_memalign_large(out, align, n, f, __builtin_return_address(0));
}

HL_EXPORT void *aligned_alloc(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(aligned_alloc);
    if (HL_UNLIKELY(!f)) return hl_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align)) return f(align, n);
    return hl_aligned_large(align, n, f, __builtin_return_address(0));
}

HL_EXPORT void *memalign(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (HL_UNLIKELY(!f)) return hl_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align)) return f(align, n);
    return hl_aligned_large(align, n, f, __builtin_return_address(0));
}

HL_EXPORT void *valloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(valloc);
    if (HL_UNLIKELY(!f)) return hc_pool_alloc(n, hl_page);
    if (HL_LIKELY(n < hl_active_min)) return f(n);
    return hl_valloc_large(n, n, f, __builtin_return_address(0));
}

HL_EXPORT void *pvalloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(pvalloc);
    size_t rounded = (n + hl_page - 1) & ~(hl_page - 1);
    if (HL_UNLIKELY(!f)) return rounded >= n ? hc_pool_alloc(rounded, hl_page) : NULL;
    if (HL_LIKELY(rounded < hl_active_min) || rounded < n) return f(n);
    return hl_valloc_large(n, rounded, f, __builtin_return_address(0));
}

HL_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (HL_UNLIKELY(hc_in_pool(p))) return hc_pool_size(p);
    size_t (*f)(void *) = HC_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}

/* dlclose: an unloaded module's addresses may come to hold other code, whose frames must not be
 * read by its unwind rules nor named by its frame keys (../../context_key.h hc_ctx_forget); only
 * where the table's contexts are asked (a format 4 table: predict.c). */
HL_EXPORT int dlclose(void *handle) {
    static int (*next)(void *);
    int (*f)(void *) = HC_NEXT(next, "dlclose");
    int r = f ? f(handle) : -1;
    if (hl_ctx_set != NULL) hc_ctx_forget();
    return r;
}
