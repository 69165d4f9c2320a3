/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The request path: a kept block taken for a request (hl_take: the thread's front, the shared
 * cache, another thread's front; which block serves is the core's hpc_serves), or the next
 * allocator's new block entered in the live set (hl_track). The entry points are in hooks.c. */

/* A large block of the next allocator's is the program's (no lock held): entered in the live
 * set if in scope, with its allocation's context where the table asks one (a: the request,
 * predict.c hl_ask_ctx; NULL: none); 1 if it was. */
static inline __attribute__((always_inline)) int hl_live_track(void *p, size_t req,
                                                               struct hl_ask *a) {
    if (p == NULL) return 0;
    hl_hist.last_p = (uintptr_t)p;
    /* a block out of scope (glibc's heap) is never kept: its free goes straight to glibc
     * (hl_free_large), so it is not tracked either. Scope only widens (hl_trimmed), so it was
     * out of scope when made if it is at its free. */
    if (!hl_in_scope(p)) return 0;
    size_t usable = hc_real.malloc_usable_size(p);
    uint64_t ctx = hl_ask_ctx(a); /* before any lock (predict.c) */
    struct hl_shard *s = hl_shard_of(p);
    hl_live_lock(s);
    if (!hl_live_add(s, p, req, usable, ctx)) hl_active_min = SIZE_MAX; /* no memory for the set */
    hl_live_unlock(s);
    /* a mapped block is new memory; a heap block is not, and giving kept blocks back to glibc's
     * heap then frees no page (../../README.md, History) */
    if (hl_set.peak >= 0 && hl_mapped(p)) hl_bound();
    return 1;
}

/* A large block the next allocator made for a request of req bytes: tracked, and learned
 * (guided) if in scope. */
static void hl_track(void *p, size_t req, struct hl_ask *a) {
    if (hl_live_track(p, req, a)) hl_learn_request(req);
}

/* A kept block for n bytes at an address multiple of `align` (power of two, or 0), taken out of
 * the kept blocks and made live; NULL if none fits. The thread's front first (its most recent
 * kept block), then the shared cache, then the other threads' fronts. */
static void *hl_take(size_t n, size_t align, struct hl_ask *a) {
    if (n < hl_active_min) return NULL;
    uintptr_t mask = align > 1 ? (uintptr_t)(align - 1) : 0;
    struct hpc_out out = {0};
    void *p = NULL;
    /* the clock only where something is kept (decay, advice): a thread whose blocks all come
     * from glibc's heap reads none */
    int timed = !(hl_set.policy == HL_LARGEST && hl_set.madv_ns <= 0);
    uint64_t now = 0;
    if (hl_front.p != NULL) {
        if (timed) now = hl_now();
        struct hl_front f = hl_front;
        if (hpc_expired(&hl_core, f.since, now)) {
            hl_front_clear();
            hl_front_give_back(&f, 1);
        } else if (hpc_serves((uintptr_t)f.p, f.usable, n, mask)) {
            hl_front_clear();
            if (hl_front_claim(&f, n, hl_ask_ctx(a))) {
                hl_advise_idle(now);
                hl_learn_request(n);
                hl_hist.last_p = (uintptr_t)f.p;
                return f.p;
            }
        }
    }
    /* an empty shared cache is not locked for: where the rules leave most blocks to glibc's
     * heap (a policy that declines, scope), threads missing here would meet on hl_lock at
     * every call (../../README.md, Measured). A block kept meanwhile is missed once. */
    if (HPC_LOAD(hl_cache.nkept) == 0) goto shared_done;
    if (timed && now == 0) now = hl_now();
    uint64_t ctx = hl_ask_ctx(a); /* before any lock: a block may serve */
    hl_lock_take();
    struct hpc_block got;
    if (hpc_take_shared(&hl_core, &hl_cache, n, mask, now, &got, &out)) {
        p = (void *)got.p;
        /* live before hl_lock goes: a second free of p meanwhile looks in the cache, then here */
        struct hl_shard *s = hl_shard_of(p);
        hl_nested_lock(s);
        if (!hl_live_add(s, p, n, got.usable, ctx)) hl_active_min = SIZE_MAX;
        hl_nested_unlock(s);
    }
    hl_lock_give();
shared_done:
    if (p == NULL && hl_sharded) p = hl_steal(n, mask, a);
    if (p == NULL) {
        HL_COUNT(misses);
        /* not locked for when nothing is remembered: a program whose large blocks all come
         * from glibc's heap never gives the proof, and threads missing there would meet on
         * hl_lock at every call (../../README.md, Measured) */
        if (hpc_ghosts_asked(&hl_core, &hl_cache)) hl_ghost_hit(n, mask);
    }
    hl_release(&out);
    if (now) hl_advise_idle(now);
    if (p) {
        hl_hist.last_p = (uintptr_t)p;
        hl_learn_request(n);
    }
    return p;
}

/* `ret`: where the program's call returns (the hook's; the allocation's context, predict.c) */
static void *hl_malloc_large(size_t n, const void *ret) {
    struct hl_ask a = {ret, 0, 0};
    hl_learn_alloc(n);
    void *p = hl_take(n, 0, &a);
    if (p) return p;
    p = hc_real.malloc(n);
    hl_track(p, n, &a);
    return p;
}

static inline int hl_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* The aligned forms: a kept block serves one only if its address has the alignment; invalid
 * arguments go to the next allocator, which reports them as it does. */
static void *hl_aligned_large(size_t align, size_t n, void *(*f)(size_t, size_t),
                              const void *ret) {
    struct hl_ask a = {ret, 0, 0};
    hl_learn_alloc(n);
    void *p = hl_take(n, align, &a);
    if (p) return p;
    p = f(align, n);
    hl_track(p, n, &a);
    return p;
}
