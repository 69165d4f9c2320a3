/* heapcast's policy core (core.h says what it is and who calls it). Included into its caller's
 * translation unit, never compiled alone. Each function names the layer's function whose
 * decision it takes (native/layers/layer/policy.c, alloc.c, free.c, fronts.c, predict.c); the
 * layer's comments say why each rule is there. */
#include "core.h"

#define HPC_INLINE static inline __attribute__((unused))

/* A process's cache at its start: empty, proven at once where proof=0 (init.c). */
HPC_INLINE void hpc_cache_init(const struct hpc_settings *set, struct hpc_cache *c) {
    *c = (struct hpc_cache){0};
    c->proven = set->proof == 0;
}

/* ---- Which kept block serves a request (hl_fits) ---- */

HPC_INLINE int hpc_fits(uint64_t usable, uint64_t n) {
    return usable >= n && usable - n < n + 4096;
}

/* ---- The shared cache's bookkeeping (cache.c) ---- */

HPC_INLINE void hpc_note_peak(struct hpc_cache *c) {
    if (c->bytes_kept + c->front_bytes > c->stats.bytes_kept_peak)
        c->stats.bytes_kept_peak = c->bytes_kept + c->front_bytes;
}

/* Kept block i goes back into out (hl_drop). */
HPC_INLINE void hpc_drop(struct hpc_cache *c, int i, int decayed, struct hpc_out *out) {
    out->p[out->n++] = c->kept[i].p;
    c->bytes_kept -= c->kept[i].usable;
    c->stats.given_back++;
    c->stats.bytes_given_back += c->kept[i].usable;
    c->stats.decayed += (uint64_t)decayed;
    c->kept[i] = c->kept[--c->nkept];
}

HPC_INLINE void hpc_insert(struct hpc_cache *c, uintptr_t p, uint64_t usable, uint64_t since) {
    c->kept[c->nkept++] = (struct hpc_block){p, usable, ++c->stamp, since};
    c->bytes_kept += usable;
    hpc_note_peak(c);
}

/* ---- The proof and the regret (hl_ghost_add, hl_ghost_hit) ---- */

HPC_INLINE void hpc_regret_less(struct hpc_cache *c, unsigned cls) {
    if (c->regret[cls % HPC_CLASSES] > 0) c->regret[cls % HPC_CLASSES]--;
}

HPC_INLINE void hpc_ghost_drop(struct hpc_cache *c, int i) {
    for (; i < c->nghost - 1; i++) c->ghost[i] = c->ghost[i + 1];
    c->nghost--;
}

/* A free the layer would have kept, passed on before the proof; or, after it (regret), a free
 * the prediction passed on: remembered, the oldest forgotten (after the proof: a regret less). */
HPC_INLINE void hpc_ghost_add(struct hpc_cache *c, uintptr_t p, uint64_t usable, unsigned cls) {
    if (c->nghost == HPC_GHOSTS) {
        if (c->proven) hpc_regret_less(c, c->ghost[0].cls);
        hpc_ghost_drop(c, 0);
    }
    c->ghost[c->nghost++] = (struct hpc_ghost){p, usable, cls};
}

/* A miss the newest remembered block that fits would have served: before the proof a step
 * towards it, after it a regret for that block's class. */
HPC_INLINE void hpc_ghost_hit(const struct hpc_settings *set, struct hpc_cache *c, uint64_t n,
                              uintptr_t mask) {
    for (int i = c->nghost - 1; i >= 0; i--)
        if (hpc_fits(c->ghost[i].usable, n) && (c->ghost[i].p & mask) == 0) {
            unsigned cls = c->ghost[i].cls;
            hpc_ghost_drop(c, i);
            if (!c->proven) {
                if (++c->stats.proof_hits >= (uint64_t)set->proof) c->proven = 1;
            } else {
                c->stats.regret_hits++;
                c->regret[cls % HPC_CLASSES] = HPC_REGRET;
            }
            return;
        }
}

/* ---- Making room, the victim, decay (hl_victim, hl_make_room, hl_decay) ---- */

/* The kept block that goes back first: the oldest (seed002: the smallest, the oldest of equals). */
HPC_INLINE int hpc_victim(const struct hpc_settings *set, const struct hpc_cache *c) {
    int v = 0;
    for (int i = 1; i < c->nkept; i++) {
        int older = c->kept[i].stamp < c->kept[v].stamp;
        if (set->policy == HPC_SEED002 ? c->kept[i].usable < c->kept[v].usable ||
                                             (c->kept[i].usable == c->kept[v].usable && older)
                                       : older)
            v = i;
    }
    return v;
}

/* Room under the cap for `extra` more bytes (and, with `slot`, a free entry): the victims go
 * back until there is; 1 if there is. */
HPC_INLINE int hpc_make_room(const struct hpc_settings *set, struct hpc_cache *c, uint64_t extra,
                             int slot, struct hpc_out *out) {
#define HPC_FULL                                                                                  \
    (c->bytes_kept + c->front_bytes + extra > set->cap || (slot && c->nkept >= HPC_MAX_KEPT))
    while (c->nkept > 0 && out->n < HPC_OUT_MAX && HPC_FULL)
        hpc_drop(c, hpc_victim(set, c), 0, out);
    return !HPC_FULL;
#undef HPC_FULL
}

/* seed001, guided: blocks idle longer than `decay` go back (a regret less for each). */
HPC_INLINE void hpc_decay(const struct hpc_settings *set, struct hpc_cache *c, uint64_t now,
                          struct hpc_out *out) {
    if (set->policy == HPC_SEED002) return;
    for (int i = 0; i < c->nkept && out->n < HPC_OUT_MAX;) {
        if (now - c->kept[i].since > set->decay_ns) {
            if (set->regret) hpc_regret_less(c, hcp_class(c->kept[i].usable));
            hpc_drop(c, i, 1, out);
        } else {
            i++;
        }
    }
}

/* seed002: with n kept, a block enters only if at least as large as the smallest kept one,
 * which goes back; 0 if it does not enter. Other policies: 1. */
HPC_INLINE int hpc_seed002_admit(const struct hpc_settings *set, struct hpc_cache *c,
                                 uint64_t usable, struct hpc_out *out) {
    if (set->policy != HPC_SEED002 || c->nkept < set->n) return 1;
    int small = 0;
    for (int i = 1; i < c->nkept; i++)
        if (c->kept[i].usable < c->kept[small].usable ||
            (c->kept[i].usable == c->kept[small].usable && c->kept[i].stamp < c->kept[small].stamp))
            small = i;
    if (usable < c->kept[small].usable) return 0;
    hpc_drop(c, small, 0, out);
    return 1;
}

/* ---- The thread's front (fronts.c) ---- */

/* The thread's front goes back to the next allocator (decay, the bound). */
HPC_INLINE void hpc_front_give_back(struct hpc_cache *c, struct hpc_thread *t, int decayed,
                                    struct hpc_out *out) {
    out->p[out->n++] = t->front.p;
    c->fronted -= t->front.usable;
    c->stats.given_back++;
    c->stats.bytes_given_back += t->front.usable;
    c->stats.decayed += (uint64_t)decayed;
    t->front.p = 0;
}

/* The front's block moves to the shared cache (hl_front_to_shared): idle blocks decay, the
 * victims make room, or it goes back. Keeps its `since`. */
HPC_INLINE void hpc_front_to_shared(const struct hpc_settings *set, struct hpc_cache *c,
                                    struct hpc_thread *t, uint64_t now, struct hpc_out *out) {
    struct hpc_block f = t->front;
    t->front.p = 0;
    c->fronted -= f.usable;
    hpc_decay(set, c, now, out);
    if (hpc_make_room(set, c, f.usable, 1, out)) {
        hpc_insert(c, f.p, f.usable, f.since);
    } else {
        out->p[out->n++] = f.p;
        c->stats.given_back++;
        c->stats.bytes_given_back += f.usable;
    }
}

/* Room under the cap for the thread's front to hold `usable` bytes (hl_reserve). */
HPC_INLINE int hpc_reserve(const struct hpc_settings *set, struct hpc_cache *c,
                           struct hpc_thread *t, uint64_t usable, struct hpc_out *out) {
    uint64_t extra = usable - t->reserved;
    if (!hpc_make_room(set, c, extra, 0, out)) return 0;
    c->front_bytes += extra;
    t->reserved = usable;
    hpc_note_peak(c);
    return 1;
}

/* ---- The bound (hl_bound, hl_bound_fronts) ---- */

/* At a miss that maps new memory: victims go back (at most HPC_OUT_MAX; then this thread's
 * front) until live + fronted + kept is within the live bytes' peak plus `peak` percent. */
HPC_INLINE void hpc_bound(const struct hpc_settings *set, struct hpc_cache *c,
                          struct hpc_thread *t, struct hpc_out *out) {
    if (c->live > c->stats.live_peak) c->stats.live_peak = c->live;
    uint64_t limit = c->stats.live_peak + c->stats.live_peak / 100 * (uint64_t)set->peak;
    uint64_t total = c->live + c->fronted + c->bytes_kept;
    uint64_t over = total > limit ? total - limit : 0;
    while (over > 0 && c->nkept > 0 && out->n < HPC_OUT_MAX) {
        int v = hpc_victim(set, c);
        over -= over < c->kept[v].usable ? over : c->kept[v].usable;
        hpc_drop(c, v, 0, out);
        c->stats.bounded++;
    }
    if (over > 0 && t->front.p) {
        uint64_t u = t->front.usable;
        hpc_front_give_back(c, t, 0, out);
        c->stats.bounded++;
        over -= over < u ? over : u;
    }
}

/* ---- On request ---- */

/* A request of n >= min bytes begins: the outgrown rule's history (hl_learn_alloc). */
HPC_INLINE void hpc_learn_alloc(struct hpc_thread *t, uint64_t n) {
    t->last_req = n;
    t->prev_p = t->last_p;
    t->last_p = 0;
}

/* guided: the thread learns a request of a large block in scope (hl_learn_request). */
HPC_INLINE void hpc_learn_request(const struct hpc_settings *set, struct hpc_thread *t,
                                  uint64_t n) {
    if (set->policy == HPC_GUIDED && t->counter) hcp_learn(t->counter, hcp_class(n));
}

/* A kept block for n bytes at an address with none of `mask`'s bits (hl_take): the thread's
 * front first, then the most recently kept block of the shared cache that fits. 1 and *got on a
 * hit (the block is live again: counted, learned); 0 on a miss (counted; the proof and the
 * regret look at it). */
HPC_INLINE int hpc_take(const struct hpc_settings *set, struct hpc_cache *c, struct hpc_thread *t,
                        uint64_t n, uintptr_t mask, uint64_t now, struct hpc_block *got,
                        struct hpc_out *out) {
    if (t->front.p) {
        if (now - t->front.since > set->decay_ns) {
            hpc_front_give_back(c, t, 1, out);
        } else if (hpc_fits(t->front.usable, n) && (t->front.p & mask) == 0) {
            *got = t->front;
            t->front.p = 0;
            c->fronted -= got->usable;
            c->live += got->usable;
            c->stats.hits++;
            hpc_learn_request(set, t, n);
            t->last_p = got->p;
            return 1;
        }
    }
    int best = -1;
    if (c->nkept > 0) {
        hpc_decay(set, c, now, out);
        for (int i = 0; i < c->nkept; i++)
            if (hpc_fits(c->kept[i].usable, n) && (c->kept[i].p & mask) == 0 &&
                (best < 0 || c->kept[i].stamp > c->kept[best].stamp))
                best = i;
    }
    if (best < 0) {
        c->stats.misses++;
        if ((!c->proven || set->regret) && c->nghost > 0) hpc_ghost_hit(set, c, n, mask);
        return 0;
    }
    *got = c->kept[best];
    c->bytes_kept -= got->usable;
    c->kept[best] = c->kept[--c->nkept];
    c->live += got->usable;
    c->stats.hits++;
    t->last_p = got->p;
    hpc_learn_request(set, t, n);
    return 1;
}

/* A block the next allocator made for a request of n >= min bytes (hl_live_track, hl_track):
 * the thread's history, and, in scope, the live bytes, the bound (a mapped block is new memory)
 * and the thread's counter. 1 if tracked (in scope). */
HPC_INLINE int hpc_track(const struct hpc_settings *set, struct hpc_cache *c, struct hpc_thread *t,
                         uintptr_t p, uint64_t usable, uint64_t n, int in_scope, int mapped,
                         struct hpc_out *out) {
    t->last_p = p;
    if (!in_scope) return 0;
    c->live += usable;
    if (set->peak >= 0 && mapped) hpc_bound(set, c, t, out);
    hpc_learn_request(set, t, n);
    return 1;
}

/* A tracked block the next allocator reallocates (realloc the cache does not serve): it leaves
 * the live bytes, nothing learned or kept. */
HPC_INLINE void hpc_untrack(struct hpc_cache *c, uint64_t usable) { c->live -= usable; }

/* ---- On free ---- */

/* guided: learn the free, then ask whether its class comes soon (hl_predict_reuse; the table's
 * call-site entries are not in the core yet). */
HPC_INLINE int hpc_predict_reuse(const struct hpc_settings *set, struct hpc_thread *t,
                                 uint64_t req) {
    unsigned cls = hcp_class(req);
    struct hcp_counter *k = t->counter;
    if (k == NULL) return 0;
    hcp_learn(k, HCP_FREE + cls);
    if (set->class_table)
        return (unsigned)set->class_table[(HCP_FREE + cls) * HCP_TOKENS + cls] *
                   (unsigned)set->topk >= 255u;
    return hcp_soon(k, cls, (unsigned)set->topk, (unsigned)set->horizon);
}

/* The policy's own rule at a free (hl_keep_at_free): keep (1) or pass on (0). */
HPC_INLINE int hpc_keep_at_free(const struct hpc_settings *set, struct hpc_cache *c,
                                struct hpc_thread *t, uint64_t req, int wanted, int unproven,
                                int *passed_by_prediction) {
    int keep = wanted;
    if (set->policy == HPC_GUIDED) {
        int soon = hpc_predict_reuse(set, t, req);
        if (!soon && set->regret && wanted && !unproven) {
            if (c->regret[hcp_class(req)] > 0) {
                soon = 1;
                c->stats.regret_keeps++;
            } else {
                *passed_by_prediction = 1;
            }
        }
        keep = soon && keep;
    }
    if (set->policy == HPC_SEED002 && set->n == 0) keep = 0;
    if (unproven) keep = 0;
    return keep;
}

/* The program frees p, a block it tracked (hpc_track, or a hit), of `usable` bytes asked for as
 * `req` (hl_free_large after the live set's lookup): the decision and its bookkeeping. */
HPC_INLINE enum hpc_fate hpc_free(const struct hpc_settings *set, struct hpc_cache *c,
                                  struct hpc_thread *t, uintptr_t p, uint64_t usable, uint64_t req,
                                  uint64_t now, struct hpc_out *out) {
    int outgrown = p == t->prev_p && t->last_req > usable;
    int wanted = usable <= set->cap && !outgrown;
    int unproven = wanted && !c->proven;
    int front = wanted && !unproven && set->fronts &&
                (usable <= t->reserved || hpc_reserve(set, c, t, usable, out));
    int by_prediction = 0;
    int keep = hpc_keep_at_free(set, c, t, req ? req : 1, wanted, unproven, &by_prediction);
    c->live -= usable;
    if (!keep) {
        if (unproven) {
            c->stats.unproven++;
            hpc_ghost_add(c, p, usable, hcp_class(req ? req : 1));
            return HPC_FREE_UNPROVEN;
        }
        if (outgrown) {
            c->stats.outgrown++;
            return HPC_FREE_OUTGROWN;
        }
        c->stats.declined++;
        if (by_prediction) hpc_ghost_add(c, p, usable, hcp_class(req ? req : 1));
        return HPC_FREE_DECLINED;
    }
    if (front) { /* hl_free_to_front: the older front block moves to the shared cache */
        struct hpc_block old = t->front;
        t->front = (struct hpc_block){p, usable, 0, now};
        c->fronted += usable;
        c->stats.kept++;
        if (old.p) {
            t->front = old;
            hpc_front_to_shared(set, c, t, now, out);
            t->front = (struct hpc_block){p, usable, 0, now};
        }
        return HPC_FREE_KEPT;
    }
    if (t->front.p) hpc_front_to_shared(set, c, t, now, out); /* hl_free_unlive */
    hpc_decay(set, c, now, out);                              /* hl_free_to_shared */
    if (hpc_seed002_admit(set, c, usable, out) && hpc_make_room(set, c, usable, 1, out)) {
        hpc_insert(c, p, usable, now);
        c->stats.kept++;
        return HPC_FREE_KEPT;
    }
    c->stats.declined++;
    return HPC_FREE_DECLINED;
}

/* A free of `usable` >= min bytes the layer did not hand out (hl_free_out_of_scope,
 * hl_free_not_live): counted; `in_scope` 0 for glibc's heap. */
HPC_INLINE enum hpc_fate hpc_free_untracked(struct hpc_cache *c, struct hpc_thread *t,
                                            uintptr_t p, uint64_t usable, int in_scope) {
    int outgrown = p == t->prev_p && t->last_req > usable;
    if (!in_scope) {
        if (outgrown) c->stats.outgrown++;
        else c->stats.heap++;
        return outgrown ? HPC_FREE_OUTGROWN : HPC_FREE_HEAP;
    }
    c->stats.untracked++;
    c->stats.declined++;
    return HPC_FREE_UNTRACKED;
}
