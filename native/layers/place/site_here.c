/* Part of layers/place.c (one translation unit; never compiled alone).
 * The site of a call, what the site table and the sites files key on: at depth 1 its return
 * address (one register: the call site, process-local), deeper the key of its calling context
 * (../context_key.h: the first `depth` frames, module + offset folded, the key the dataset's
 * contexts name; the same in every process of the program). A context key is 63 bits, so that
 * (site << 1 | long) fits the table's word as an address does. */

#define HP_SITE hp_site_here(__builtin_frame_address(0), __builtin_return_address(0))

static inline uintptr_t hp_site_here(const void *fp, const void *ret) {
    unsigned depth = __atomic_load_n(&hp_depth, __ATOMIC_RELAXED);
    if (HP_LIKELY(depth <= 1)) return (uintptr_t)ret;
    return (uintptr_t)hc_ctx_of(fp, depth);
}

/* Key sites on `depth` frames from now on (1: the return address); a context needs the
 * unwinder's cache, and without it (its mmap refused) the layer says so once and keys on the
 * return address. */
static void hp_key_depth(unsigned depth) {
    if (depth > 1 && !hc_ctx_start()) {
        hp_say("cannot map the unwinder's cache; sites are call sites (depth 1)");
        depth = 1;
    }
    __atomic_store_n(&hp_depth, depth, __ATOMIC_RELEASE);
    hp_fast_update();
}

/* dlclose: an unloaded module's addresses may come to hold other code, whose frames must not be
 * read by its unwind rules nor named by its frame keys (../context_key.h hc_ctx_forget). */
HP_EXPORT int dlclose(void *handle) {
    static int (*next)(void *);
    int (*f)(void *) = HC_NEXT(next, "dlclose");
    int r = f ? f(handle) : -1;
    if (__atomic_load_n(&hp_depth, __ATOMIC_RELAXED) > 1) hc_ctx_forget();
    return r;
}
