/* Part of layers/place.c (one translation unit; never compiled alone).
 * The decision on the allocation path (hp_long): the prediction (the table, the sites file, size
 * alone, or the online counter), the counter's floor, the long arena made on first need; then
 * the allocation itself, short (the real function) or long (mallocx into the long arena). */

/* Make the long arena (once, by the first thread to ask; jemalloc's arenas.create); 1 once it
 * exists. While another thread makes it, or where jemalloc refused (said once), 0: the request
 * is placed short, as it would be without the layer (so too, for good, in a child forked while
 * another thread was making it). */
static __attribute__((noinline)) int hp_make_arena(void) {
    int expect = HP_ARENA_NONE;
    if (!__atomic_compare_exchange_n(&hp_arena, &expect, HP_ARENA_MAKING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return expect == HP_ARENA_READY;
    size_t large = 0, large_len = sizeof large;
    if (hp_mallctl("arenas.lextent.0.size", &large, &large_len, NULL, 0) == 0 && large)
        __atomic_store_n(&hp_large_min, large, __ATOMIC_RELAXED);
    unsigned arena = 0;
    size_t len = sizeof arena;
    if (hp_mallctl("arenas.create", &arena, &len, NULL, 0) != 0) {
        hp_say("mallctl arenas.create failed; placing every request short");
        __atomic_store_n(&hp_arena, HP_ARENA_FAILED, __ATOMIC_RELEASE);
        return 0;
    }
    __atomic_store_n(&hp_flags, HP_MALLOCX_ARENA(arena) | HP_MALLOCX_TCACHE_NONE,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&hp_arena, HP_ARENA_READY, __ATOMIC_RELEASE);
    return 1;
}

/* 1 once the long arena exists (made now if it was not). */
static inline int hp_arena_ready(void) {
    return HP_LIKELY(__atomic_load_n(&hp_flags, __ATOMIC_ACQUIRE) != 0) || hp_make_arena();
}

/* The counter's floor (min_mb): its verdicts place long only once the process has had min_mb
 * resident. Below it, the long arena's fixed cost (jemalloc's control tables, the arena's
 * metadata, a slab per size class it serves) is a few percent of the program, while all it can
 * save is a share of a heap that small (docs/layer.md, "A small process places nothing long by
 * the counter"). The table and the sites file place from the first call: what they know was
 * learnt elsewhere. hp_big: 1 once the floor was reached (for good); the resident set is read
 * from /proc/self/statm by one thread at a time, at most once per 65536 allocations of the
 * clock. */
static uint64_t hp_rss_read_at = (uint64_t)-1; /* the clock at the last read; -1: never */

static __attribute__((noinline)) int hp_reached_floor(void) {
    if (!hp_rss_read_due(&hp_rss_read_at, __atomic_load_n(&hp_clock, __ATOMIC_RELAXED)))
        return 0; /* read less than 65536 allocations ago, or another thread reads it */
    int big = hp_resident_bytes() >= hp_set.min_rss;
    if (big) __atomic_store_n(&hp_big, 1, __ATOMIC_RELAXED);
    return big;
}

/* This request's prediction: 0 short, HP_BY_COUNTER long by the online counter's verdict,
 * HP_KNOWN long by the table, the sites file or size alone. Three loads on the path of every
 * allocation without a table: the mode flag, the large-size limit and the site's table word
 * (with one: the lifetime table first). */
enum { HP_BY_COUNTER = 1, HP_KNOWN = 2 };
static inline int hp_predicted_long(size_t n, uintptr_t site) {
    if (HP_UNLIKELY(hp_by_size)) return n >= hp_set.big ? HP_KNOWN : 0;
    if (HP_UNLIKELY(n >= __atomic_load_n(&hp_large_min, __ATOMIC_RELAXED)))
        return 0; /* a large block pins no neighbour */
    if (HP_UNLIKELY(hp_life_on)) {
        int said = hp_life_long(n, site);
        if (said >= 0) return said ? HP_KNOWN : 0;
    }
    uintptr_t w = __atomic_load_n(&hp_site_word[hp_site_index(site)], __ATOMIC_RELAXED);
    /* the site's own word, marked long: (w >> 1) == site and w & 1 (a site is at most 63 bits:
     * site_here.c) */
    if (HP_LIKELY(w != ((site << 1) | 1))) return 0;
    return hp_learning ? HP_BY_COUNTER : HP_KNOWN;
}

/* 1: this request goes to the long arena: predicted long (by the counter, once the process is
 * past its floor), the arena there to take it, and (the limit known once the arena is made) not
 * of a large class, but in mode size. */
static __attribute__((noinline)) int hp_long_why(size_t n, int why);
static inline __attribute__((always_inline)) int hp_long(size_t n, uintptr_t site) {
    int why = hp_predicted_long(n, site);
    if (HP_LIKELY(!why)) return 0;
    return hp_long_why(n, why);
}

/* hp_long past a prediction of long (out of line: the path of a short request stays in the
 * hook, without a call or a stack frame of its own) */
static __attribute__((noinline)) int hp_long_why(size_t n, int why) {
    if (why == HP_BY_COUNTER && HP_UNLIKELY(!__atomic_load_n(&hp_big, __ATOMIC_RELAXED)) &&
        !hp_reached_floor()) {
        HP_COUNT(hp_stripe(), held_small);
        return 0;
    }
    return hp_arena_ready() &&
           (hp_by_size || n < __atomic_load_n(&hp_large_min, __ATOMIC_RELAXED));
}

/* hp_long where hp_plain is set (neither mode=size nor a table: hp_predicted_long's first
 * questions skipped; the same answer) */
static inline __attribute__((always_inline)) int hp_long_plain(size_t n, uintptr_t site) {
    if (HP_UNLIKELY(n >= __atomic_load_n(&hp_large_min, __ATOMIC_RELAXED))) return 0;
    uintptr_t w = __atomic_load_n(&hp_site_word[hp_site_index(site)], __ATOMIC_RELAXED);
    if (HP_LIKELY(w != ((site << 1) | 1))) return 0;
    return hp_long_why(n, hp_learning ? HP_BY_COUNTER : HP_KNOWN);
}

/* 1 in `sample` allocations of the thread (the caller then calls hp_sample, which resets the
 * countdown; outside mode=predict it parks it at INT_MAX) */
static inline int hp_sampling(void) { return HP_UNLIKELY(--hp_tls_countdown <= HP_LEFT(0)); }

static inline int hp_on(void) {
    int st = __atomic_load_n(&hp_state, __ATOMIC_ACQUIRE);
    if (HP_LIKELY(st == HP_ON)) return 1;
    if (st == HP_START) hp_start();
    st = __atomic_load_n(&hp_state, __ATOMIC_ACQUIRE);
    /* aside (mode=off, no arenas API): nothing is ever sampled, so the thread's countdown is
     * parked, and the short path answers its calls from then on (init.c hp_start) */
    if (st == HP_ASIDE) hp_tls_countdown = INT32_MAX;
    return st == HP_ON;
}

static __attribute__((noinline)) void *hp_long_alloc(size_t n, int flags) {
    HP_COUNT(hp_stripe(), long_allocs);
    void *p = hp_mallocx(n ? n : 1, hp_flags | flags); /* mallocx(0) is undefined */
    if (p == NULL) errno = ENOMEM;
    return p;
}

/* 1: neither this allocation nor one the next allocator might make inside it (a next
 * operator new calling malloc: libstdc++'s; jemalloc's never does) is sampled, with the
 * countdown taken one down now: the caller then calls the next function last (a jump, no
 * frame). Above 2 only, so that the countdown reaches 1 and 0 on the same calls as when it is
 * taken down after the call (hp_sampling): the same allocations are sampled. */
static inline int hp_unsampled(void) {
    int left = hp_tls_countdown;
    if (HP_UNLIKELY(left <= HP_LEFT(2))) return 0;
    hp_tls_countdown = left - 1;
    return 1;
}

/* The hooks' short path (hooks.c, cxx.c), asked before anything else: HP_SHORT when the
 * caller's byte in the gate is 0 (the layer on with neither a table, nor mode=size, nor a
 * context deeper than the call site, and no site of the caller's low 16 bits ever marked long:
 * hp_gate) and no sample is due (hp_unsampled's question, one decrement: the countdown is kept
 * less 2); the hook then jumps to the next function. Where the byte is set, HP_GATED: the hook
 * jumps to its gated path (hp_gated), which asks the site table. Otherwise the hook jumps to its
 * whole path, after putting the countdown back first where it was taken below 0 (HP_UNDO), so
 * that the whole path finds it as it was: the same decisions, the same samples. The gated and
 * whole paths are functions of their own, reached by a jump (a sibling call: the hook has no
 * frame), so that their return address and frame are the hook's (HP_SITE, a context's key).
 * The short path reads only the return address's low two bytes (one movzwl off the stack). */
enum { HP_WHOLE, HP_SHORT, HP_UNDO, HP_GATED };
static inline __attribute__((always_inline)) int hp_short(void) {
    const uint8_t *gate = __atomic_load_n(&hp_gate, __ATOMIC_ACQUIRE);
    if (HP_UNLIKELY(gate[(uint16_t)(uintptr_t)__builtin_return_address(0)])) return HP_GATED;
    if (HP_LIKELY(--hp_tls_countdown >= HP_LEFT(2))) return HP_SHORT;
    return HP_UNDO;
}
/* The gated path's question (the caller's gate byte set): HP_WHOLE where the short path may not
 * answer at all (hp_fast 0) or the site is marked long, else as hp_short past its gate. */
static inline __attribute__((always_inline)) int hp_gated(uintptr_t site) {
    if (!__atomic_load_n(&hp_fast, __ATOMIC_ACQUIRE)) return HP_WHOLE;
    /* a plain load (one aligned word, as the atomics' relaxed load is on x86-64), so that the
     * compare reads it from memory itself */
    if (HP_UNLIKELY(hp_site_word[hp_site_index(site)] == ((site << 1) | 1))) return HP_WHOLE;
    if (HP_LIKELY(--hp_tls_countdown >= HP_LEFT(2))) return HP_SHORT;
    return HP_UNDO;
}
/* The short path's functions: no frame of their own (the return address read from the stack),
 * so that they end in a jump. */
#define HP_SHORT_FN __attribute__((optimize("omit-frame-pointer")))
/* The function pointer fp, read by one load the jump itself makes (`jmp *fp`: a volatile read,
 * which the compiler neither splits nor repeats; the acquire load's plain move on x86-64, which
 * the compiler keeps apart from the jump) */
#define HP_JUMP(fp) (*(__typeof__(fp) volatile *)&(fp))

/* hp_alloc's other path: long, or a sample due (out of line) */
static __attribute__((noinline)) void *hp_alloc_rest(size_t n, int zero, uintptr_t site,
                                                      int lng) {
    void *p;
    if (HP_UNLIKELY(lng)) p = hp_long_alloc(n, zero ? HP_MALLOCX_ZERO : 0);
    else p = zero ? hc_real.calloc(1, n) : hc_real.malloc(n);
    if (hp_sampling()) hp_sample(p, site, lng);
    return p;
}

/* malloc and calloc share it: zero: MALLOCX_ZERO on the long path, calloc on the short one. */
static inline __attribute__((always_inline)) void *hp_alloc(size_t n, int zero, uintptr_t site) {
    int lng = HP_LIKELY(__atomic_load_n(&hp_plain, __ATOMIC_ACQUIRE)) ? hp_long_plain(n, site)
                                                                      : hp_long(n, site);
    if (HP_LIKELY(!lng) && hp_unsampled()) return zero ? hc_real.calloc(1, n) : hc_real.malloc(n);
    return hp_alloc_rest(n, zero, site, lng);
}

static int hp_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* The aligned family: a long site with a valid alignment to mallocx, else fn() (the real
 * function, which also answers an invalid alignment as it would without the layer). */
static void *hp_aligned(size_t align, size_t n, uintptr_t site, int *handled) {
    *handled = 0;
    if (!hp_on() || !hp_pow2(align)) return NULL;
    if (!hp_long(n, site)) {
        if (hp_sampling()) hp_tls_countdown = HP_LEFT(1); /* sample the next one instead */
        return NULL;
    }
    *handled = 1;
    void *p = hp_long_alloc(n, HP_MALLOCX_LG_ALIGN(__builtin_ctzll(align)));
    if (hp_sampling()) hp_sample(p, site, 1);
    return p;
}
