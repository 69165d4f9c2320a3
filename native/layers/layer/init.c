/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Start (the constructor: options, the next allocator, the table, the thread key, fork
 * handlers, then the hot path switched on), fork (every lock held across it), exit (the stats
 * line, hl_fini). */

/* fork: every lock held across it, in the one order (hl_follow_lock, hl_lock, the shards), so
 * that the child finds none held by a thread it does not have; see Threads. */
static void hl_fork_prepare(void) {
    pthread_mutex_lock(&hl_follow_lock); /* never taken while the others are held: first */
    hl_lock_take();
    for (int i = 0; i < HL_SHARDS; i++) hl_spin_lock(&hl_shards[i].lock);
}
static void hl_fork_parent(void) {
    for (int i = HL_SHARDS - 1; i >= 0; i--) hl_spin_unlock(&hl_shards[i].lock);
    hl_lock_give();
    pthread_mutex_unlock(&hl_follow_lock);
}
static void hl_fork_child(void) {
    /* the other threads are gone: their hint slots are free again (their fronts' blocks stay
     * out of reach, at most one each) */
    __atomic_store_n(&hl_hints_used, hl_hint_slot >= 0 ? (uint64_t)1 << hl_hint_slot : 0,
                     __ATOMIC_RELAXED);
    for (int i = 0; i < HL_HINTS; i++)
        if (i != hl_hint_slot) hl_hints[i].p = NULL;
    /* and their stripes, whose counts stay (the child's stats count the parent's calls too) */
    __atomic_store_n(&hl_stripes_owned,
                     hl_my_stripe_slot >= 0 ? (uint64_t)1 << hl_my_stripe_slot : 0,
                     __ATOMIC_RELAXED);
    hl_fork_parent();
}

/* The free path's one compare (options.c hl_free_small): over glibc, a chunk word below the
 * smaller of min and glibc's least mmap threshold (hl_free_from's small block; rounded up to 8,
 * as the word's 3 flag bits are in the compare), every glibc word where the layer keeps nothing
 * (hl_active_min SIZE_MAX: policy off), never a start-up pool block's (its word at or above
 * HC_POOL_MARK). Over another allocator it stays 0. */
static void hl_set_free_small(void) {
    if (!hl_glibc_next || !hc_real.free) return;
    size_t min = __atomic_load_n(&hl_active_min, __ATOMIC_RELAXED), small = HC_POOL_MARK;
    if (min != SIZE_MAX) small = ((min < HL_FOLLOW_MIN ? min : HL_FOLLOW_MIN) + 7) & ~(size_t)7;
    __atomic_store_n(&hl_free_small, small, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void hl_init(void) {
    hl_shards_init();
    hc_resolve();
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) hl_page = (size_t)page;
    struct hl_settings st = hl_set;
    if (!hl_read_settings(&st)) {
        hl_set.policy = HL_OFF;
        return; /* pass-through (said on stderr) */
    }
    hl_set = st;
    void *lm = dlsym(RTLD_NEXT, "__libc_malloc");
    hl_glibc_next = lm != NULL && lm == (void *)hc_real.malloc;
    if (hl_set.policy == HL_GUIDED && hl_set.table[0]) {
        hc_site_init(); /* the program's name, as the tracer records it */
        const char *why = hl_load_table(hl_set.table);
        if (why) {
            hl_stats.table_refused = 1;
            hl_say("table file ", hl_set.table, " refused: it ", why);
        } else {
            hl_use_table = 1;
            /* format 4's contexts need the unwinder's cache (../../context_key.h); without it
             * the frees ask the sites and the counter, as format 3 */
            if (hl_ctx_set != NULL && !hc_ctx_start()) {
                hl_ctx_set = NULL;
                hl_say("cannot map the unwinder's cache; the table's context entries are unused",
                       "", "", "");
            }
        }
    }
    hl_core = (struct hpc_settings){
        .policy = (int32_t)hl_set.policy, /* enum hl_policy and enum hpc_policy agree */
        .n = hl_set.n,
        .min = hl_set.min,
        .cap = hl_set.cap,
        .decay_ns = hl_set.decay_ns,
        .topk = hl_set.topk,
        .horizon = hl_set.horizon,
        .peak = hl_set.peak,
        .proof = hl_set.proof,
        .regret = hl_set.regret,
        .fronts = (hl_set.policy == HL_POOLS || hl_set.policy == HL_GUIDED) && hl_set.madv_ns != 0,
        /* format 2 (or 3 without sites): the class scores; with sites, unknown keys ask the
         * thread's counter, never the class scores (predict.c) */
        .class_table = hl_use_table && !hl_use_sites ? &hl_table[0][0] : NULL,
    };
    hpc_cache_init(&hl_core, &hl_cache);
    /* every policy: the key's destructor gives a thread's counter stripe back (hl_stripe_claim) */
    hl_key_ok = pthread_key_create(&hl_key, hl_thread_exit) == 0;
    if (hl_set.policy == HL_GUIDED || hl_set.policy == HL_POOLS) hl_sharded = 1;
    pthread_atfork(hl_fork_prepare, hl_fork_parent, hl_fork_child);
    if (hl_set.policy != HL_OFF && hl_set.follow && !hl_threshold_fixed())
        hl_follow_at = HL_FOLLOW_MIN;
    if (hl_set.policy != HL_OFF && hc_real.malloc_usable_size && hc_real.free)
        __atomic_store_n(&hl_active_min, hl_set.min, __ATOMIC_RELEASE);
    hl_set_free_small();
}

__attribute__((destructor)) static void hl_fini(void) {
    if (!hl_set.stats[0]) return;
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    hl_lock_take();
#define F(key, v)                                                                                 \
    p = hc_text_u64(hc_text(p, end, key "="), end, (uint64_t)(v)), p = hc_text(p, end, " ")
    F("pid", getpid());
    F("policy", hl_set.policy);
    F("table", hl_use_table);
    const struct hpc_stats *st = &hl_cache.stats;
    uint64_t front_hits = 0, front_kept = 0, sited = 0, contexted = 0;
    for (int i = 0; i < HL_SHARDS; i++) {
        hl_spin_lock(&hl_shards[i].lock);
        front_hits += hl_shards[i].hits;
        front_kept += hl_shards[i].kept;
        sited += hl_shards[i].sited;
        contexted += hl_shards[i].contexted;
        hl_spin_unlock(&hl_shards[i].lock);
    }
    F("hits", st->hits + front_hits);
    F("misses", HL_STRIPED(misses));
    F("kept", st->kept + front_kept);
    F("bytes_kept_peak", st->bytes_kept_peak);
    F("bytes_kept_at_exit", hl_cache.bytes_kept);
    F("given_back", st->given_back);
    F("bytes_given_back", st->bytes_given_back);
    F("bytes_advised", hl_stats.bytes_advised);
    F("decayed", st->decayed);
    F("passed", HL_STRIPED(misses) + HL_STRIPED(heap) + HL_STRIPED(outgrown) +
                    HL_STRIPED(declined) + HL_STRIPED(unproven));
    F("double_frees", hl_stats.double_frees);
    /* frees the layer left to the next allocator by its rules: outgrown blocks, glibc's heap */
    F("outgrown", HL_STRIPED(outgrown));
    F("heap", HL_STRIPED(heap));
    /* frees of blocks >= min it did not hand out: made before it started, asked for below min,
     * or not the allocator's at all (a foreign pointer) */
    F("untracked", st->untracked);
    /* blocks given back to keep live + kept within the live blocks' peak (hl_bound), and that
     * peak in bytes */
    F("bounded", st->bounded + HL_STRIPED(bounded));
    F("live_peak", st->live_peak);
    F("table_refused", hl_stats.table_refused);
    F("table_sites", sited);
    F("table_contexts", contexted); /* frees a context entry answered (format 4) */
    /* the proof (hl_ghost_hit): 1 once the layer keeps blocks; the reuses it saw of blocks
     * passed on before (`proof`, or a count more where threads raced the first keeps), and the
     * frees it passed on meanwhile */
    F("proof", hl_set.proof);
    F("proven", HPC_LOAD(hl_cache.proven));
    F("proof_hits", st->proof_hits);
    F("unproven", HL_STRIPED(unproven));
    /* regret=1: misses a block the prediction passed on would have served, and the frees kept
     * on those regrets against the thread's counter */
    F("regret", hl_set.regret);
    F("regret_hits", st->regret_hits);
    F("regret_keeps", HPC_LOAD(st->regret_keeps));
    F("mmap_threshold", __atomic_load_n(&hl_follow_at, __ATOMIC_RELAXED)); /* 0: not followed */
    F("program_mmap_threshold", __atomic_load_n(&hl_program_threshold, __ATOMIC_RELAXED));
    /* threads that counted their calls on the one shared stripe, atomically (hl_stripe_claim):
     * those beyond HL_STRIPES alive at once */
    F("threads_sharing_counters", __atomic_load_n(&hl_stripe_sharers, __ATOMIC_RELAXED));
#undef F
    hl_lock_give();
    p[-1] = '\n';
    if (!strcmp(hl_set.stats, "1")) {
        char out[800];
        char *q = hc_text(out, out + sizeof out, "heapcast layer: ");
        size_t len = (size_t)(p - line);
        memcpy(q, line, len);
        hc_write_all(2, out, (size_t)(q - out) + len);
        return;
    }
    int fd = open(hl_set.stats, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        hc_write_all(fd, line, (size_t)(p - line));
        close(fd);
    }
}
