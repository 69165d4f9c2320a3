/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The free path: hl_free_from (every free: small blocks leave at once) and hl_free_large (a
 * block >= min), in named steps. The decisions are the policy core's, called as policy.c says
 * (scope, hpc_outgrown, hpc_wanted, hl_keep_at_free, hpc_keep_shared); the steps here take
 * the locks, move the block between the live set, a front and the shared cache, count, and
 * call the real free outside every lock. */

/* Step: a block out of scope (glibc's heap) is untracked (hl_track): no lock, no live set,
 * nothing learned (guided: hl_learn_request); it goes straight to glibc, one counter in the
 * thread's own stripe (the cost of tracking such blocks: ../../README.md, Measured). */
static inline void hl_free_out_of_scope(void *p, int outgrown) {
    if (outgrown) HL_COUNT(outgrown);
    else HL_COUNT(heap);
    hl_pass_free(p);
}

/* Step: p is not a live block of ours (e NULL: a foreign pointer, a block from before the
 * start, or a double free of a block in the shared cache; e in a front: a double free). If it
 * is kept (in a front or the shared cache), the program freed it twice: the block leaves the
 * cache and both frees reach the real free, which reports it as it would without the layer.
 * Called with s's live lock held (hl_live_lock), which it gives back. 1: look again (a shared
 * take was making p live meanwhile), 0: done. */
static inline int hl_free_not_live(struct hl_shard *s, struct hl_live_slot *e, void *p) {
    void (*real_free)(void *) = hc_real.free;
    int twice = e != NULL;
    if (twice) hl_live_remove(s, e); /* its front, finding its ticket gone, forgets it */
    if (hl_sharded) {
        hl_live_unlock(s);
        hl_lock_take();
    }
    if (!twice && !(twice = hl_unkeep(p)) && hl_sharded) {
        /* a shared take may be making p live (it holds hl_lock, then p's shard): look again */
        hl_nested_lock(s);
        int live = hl_live_find(s, p) != NULL;
        hl_nested_unlock(s);
        if (live) {
            hl_lock_give();
            return 1;
        }
    }
    if (twice) hl_stats.double_frees++;
    else hl_cache.stats.untracked++;
    HL_COUNT(declined);
    hl_lock_give();
    if (twice) real_free(p);
    real_free(p);
    return 0;
}

/* Step: the block waits in this thread's front (its slot carries the front's ticket); the
 * front's older block, if any, moves to the shared cache. Called with s's lock held (its shard
 * lock: fronts are on only where the live set is sharded), which it gives back. */
static inline void hl_free_to_front(struct hl_shard *s, struct hl_live_slot *e, void *p,
                                    size_t usable, uint64_t now) {
    hl_bytes_move(&s->live, &s->fronted, e->usable);
    e->ticket = hl_new_ticket();
    s->kept++;
    struct hl_front old = hl_front;
    hl_front_set(p, usable, e->ticket, now);
    hl_live_unlock(s);
    if (old.p) hl_front_to_shared(&old, now);
    hl_advise_idle(now);
}

/* Step: the policy keeps nothing: p leaves the live set and goes to the next allocator,
 * counted by why, and remembered where the proof or the regret needs it (hl_ghost_add).
 * Called with s's live lock held, which it gives back. */
static inline void hl_free_pass_on(struct hl_shard *s, struct hl_live_slot *e, void *p,
                                   size_t usable, size_t req, int unproven, int outgrown,
                                   int passed_by_prediction) {
    hl_live_remove(s, e);
    hl_live_unlock(s);
    if (unproven) {
        HL_COUNT(unproven);
        hl_ghost_add(p, usable, hcp_class(req));
    } else if (outgrown) {
        HL_COUNT(outgrown);
    } else {
        HL_COUNT(declined);
        if (passed_by_prediction) hl_ghost_add(p, usable, hcp_class(req));
    }
    hl_pass_free(p);
}

/* Step: p leaves the live set for the shared cache under hl_lock (taken before its shard's, the
 * one order), so that a second free of p finds it live or kept, never neither. Called with s's
 * live lock held. 1: done, hl_lock held; 0: a second free came first (this one is the second:
 * look again), no lock held. */
static inline int hl_free_unlive(struct hl_shard *s, struct hl_live_slot *e, void *p,
                                 uint64_t now) {
    if (!hl_sharded) {
        hl_live_remove(s, e); /* hl_live_lock took hl_lock: held on to the end */
        return 1;
    }
    hl_live_unlock(s);
    if (hl_front.p) { /* the thread's front holds an older block: it goes first, in order */
        struct hl_front old = hl_front;
        hl_front_clear();
        hl_front_to_shared(&old, now);
    }
    hl_lock_take();
    hl_nested_lock(s);
    e = hl_live_find(s, p);
    int ours = e != NULL && e->ticket == 0;
    if (ours) hl_live_remove(s, e);
    hl_nested_unlock(s);
    if (!ours) {
        hl_lock_give();
        return 0;
    }
    return 1;
}

/* Step: p enters the shared cache, if largest's rule and the cap make room for it (else it goes
 * to the next allocator); idle blocks decay first. Called with hl_lock held, which it gives
 * back; the real free and madvise run outside it. */
static inline int hl_free_to_shared(void *p, size_t usable, int advised, uint64_t now) {
    if (advised) { /* madv=0: advise before other threads can take it, outside the lock */
        hl_lock_give();
        hl_madvise(p, usable);
        hl_lock_take();
    }
    struct hpc_out out = {0};
    /* idle blocks decay; largest: the smallest goes for a larger one; then the cap (and the
     * table's size): the oldest go back (largest: the smallest) */
    struct hpc_block *b = hpc_keep_shared(&hl_core, &hl_cache, (uintptr_t)p, usable, now, &out);
    int keep = b != NULL;
    if (keep) b->advised = advised;
    else HL_COUNT(declined);
    hl_lock_give();
    if (!keep) hl_pass_free(p);
    hl_release(&out);
    hl_advise_idle(now);
    return keep;
}

/* The program frees p (usable >= min), returning to `caller`. 1: the layer keeps p (a front or
 * the shared cache), 0: p went to the real free. */
static int hl_free_large(void *p, size_t usable, const void *caller) {
    int advised = hl_set.madv_ns == 0;
    int outgrown = hpc_outgrown(&hl_hist, (uintptr_t)p, usable);
    if (!hl_in_scope(p)) {
        hl_free_out_of_scope(p, outgrown);
        return 0;
    }
    uint64_t now = hl_set.policy == HL_LARGEST && hl_set.madv_ns <= 0 ? 0 : hl_now();
    /* before any lock (see Call sites, predict.c); only where the table has an entry to ask */
    int site = hl_site_set != NULL ? hl_site_of(caller) : -1;
    int wanted = hpc_wanted(&hl_core, usable, outgrown);
    int unproven = wanted && hpc_unproven(&hl_cache); /* passed on, remembered (hl_ghost_add) */
    /* the front: pools/guided, a block the thread's reservation covers (madv=0 advises every
     * kept block at once: the shared path) */
    int front = wanted && !unproven && !advised && hl_front_open() &&
                (usable <= hl_front.reserved || hl_reserve(usable));
    struct hl_shard *s = hl_shard_of(p);
    for (;;) { /* again when another thread's free or take of p came in between */
        hl_live_lock(s);
        struct hl_live_slot *e = hl_live_find(s, p);
        if (HL_UNLIKELY(e == NULL || e->ticket != 0)) {
            if (hl_free_not_live(s, e, p)) continue;
            return 0;
        }
        size_t req = e->req ? e->req : 1;
        int passed_by_prediction = 0; /* regret=1: remembered (hl_ghost_add) */
        int keep = hl_keep_at_free(req, site, e->ctx, wanted, unproven, s, &passed_by_prediction);
        if (keep && front) {
            hl_free_to_front(s, e, p, usable, now);
            return 1;
        }
        if (!keep) {
            hl_free_pass_on(s, e, p, usable, req, unproven, outgrown, passed_by_prediction);
            return 0;
        }
        if (!hl_free_unlive(s, e, p, now)) continue;
        return hl_free_to_shared(p, usable, advised, now);
    }
}

/* free's body; `caller`: where the program's call returns (the table's call-site key) */
static inline __attribute__((always_inline)) void hl_free_from(void *p, const void *caller) {
    if (p == NULL || HL_UNLIKELY(hc_in_pool(p))) return;
    void (*real_free)(void *) = HC_REAL(free);
    if (HL_UNLIKELY(!real_free)) return; /* cannot happen: p came from somewhere */
    size_t min = hl_active_min;
    if (min != SIZE_MAX) {
        /* over glibc, the chunk's size word before the block (its size, header included, and 3
         * flag bits) tells a small block at once: most frees are of small blocks, and a call
         * of malloc_usable_size at each is measurable (../../README.md, Measured) */
        size_t small = min < HL_FOLLOW_MIN ? min : HL_FOLLOW_MIN;
        if (hl_glibc_next && (hl_chunk_word(p) & ~(size_t)7) < small) {
            real_free(p);
            return;
        }
        size_t usable = hc_real.malloc_usable_size(p);
        if (usable >= min) {
            /* followed once the layer knows whether glibc saw the free (hl_follow) */
            int kept = hl_free_large(p, usable, caller);
            if (usable >= HL_FOLLOW_MIN) hl_follow(usable, kept);
            return;
        }
        if (usable >= HL_FOLLOW_MIN) hl_follow(usable, 0);
    }
    real_free(p);
}
