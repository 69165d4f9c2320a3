/* Part of layers/place.c (one translation unit; never compiled alone).
 * Sampling (mode=predict): 1 in `sample` allocations of each thread is recorded in a
 * direct-mapped table of HP_NSAMPLES slots, ptr -> (site entry, the process's allocation clock);
 * the clock advances by `sample` at each sampled allocation, so it counts the process's
 * allocations to within a sample. A sampled block freed before `horizon` later allocations counts
 * short for its site; one still live past the horizon counts long, at its free, when a later
 * sample claims its slot, or when the sweep finds it. */

/* A slot: hp_sample_ptr[i], the sampled block (HP_EMPTY: a free slot), and hp_sample_val[i],
 * HP_PLACED_LONG | site entry << 48 | the clock at its allocation. Two arrays, so that a free
 * asks its slot by one scaled load (hooks.c); a free slot holds 1, no block's address, so that
 * free(NULL) matches none. */
#define HP_PLACED_LONG (UINT64_C(1) << 63) /* the sampled block went to the long arena */
#define HP_EMPTY ((uintptr_t)1)
static uintptr_t hp_sample_ptr[HP_NSAMPLES] __attribute__((aligned(64))) = {
    [0 ... HP_NSAMPLES - 1] = HP_EMPTY};
static uint64_t hp_sample_val[HP_NSAMPLES] __attribute__((aligned(64)));
static uint64_t hp_clock __attribute__((aligned(64)));
/* The thread's allocations left until its next sample, less 2 (decide.c: hp_sampling counts it
 * down, hp_unsampled and the hooks' short path take one off while it stays >= 0): so that the
 * short path asks it by one decrement and its sign. -2 at a thread's start: its first allocation
 * is sampled. */
#define HP_LEFT(n) ((n) - 2) /* the stored value for n allocations left */
static __thread int hp_tls_countdown __attribute__((tls_model("initial-exec"))) = HP_LEFT(0);

static inline unsigned hp_sample_index(uintptr_t p) {
    return (unsigned)((p * UINT64_C(0x9E3779B97F4A7C15)) >> 52) & (HP_NSAMPLES - 1);
}

/* A sampled block's verdict (`v` its slot's value): its site learns it, and it counts as a right
 * or a wrong long placement if it was placed long. */
static void hp_verdict(uint64_t v, int outlived) {
    if (v & HP_PLACED_LONG)
        __atomic_fetch_add(outlived ? &hp_long_old : &hp_long_young, 1, __ATOMIC_RELAXED);
    hp_learn((unsigned)((v >> 48) & (HP_NSITES - 1)), outlived);
}

static void hp_sweep(uint64_t now);

/* The process's resident bytes (/proc/self/statm's second field, in pages); 0 where it cannot
 * be read. A stack buffer and read(2): no allocation. errno kept. */
static __attribute__((noinline)) uint64_t hp_resident_bytes(void) {
    int saved = errno;
    uint64_t bytes = 0;
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[128];
        ssize_t got = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (got > 0) {
            buf[got] = 0;
            char *p = strchr(buf, ' '); /* size, then resident, in pages */
            bytes = (p ? strtoull(p + 1, NULL, 10) : 0) * (uint64_t)sysconf(_SC_PAGESIZE);
        }
    }
    errno = saved;
    return bytes;
}

/* 1 if this thread reads the resident set now: at most once per 65536 allocations of the clock
 * (`now`) since the last read recorded in *at (-1: never), one thread at a time. The floor
 * (decide.c hp_reached_floor) and learn_mb (hp_wait_tick) each keep their own *at. */
static inline int hp_rss_read_due(uint64_t *at, uint64_t now) {
    uint64_t then = __atomic_load_n(at, __ATOMIC_RELAXED);
    if (then != (uint64_t)-1 && now - then < 65536) return 0;
    return __atomic_compare_exchange_n(at, &then, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* While the counter waits to learn (hp_watching 0), a thread's countdown ticks every
 * HP_WAIT_TICK of its allocations instead of taking a sample: the clock advances by as many,
 * and, at most once per 65536 allocations of the clock (one thread at a time), the resident set
 * is read; at learn_mb the counter begins (watch.c). What waiting saves a program that never
 * gets there (hunspell, studies/layer_zero_hit): every sample's work, and the sample slot's
 * compare on every free and delete, which then jump to the next function at once. */
#define HP_WAIT_TICK 4096
static uint64_t hp_wait_read_at = (uint64_t)-1; /* the clock at the last read; -1: never */

static __attribute__((noinline)) void hp_wait_tick(void) {
    hp_tls_countdown = HP_LEFT(HP_WAIT_TICK);
    uint64_t now = __atomic_add_fetch(&hp_clock, HP_WAIT_TICK, __ATOMIC_RELAXED);
    if (hp_rss_read_due(&hp_wait_read_at, now) && hp_resident_bytes() >= hp_set.learn_rss)
        hp_watch_begin();
}

/* A sampled allocation: claim the site's entry if another site holds it, record p (and whether
 * it went to the long arena: placed_long). */
static __attribute__((noinline)) void hp_sample(void *p, uintptr_t site, int placed_long) {
    if (!hp_learning) {
        hp_tls_countdown = INT32_MAX; /* mode=sites, size: nothing to learn */
        return;
    }
    if (HP_UNLIKELY(!__atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE))) {
        hp_wait_tick();
        return;
    }
    hp_tls_countdown = HP_LEFT(hp_set.sample);
    if (p == NULL) return;
    struct hp_stripe *s = hp_stripe();
    HP_COUNT(s, sampled);
    unsigned e = hp_site_index(site);
    uintptr_t w = __atomic_load_n(&hp_site_word[e], __ATOMIC_RELAXED);
    if ((w >> 1) != site) { /* new here: this site takes the entry, counts afresh */
        __atomic_store_n(&hp_sites[e].nshort, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_sites[e].nlong, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_sites[e].falls, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_site_word[e], site << 1, __ATOMIC_RELAXED);
    }
    uint64_t now = __atomic_add_fetch(&hp_clock, (uint64_t)hp_set.sample, __ATOMIC_RELAXED);
    hp_sweep(now);
    unsigned i = hp_sample_index((uintptr_t)p);
    uintptr_t old = __atomic_load_n(&hp_sample_ptr[i], __ATOMIC_ACQUIRE);
    if (old != HP_EMPTY) {
        uint64_t v = __atomic_load_n(&hp_sample_val[i], __ATOMIC_RELAXED);
        if (((now - v) & HP_CLOCK_MASK) < hp_set.horizon) {
            HP_COUNT(s, dropped); /* the slot's block is young still: keep watching it */
            return;
        }
        if (!__atomic_compare_exchange_n(&hp_sample_ptr[i], &old, (uintptr_t)p, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return;
        __atomic_fetch_add(&hp_evicted_long, 1, __ATOMIC_RELAXED);
        hp_verdict(v, 1); /* outlived the horizon: its site's long count */
    } else if (!__atomic_compare_exchange_n(&hp_sample_ptr[i], &old, (uintptr_t)p, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        return;
    }
    uint64_t mark = placed_long ? HP_PLACED_LONG : 0;
    __atomic_store_n(&hp_sample_val[i], mark | ((uint64_t)e << 48) | (now & HP_CLOCK_MASK),
                     __ATOMIC_RELEASE);
}

/* At each sample, HP_SWEEP more slots in turn: a block live past the horizon gets its verdict
 * (long) and frees its slot within HP_NSAMPLES / HP_SWEEP samples of passing it, rather than
 * when a new sample happens to land on its slot (on average another horizon later). */
#define HP_SWEEP 4u
static unsigned hp_sweep_cursor;

static void hp_sweep(uint64_t now) {
    unsigned c = __atomic_fetch_add(&hp_sweep_cursor, HP_SWEEP, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < HP_SWEEP; i++) {
        unsigned j = (c + i) & (HP_NSAMPLES - 1);
        uintptr_t k = __atomic_load_n(&hp_sample_ptr[j], __ATOMIC_ACQUIRE);
        if (k == HP_EMPTY) continue;
        uint64_t v = __atomic_load_n(&hp_sample_val[j], __ATOMIC_ACQUIRE);
        if (((now - v) & HP_CLOCK_MASK) < hp_set.horizon) continue;
        if (!__atomic_compare_exchange_n(&hp_sample_ptr[j], &k, HP_EMPTY, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        __atomic_fetch_add(&hp_evicted_long, 1, __ATOMIC_RELAXED);
        hp_verdict(v, 1);
    }
}

/* At a free: 1 if p is a sampled block (its slot holds p), the caller then calls
 * hp_free_sampled (out of line). One scaled load and a compare: the table is empty outside
 * mode=predict, so no flag is asked first, and no slot holds NULL. */
static inline __attribute__((always_inline)) int hp_is_sampled(void *p) {
    /* a plain load (as decide.c hp_short's), so that the compare reads memory itself */
    return HP_UNLIKELY(hp_sample_ptr[hp_sample_index((uintptr_t)p)] == (uintptr_t)p);
}

/* p's verdict if p is a sampled block (the hooks ask hp_is_sampled first, inline, and call this
 * out of line: a free of a block not sampled needs no stack frame) */
static __attribute__((noinline)) void hp_free_sampled(void *p) {
    unsigned i = hp_sample_index((uintptr_t)p);
    uintptr_t k = __atomic_load_n(&hp_sample_ptr[i], __ATOMIC_RELAXED);
    if (HP_LIKELY(k != (uintptr_t)p) || k == HP_EMPTY) return;
    uint64_t v = __atomic_load_n(&hp_sample_val[i], __ATOMIC_ACQUIRE);
    if (!__atomic_compare_exchange_n(&hp_sample_ptr[i], &k, HP_EMPTY, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    uint64_t now = __atomic_load_n(&hp_clock, __ATOMIC_RELAXED);
    int outlived = ((now - v) & HP_CLOCK_MASK) >= hp_set.horizon;
    __atomic_fetch_add(outlived ? &hp_freed_long : &hp_freed_short, 1, __ATOMIC_RELAXED);
    hp_verdict(v, outlived);
}
