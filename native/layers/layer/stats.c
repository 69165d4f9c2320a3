/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Statistics: counters kept cheaply on the hot path and printed at exit on request (stats=1 or
 * stats=PATH; the line is written by hl_fini, init.c). Two kinds: those changed under hl_lock
 * (hl_cache.stats, hl_stats), and the ones counted outside it, in per-thread stripes (below). */

/* The counters changed under hl_lock: the policy core's (hl_cache.stats: hits and keeps in the
 * shared cache, blocks given back, the bound's, the proof's and the regret's), and the layer's
 * own below. */
static struct {
    uint64_t bytes_advised, double_frees, table_refused;
} hl_stats;

/* The counters taken outside hl_lock (a free the policy declines takes only its shard's lock, or
 * none for glibc's heap; a miss is known after the other threads' fronts are asked), one stripe of
 * them per thread: with one counter line for all, threads passing large heap blocks meet on it at
 * every call. A thread owns its stripe (claimed at its first count from a mask, given back by its
 * key's destructor, hl_thread_exit), so it counts with a plain load and store, not an atomic add at
 * each large call passed on (its cost: ../../README.md, Measured). A thread finding none free
 * (HL_STRIPES live threads) or without a destructor shares the last stripe, counting atomically.
 * Summed at exit; a stripe given back keeps its counts, and its next owner adds to them (the
 * mask's release and acquire order the two). */
#define HL_STRIPES 64 /* owned; hl_stripes[HL_STRIPES] is the shared one */
struct hl_stripe {
    /* calls passed through, one counter each (the stats' `passed` is their sum): misses, and
     * frees left to glibc's heap, of outgrown blocks, or declined otherwise (policy, cap, a
     * double free, a block the layer did not hand out) */
    uint64_t misses, heap, outgrown, declined, unproven;
    uint64_t bounded;
} __attribute__((aligned(64)));
static struct hl_stripe hl_stripes[HL_STRIPES + 1];
static uint64_t hl_stripes_owned; /* bit i: stripe i belongs to a live thread */
static __thread struct hl_stripe *hl_my_stripe;
static __thread int hl_my_stripe_slot = -1;
static pthread_key_t hl_key; /* its destructor: hl_thread_exit */
static int hl_key_ok;

static uint64_t hl_stripe_sharers; /* threads that count on the shared stripe (stats) */

static __attribute__((noinline)) struct hl_stripe *hl_stripe_claim(void) {
    hl_my_stripe = &hl_stripes[HL_STRIPES]; /* first: a count made meanwhile (re-entry) shares */
    /* own one only where the destructor will give it back: a thread's key value is NULL until
     * set (pthread_setspecific may calloc: a small block, never counted) */
    int i = -1;
    if (hl_key_ok && (pthread_getspecific(hl_key) != NULL ||
                      pthread_setspecific(hl_key, (void *)&hl_my_stripe) == 0))
        i = hl_slot_claim(&hl_stripes_owned);
    if (i < 0) {
        __atomic_fetch_add(&hl_stripe_sharers, 1, __ATOMIC_RELAXED);
        return hl_my_stripe;
    }
    hl_my_stripe_slot = i;
    return hl_my_stripe = &hl_stripes[i];
}

static void hl_stripe_release(void) { /* at the thread's exit: later counts share */
    int i = hl_my_stripe_slot;
    hl_my_stripe = &hl_stripes[HL_STRIPES];
    hl_my_stripe_slot = -1;
    if (i >= 0) __atomic_fetch_and(&hl_stripes_owned, ~((uint64_t)1 << i), __ATOMIC_RELEASE);
}

static inline void hl_count(size_t offset) {
    struct hl_stripe *s = hl_my_stripe;
    if (HL_UNLIKELY(s == NULL)) s = hl_stripe_claim();
    uint64_t *f = (uint64_t *)((char *)s + offset);
    if (HL_LIKELY(s != &hl_stripes[HL_STRIPES]))
        __atomic_store_n(f, __atomic_load_n(f, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(f, 1, __ATOMIC_RELAXED);
}
#define HL_COUNT(field) hl_count(offsetof(struct hl_stripe, field))
static uint64_t hl_striped(size_t offset) { /* a field's sum over the stripes */
    uint64_t n = 0;
    for (int i = 0; i <= HL_STRIPES; i++)
        n += __atomic_load_n((uint64_t *)((char *)&hl_stripes[i] + offset), __ATOMIC_RELAXED);
    return n;
}
#define HL_STRIPED(field) hl_striped(offsetof(struct hl_stripe, field))
