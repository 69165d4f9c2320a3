/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The shared cache: the kept blocks outside the threads' fronts, under hl_lock (the policy
 * core's struct), and the layer's own work on them: the clock, the real free of the blocks a
 * decision gave back (hl_release, outside every lock), a double free's block taken out
 * (hl_unkeep), a block's pages advised. Which block to keep, to serve or to give back is the
 * core's decision (policy.c says where each is called). */

/* The shared cache is the policy core's (../../policy/core.h: the kept blocks, the remembered
 * blocks, the regrets, the counters changed under the lock), under hl_lock; the layer's
 * settings as the core reads them (hl_set's deciding fields, filled once at start). */
static struct hpc_cache hl_cache;
static struct hpc_settings hl_core;

/* The layer's clock: a kept block's `since` (decay, madv). The coarse clock (no syscall, a few
 * ms of resolution): the rules' thresholds are tens of ms and more. */
static inline uint64_t hl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Blocks taken out of the cache under hl_lock, freed once the lock is given back
 * (hl_release): the real allocator is never called under a lock of the layer. */
static void hl_release(struct hpc_out *out) {
    void (*f)(void *) = hc_real.free;
    for (int i = 0; i < out->n; i++) f((void *)out->p[i]);
}

/* A kept block's pages may go back to the kernel under memory pressure (MADV_FREE). */
static void hl_madvise(void *p, size_t usable) {
#ifdef MADV_FREE
    /* whole pages inside the block only: the first page holds the next allocator's header */
    uintptr_t a = ((uintptr_t)p + hl_page - 1) & ~(uintptr_t)(hl_page - 1);
    uintptr_t b = ((uintptr_t)p + usable) & ~(uintptr_t)(hl_page - 1);
    if (b > a && madvise((void *)a, b - a, MADV_FREE) == 0)
        __atomic_fetch_add(&hl_stats.bytes_advised, b - a, __ATOMIC_RELAXED);
#else
    (void)p;
    (void)usable;
#endif
}

/* Take p out of the kept blocks (under hl_lock); 1 if it was kept. */
static int hl_unkeep(void *p) {
    for (int i = 0; i < hl_cache.nkept; i++)
        if (hl_cache.kept[i].p == (uintptr_t)p) {
            hpc_remove(&hl_cache, i);
            return 1;
        }
    return 0;
}
