/* Part of layers/place.c (one translation unit; never compiled alone).
 * The counters of the stats line (written at exit, init.c): a stripe per thread (64; threads
 * beyond share one, approximately), and the process-wide ones the sampling keeps. */

struct hp_stripe {
    uint64_t long_allocs, sampled, dropped;
    uint64_t held_small; /* called long by the counter, placed short: the process under min_mb */
    uint64_t table_answers, counter_answers; /* with a table: who answered each allocation */
} __attribute__((aligned(64)));
static struct hp_stripe hp_stripes[65];
static unsigned hp_next_stripe;
static __thread struct hp_stripe *hp_tls_stripe __attribute__((tls_model("initial-exec")));
static uint64_t hp_evicted_long, hp_freed_short, hp_freed_long;
/* sampled blocks the layer placed long that died within the horizon (a wrong placement) or
 * outlived it (a right one): the stats line's long_young and long_old */
static uint64_t hp_long_young, hp_long_old;

static inline struct hp_stripe *hp_stripe(void) {
    struct hp_stripe *s = hp_tls_stripe;
    if (HP_UNLIKELY(s == NULL)) {
        unsigned i = __atomic_fetch_add(&hp_next_stripe, 1, __ATOMIC_RELAXED);
        s = hp_tls_stripe = &hp_stripes[i < 64 ? i : 64];
    }
    return s;
}
#define HP_COUNT(s, field) __atomic_store_n(&(s)->field, (s)->field + 1, __ATOMIC_RELAXED)
