/* Part of layers/place.c (one translation unit; never compiled alone).
 * Start (hp_start, from the first hooked call that finds the real functions, or the constructor:
 * the options, the arenas API, the table), the constructor (the sites file), exit (the samples
 * still live judged, the learn file, the stats line). */

/* free's body the real free itself (or hp_free_watch once the counter learns), if the
 * start-up pool never gave a block (called at start, the real functions known). A block the
 * pool gives meanwhile (a thread that found no real function before they were published) puts
 * hp_free_whole back (hp_pool_alloc) before it returns the block: each side writes, then a
 * fence, then the other side's word is read or written, so that either this one sees the pool
 * used or the pool's write comes last. So too with the counter's start (watch.c), which finds
 * the real free here and replaces it, or is seen here. */
static void hp_free_direct(void) {
    void (*f)(void *) = __atomic_load_n(&hc_real.free, __ATOMIC_ACQUIRE);
    if (f == NULL || __atomic_load_n(&hc_pool_used, __ATOMIC_RELAXED) != 0) return;
    __atomic_store_n(&hp_free_now, f, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&hc_pool_used, __ATOMIC_RELAXED) != 0)
        __atomic_store_n(&hp_free_now, hp_free_whole, __ATOMIC_RELAXED);
    else if (__atomic_load_n(&hp_watch_started, __ATOMIC_SEQ_CST))
        __atomic_compare_exchange_n(&hp_free_now, &f, hp_free_watch, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED);
}

/* The start-up pool's block (bootstrap_pool.h), free's body then the whole one
 * (hp_free_direct says why) */
static void *hp_pool_alloc(size_t n, size_t align) {
    void *p = hc_pool_alloc(n, align);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&hp_free_now, hp_free_whole, __ATOMIC_RELAXED);
    return p;
}

/* Once, from the first hook call that finds the real functions: the options, the arenas API,
 * the long arena. A call nested in it (dlsym's calloc, jemalloc's own start) passes through;
 * so do calls from other threads meanwhile (no waiting, no lock: safe across fork too). */
static __attribute__((noinline)) void hp_start(void) {
    int expect = HP_START;
    if (!__atomic_compare_exchange_n(&hp_state, &expect, HP_STARTING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    int next = HP_ASIDE;
    int parsed = hp_parse_options();
    hp_off = parsed && hp_set.mode == HP_OFF;
    if (parsed && !hp_off) {
        hp_mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_NEXT,
                                                                                   "mallctl");
        hp_mallocx = (void *(*)(size_t, int))dlsym(RTLD_NEXT, "mallocx");
        hp_rallocx = (void *(*)(void *, size_t, int))dlsym(RTLD_NEXT, "rallocx");
        if (!hp_mallctl || !hp_mallocx || !hp_rallocx) {
            hp_say("the next allocator has no arenas API (mallctl, mallocx: jemalloc's); "
                   "passing every call through");
        } else {
            hp_large_min = (size_t)sysconf(_SC_PAGESIZE) << 2;
            hp_learning = hp_set.mode == HP_PREDICT;
            if (hp_learning && hp_set.learn_rss == 0) hp_watch_begin(); /* learns at once */
            hp_big = hp_set.min_rss == 0; /* no floor */
            if (hp_set.table[0]) {
                hc_site_init(); /* the program's name, as the tracer records it */
                const char *why = hp_load_life(hp_set.table);
                if (why) {
                    hc_say_line("heapcast place: ", "table file ", hp_set.table, " refused: it ",
                                why);
                    hp_life_refused = 1;
                } else {
                    hp_life_on = 1;
                }
            }
            hp_by_size = hp_set.mode == HP_SIZE;
            /* the table keys on the call site (../TABLE.md); mode=sites takes the depth its
             * file was learned at (the constructor, sites_file.c) */
            if (hp_set.mode == HP_PREDICT && !hp_life_on) hp_key_depth(hp_set.depth);
            next = HP_ON;
        }
    }
    __atomic_store_n(&hp_state, next, __ATOMIC_RELEASE);
    if (next == HP_ON && !hp_by_size && !hp_life_on) {
        __atomic_store_n(&hp_plain, 1, __ATOMIC_RELEASE);
        hp_fast_update();
    } else if (next == HP_ASIDE) {
        /* every call passes: the short path's gate all 0 (no site is ever marked long aside),
         * each thread's countdown parked at its first pass (decide.c hp_on), so that malloc
         * and new are the gate's test, a decrement and a jump, as in predict at a short site */
        __atomic_store_n(&hp_fast, 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&hp_gate, hp_gate_long, __ATOMIC_SEQ_CST);
    }
    hp_free_direct();
}

/* The stats line (stats=1: stderr; a path: appended), once, at exit. */
static void hp_write_stats(void) {
    if (!hp_set.stats[0] || !strcmp(hp_set.stats, "0")) return;
    struct hp_stripe t = {0};
    for (int i = 0; i < 65; i++) {
        t.long_allocs += hp_stripes[i].long_allocs;
        t.sampled += hp_stripes[i].sampled, t.dropped += hp_stripes[i].dropped;
        t.held_small += hp_stripes[i].held_small;
        t.table_answers += hp_stripes[i].table_answers;
        t.counter_answers += hp_stripes[i].counter_answers;
    }
    unsigned long sites_long = 0, sites_seen = 0, sites_aside = 0;
    for (unsigned e = 0; e < HP_NSITES; e++) {
        sites_seen += hp_site_word[e] != 0;
        sites_long += hp_site_word[e] & 1;
        sites_aside += hp_site_word[e] && hp_aside(hp_sites[e].falls);
    }
    char line[768];
    char *end = line + sizeof line - 1, *p = hc_text(line, end, "heapcast place: pid=");
    p = hc_text_u64(p, end, (uint64_t)getpid());
    p = hc_text(hc_text(p, end, " mode="), end, hp_mode_names[hp_set.mode]);
#define F(key, v) p = hc_text_u64(hc_text(p, end, " " key "="), end, (uint64_t)(v))
    F("long", t.long_allocs);
    F("sampled", t.sampled);
    F("dropped", t.dropped);
    F("freed_short", hp_freed_short);
    F("freed_long", hp_freed_long);
    F("evicted_long", hp_evicted_long);
    F("sites_seen", sites_seen);
    F("sites_long", sites_long);
    F("sites_aside", sites_aside);
    F("table", hp_life_on);
    F("table_refused", hp_life_refused);
    F("table_answers", t.table_answers);
    F("counter_answers", t.counter_answers);
    F("long_young", hp_long_young);
    F("long_old", hp_long_old);
    F("held_small", t.held_small);
    F("depth", hp_depth > 1 ? hp_depth : 1);
    /* 1: mode=predict, and the counter never learned (the process stayed under learn_mb) */
    F("waiting", hp_learning && !__atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE));
#undef F
    *p++ = '\n';
    if (!strcmp(hp_set.stats, "1")) {
        hc_write_all(2, line, (size_t)(p - line));
        return;
    }
    int fd = open(hp_set.stats, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) hc_write_all(fd, line, (size_t)(p - line)), close(fd);
}

__attribute__((constructor)) static void hp_constructor(void) {
    if (HC_REAL(malloc) == NULL) return;
    hp_start();
    if (__atomic_load_n(&hp_state, __ATOMIC_ACQUIRE) == HP_ON && hp_set.mode == HP_SITES)
        hp_read_sites();
}

static void hp_write_stats(void);

__attribute__((destructor)) static void hp_destructor(void) {
    if (__atomic_load_n(&hp_state, __ATOMIC_ACQUIRE) != HP_ON) {
        if (hp_off) hp_write_stats(); /* mode=off: its line says so, every count 0 */
        return;
    }
    /* blocks still live past the horizon count long (a block never freed is long-lived) */
    uint64_t now = __atomic_load_n(&hp_clock, __ATOMIC_RELAXED);
    if (hp_set.mode == HP_PREDICT && __atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE)) {
        for (unsigned i = 0; i < HP_NSAMPLES; i++) {
            uintptr_t k = __atomic_load_n(&hp_sample_ptr[i], __ATOMIC_ACQUIRE);
            if (k == HP_EMPTY) continue;
            uint64_t v = __atomic_load_n(&hp_sample_val[i], __ATOMIC_ACQUIRE);
            if (((now - v) & HP_CLOCK_MASK) >= hp_set.horizon) hp_verdict(v, 1);
        }
    }
    if (hp_set.learn[0]) hp_write_sites();
    hp_write_stats();
}
