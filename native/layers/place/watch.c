/* Part of layers/place.c (one translation unit; never compiled alone).
 * The counter begins to learn (mode=predict): at start where it learns at once (learn_mb 0, no
 * floor, or a learn file), else at the first read of the resident set at learn_mb or more
 * (sample.c hp_wait_tick). From then on each thread's countdown takes a sample every `sample`
 * allocations, and free and every delete ask the block's sample slot before they jump: their
 * pointers (hooks.c hp_free_now, cxx.c name##_now) go to the watching functions. Once, for
 * good; safe in any thread, with no lock: each pointer is replaced by one store or one
 * compare-and-swap, and only then is hp_watching set, so that no sample is taken before every
 * free and delete asks its slot. */
static __attribute__((noinline)) void hp_watch_begin(void) {
    int expect = 0;
    if (!__atomic_compare_exchange_n(&hp_watch_started, &expect, 1, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_RELAXED))
        return;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* free: the real free becomes hp_free_watch; hp_free_whole (start-up, the pool used) asks
     * hp_watching itself; a start that sets the real free after this compare sees
     * hp_watch_started (init.c hp_free_direct) */
    void (*f)(void *) = __atomic_load_n(&hc_real.free, __ATOMIC_ACQUIRE);
    if (f != NULL)
        __atomic_compare_exchange_n(&hp_free_now, &f, hp_free_watch, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED);
#define HP_WATCH_DELETE_(name, params, args)                                                      \
    __atomic_store_n(&name##_now, name##_watch, __ATOMIC_SEQ_CST);
    HP_DELETES(HP_WATCH_DELETE_)
#undef HP_WATCH_DELETE_
    /* then the samples: every free and delete asks its slot by now */
    __atomic_store_n(&hp_watching, 1, __ATOMIC_SEQ_CST);
    /* this thread samples its next allocation (the others within HP_WAIT_TICK of theirs) */
    hp_tls_countdown = HP_LEFT(0);
}
