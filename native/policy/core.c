/* heapcast's policy core (core.h says what it is and who calls it). Included into its caller's
 * translation unit, never compiled alone. The layer's comments where each decision is called
 * (native/layers/layer/policy.c, alloc.c, free.c, fronts.c, predict.c) say why each rule is
 * there; native/layers/README.md holds the measurements. */
#include "core.h"

#define HPC_INLINE static inline __attribute__((unused))
#define HPC_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define HPC_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* A process's cache at its start: empty, proven at once where proof=0. */
HPC_INLINE void hpc_cache_init(const struct hpc_settings *set, struct hpc_cache *c) {
    *c = (struct hpc_cache){0};
    c->proven = set->proof == 0;
}

/* ---- Which kept block serves a request ---- */

/* A kept block of `usable` bytes serves a request of n bytes: at most half a block plus a page
 * wasted. */
HPC_INLINE int hpc_fits(uint64_t usable, uint64_t n) {
    return usable >= n && usable - n < n + 4096;
}

/* ... and at p, it has the alignment asked for (mask: alignment - 1, or 0). */
HPC_INLINE int hpc_serves(uintptr_t p, uint64_t usable, uint64_t n, uintptr_t mask) {
    return hpc_fits(usable, n) && (p & mask) == 0;
}

/* pools, guided: a block kept since `since` has been idle too long at `now` (decay). */
HPC_INLINE int hpc_expired(const struct hpc_settings *set, uint64_t since, uint64_t now) {
    return now - since > set->decay_ns;
}

/* ---- The thread's history: the outgrown rule ---- */

/* A request of n >= min bytes begins. */
HPC_INLINE void hpc_hist_alloc(struct hpc_history *h, uint64_t n) {
    h->last_req = n;
    h->prev_p = h->last_p;
    h->last_p = 0;
}

/* The program has just outgrown p (usable bytes): its last request was larger, and p is what
 * its request before got (a buffer grown by malloc, copy and free). */
HPC_INLINE int hpc_outgrown(const struct hpc_history *h, uintptr_t p, uint64_t usable) {
    return p == h->prev_p && h->last_req > usable;
}

/* A freed block of `usable` bytes may be kept (under the cap, not outgrown), before the policy's
 * own rule and the proof. */
HPC_INLINE int hpc_wanted(const struct hpc_settings *set, uint64_t usable, int outgrown) {
    return usable <= set->cap && !outgrown;
}

/* ---- The shared cache's bookkeeping (under the layer's hl_lock) ---- */

HPC_INLINE void hpc_note_peak(struct hpc_cache *c) {
    if (c->bytes_kept + c->front_bytes > c->stats.bytes_kept_peak)
        c->stats.bytes_kept_peak = c->bytes_kept + c->front_bytes;
}

/* A block leaves the cache for the next allocator: counted (decayed: idle past `decay`). */
HPC_INLINE void hpc_count_given_back(struct hpc_cache *c, uint64_t usable, int decayed) {
    c->stats.given_back++;
    c->stats.bytes_given_back += usable;
    c->stats.decayed += (uint64_t)decayed;
}

/* Kept block i goes back into out. */
HPC_INLINE void hpc_drop(struct hpc_cache *c, int i, int decayed, struct hpc_out *out) {
    out->p[out->n++] = c->kept[i].p;
    c->bytes_kept -= c->kept[i].usable;
    hpc_count_given_back(c, c->kept[i].usable, decayed);
    c->kept[i] = c->kept[c->nkept - 1];
    HPC_STORE(c->nkept, c->nkept - 1);
}

/* Kept block i leaves the cache (taken, or out for a while: the layer's madvise). */
HPC_INLINE struct hpc_block hpc_remove(struct hpc_cache *c, int i) {
    struct hpc_block b = c->kept[i];
    c->bytes_kept -= b.usable;
    c->kept[i] = c->kept[c->nkept - 1];
    HPC_STORE(c->nkept, c->nkept - 1);
    return b;
}

/* p enters the cache as its most recent block. */
HPC_INLINE struct hpc_block *hpc_insert(struct hpc_cache *c, uintptr_t p, uint64_t usable,
                                        uint64_t since) {
    struct hpc_block *b = &c->kept[c->nkept];
    *b = (struct hpc_block){p, usable, ++c->stamp, since, 0};
    HPC_STORE(c->nkept, c->nkept + 1);
    c->bytes_kept += usable;
    hpc_note_peak(c);
    return b;
}

/* ---- The proof and the regret ---- */

HPC_INLINE void hpc_regret_less(struct hpc_cache *c, unsigned cls) {
    int r = c->regret[cls % HPC_CLASSES];
    if (r > 0) HPC_STORE(c->regret[cls % HPC_CLASSES], r - 1);
}

HPC_INLINE int hpc_unproven(const struct hpc_cache *c) { return !HPC_LOAD(c->proven); }

HPC_INLINE void hpc_ghost_drop(struct hpc_cache *c, int i) {
    for (; i < c->nghost - 1; i++) c->ghost[i] = c->ghost[i + 1];
    HPC_STORE(c->nghost, c->nghost - 1);
}

/* A free the layer would have kept, passed on before the proof; or, after it (regret), a free
 * the prediction passed on: remembered, the oldest forgotten (after the proof: a regret less,
 * aged out unasked). Under hl_lock. */
HPC_INLINE void hpc_ghost_add(struct hpc_cache *c, uintptr_t p, uint64_t usable, unsigned cls) {
    if (c->nghost == HPC_GHOSTS) {
        if (!hpc_unproven(c)) hpc_regret_less(c, c->ghost[0].cls);
        hpc_ghost_drop(c, 0);
    }
    c->ghost[c->nghost] = (struct hpc_ghost){p, usable, cls};
    HPC_STORE(c->nghost, c->nghost + 1);
}

/* A miss the newest remembered block that fits would have served: before the proof a step
 * towards it, after it a regret for that block's class. Under hl_lock. */
HPC_INLINE void hpc_ghost_hit(const struct hpc_settings *set, struct hpc_cache *c, uint64_t n,
                              uintptr_t mask) {
    for (int i = c->nghost - 1; i >= 0; i--)
        if (hpc_serves(c->ghost[i].p, c->ghost[i].usable, n, mask)) {
            unsigned cls = c->ghost[i].cls;
            hpc_ghost_drop(c, i);
            if (hpc_unproven(c)) {
                if (++c->stats.proof_hits >= (uint64_t)set->proof) HPC_STORE(c->proven, 1);
            } else {
                c->stats.regret_hits++;
                HPC_STORE(c->regret[cls % HPC_CLASSES], HPC_REGRET);
            }
            return;
        }
}

/* A miss asks the remembered blocks only before the proof, or with the regret, and only when
 * there are some (read without the lock: the layer does not lock for nothing). */
HPC_INLINE int hpc_ghosts_asked(const struct hpc_settings *set, const struct hpc_cache *c) {
    return (hpc_unproven(c) || set->regret) && HPC_LOAD(c->nghost) > 0;
}

/* ---- Making room, the victim, decay (under hl_lock) ---- */

/* The kept block that goes back first: the oldest (largest: the smallest, the oldest of equals). */
HPC_INLINE int hpc_victim(const struct hpc_settings *set, const struct hpc_cache *c) {
    int v = 0;
    for (int i = 1; i < c->nkept; i++) {
        int older = c->kept[i].stamp < c->kept[v].stamp;
        if (set->policy == HPC_LARGEST ? c->kept[i].usable < c->kept[v].usable ||
                                             (c->kept[i].usable == c->kept[v].usable && older)
                                       : older)
            v = i;
    }
    return v;
}

/* Room under the cap for `extra` more bytes (and, with `slot`, a free entry): the victims go
 * back until there is (at most HPC_OUT_MAX a call); 1 if there is. */
HPC_INLINE int hpc_make_room(const struct hpc_settings *set, struct hpc_cache *c, uint64_t extra,
                             int slot, struct hpc_out *out) {
#define HPC_FULL                                                                                  \
    (c->bytes_kept + c->front_bytes + extra > set->cap || (slot && c->nkept >= HPC_MAX_KEPT))
    while (c->nkept > 0 && out->n < HPC_OUT_MAX && HPC_FULL)
        hpc_drop(c, hpc_victim(set, c), 0, out);
    return !HPC_FULL;
#undef HPC_FULL
}

/* pools, guided: blocks idle longer than `decay` go back (with the regret, a regret less for
 * each: kept for nothing). */
HPC_INLINE void hpc_decay(const struct hpc_settings *set, struct hpc_cache *c, uint64_t now,
                          struct hpc_out *out) {
    if (set->policy == HPC_LARGEST) return;
    for (int i = 0; i < c->nkept && out->n < HPC_OUT_MAX;) {
        if (hpc_expired(set, c->kept[i].since, now)) {
            if (set->regret) hpc_regret_less(c, hcp_class(c->kept[i].usable));
            hpc_drop(c, i, 1, out);
        } else {
            i++;
        }
    }
}

/* largest: with n kept, a block enters only if at least as large as the smallest kept one,
 * which goes back; 0 if it does not enter. Other policies: 1. */
HPC_INLINE int hpc_largest_admit(const struct hpc_settings *set, struct hpc_cache *c,
                                 uint64_t usable, struct hpc_out *out) {
    if (set->policy != HPC_LARGEST || c->nkept < set->n) return 1;
    int small = 0;
    for (int i = 1; i < c->nkept; i++)
        if (c->kept[i].usable < c->kept[small].usable ||
            (c->kept[i].usable == c->kept[small].usable && c->kept[i].stamp < c->kept[small].stamp))
            small = i;
    if (usable < c->kept[small].usable) return 0;
    hpc_drop(c, small, 0, out);
    return 1;
}

/* ---- The shared cache's decisions on a request, a free, a front (under hl_lock) ---- */

/* A request of n bytes at mask's alignment: idle blocks decay, then the most recently kept block
 * that serves it leaves the cache into *got (a hit, counted); 0: none (the caller counts the
 * miss: the layer asks the other threads' fronts first). */
HPC_INLINE int hpc_take_shared(const struct hpc_settings *set, struct hpc_cache *c, uint64_t n,
                               uintptr_t mask, uint64_t now, struct hpc_block *got,
                               struct hpc_out *out) {
    hpc_decay(set, c, now, out);
    int best = -1;
    for (int i = 0; i < c->nkept; i++)
        if (hpc_serves(c->kept[i].p, c->kept[i].usable, n, mask) &&
            (best < 0 || c->kept[i].stamp > c->kept[best].stamp))
            best = i;
    if (best < 0) return 0;
    *got = hpc_remove(c, best);
    c->stats.hits++;
    return 1;
}

/* A freed block the policy keeps enters the shared cache: idle blocks decay, largest's rule and
 * the cap make room (victims into out); 1 if kept (counted), 0 if it goes to the next
 * allocator (the caller counts it declined). */
HPC_INLINE struct hpc_block *hpc_keep_shared(const struct hpc_settings *set, struct hpc_cache *c,
                                             uintptr_t p, uint64_t usable, uint64_t now,
                                             struct hpc_out *out) {
    hpc_decay(set, c, now, out);
    if (!hpc_largest_admit(set, c, usable, out) || !hpc_make_room(set, c, usable, 1, out))
        return NULL;
    c->stats.kept++;
    return hpc_insert(c, p, usable, now);
}

/* A thread's front block f moves to the shared cache (a newer block takes its place, or the
 * thread exits): idle blocks decay, the victims make room, or it goes back into out. Keeps its
 * `since`. */
HPC_INLINE void hpc_enter_shared(const struct hpc_settings *set, struct hpc_cache *c,
                                 const struct hpc_block *f, uint64_t now, struct hpc_out *out) {
    hpc_decay(set, c, now, out);
    if (hpc_make_room(set, c, f->usable, 1, out)) {
        hpc_insert(c, f->p, f->usable, f->since);
    } else {
        out->p[out->n++] = f->p;
        hpc_count_given_back(c, f->usable, 0);
    }
}

/* Room under the cap for a thread's front to hold `usable` bytes: its reservation (*reserved,
 * its share of front_bytes) grows to that, victims going back if needed; 1 if reserved. */
HPC_INLINE int hpc_reserve(const struct hpc_settings *set, struct hpc_cache *c, uint64_t *reserved,
                           uint64_t usable, struct hpc_out *out) {
    uint64_t extra = usable - *reserved;
    if (!hpc_make_room(set, c, extra, 0, out)) return 0;
    c->front_bytes += extra;
    *reserved = usable;
    hpc_note_peak(c);
    return 1;
}

/* The bound, at a miss that maps new memory: the live bytes' peak taken, then victims go back
 * (counted bounded; at most HPC_OUT_MAX) until live + fronted + kept is within that peak plus
 * `peak` percent. Returns the bytes still over: the fronts' blocks go next (the caller's). */
HPC_INLINE uint64_t hpc_bound_shared(const struct hpc_settings *set, struct hpc_cache *c,
                                     uint64_t live, uint64_t fronted, struct hpc_out *out) {
    if (live > c->stats.live_peak) c->stats.live_peak = live;
    uint64_t limit = c->stats.live_peak + c->stats.live_peak / 100 * (uint64_t)set->peak;
    uint64_t total = live + fronted + c->bytes_kept;
    uint64_t over = total > limit ? total - limit : 0;
    while (over > 0 && c->nkept > 0 && out->n < HPC_OUT_MAX) {
        int v = hpc_victim(set, c);
        over -= over < c->kept[v].usable ? over : c->kept[v].usable;
        hpc_drop(c, v, 0, out);
        c->stats.bounded++;
    }
    return over;
}

/* ---- The prediction (guided; the thread's own counter, no lock) ---- */

/* guided: the thread's counter learns a request of a large block in scope (a hit, or a block
 * tracked in scope: the only ones it can keep). */
HPC_INLINE void hpc_learn_request(const struct hpc_settings *set, struct hcp_counter *k,
                                  uint64_t n) {
    if (set->policy == HPC_GUIDED && k) hcp_learn(k, hcp_class(n));
}

/* guided: the thread's counter learns the free (class of req), then is asked whether its class
 * comes soon: a table's call-site entry where the caller found one (site_score >= 0, the
 * layer's hl_site_score), else a table's class score (class_table), else the counter itself. */
HPC_INLINE int hpc_predict_reuse(const struct hpc_settings *set, struct hcp_counter *k,
                                 uint64_t req, int site_score) {
    unsigned cls = hcp_class(req);
    if (k == NULL) return 0;
    hcp_learn(k, HCP_FREE + cls);
    if (site_score >= 0) return (unsigned)site_score * (unsigned)set->topk >= 255u;
    if (set->class_table)
        return (unsigned)set->class_table[(HCP_FREE + cls) * HCP_TOKENS + cls] *
                   (unsigned)set->topk >= 255u;
    return hcp_soon(k, cls, (unsigned)set->topk, (unsigned)set->horizon);
}

/* Keep (1) or pass on (0) a freed block asked for as req: `wanted` (hpc_wanted, in scope) and
 * `unproven` (before the proof nothing is kept). guided asks the prediction; with the regret,
 * the process's regrets for the class overrule a "no" (*passed_by_prediction set when none did:
 * the free is remembered). largest with n=0 keeps nothing. Reads the regrets without hl_lock. */
HPC_INLINE int hpc_keep_at_free(const struct hpc_settings *set, struct hpc_cache *c,
                                struct hcp_counter *k, uint64_t req, int site_score, int wanted,
                                int unproven, int *passed_by_prediction) {
    int keep = wanted;
    if (set->policy == HPC_GUIDED) {
        int soon = hpc_predict_reuse(set, k, req, site_score);
        if (!soon && set->regret && wanted && !unproven) {
            if (HPC_LOAD(c->regret[hcp_class(req) % HPC_CLASSES]) > 0) {
                soon = 1;
                __atomic_fetch_add(&c->stats.regret_keeps, 1, __ATOMIC_RELAXED);
            } else {
                *passed_by_prediction = 1;
            }
        }
        keep = soon && keep;
    }
    if (set->policy == HPC_LARGEST && set->n == 0) keep = 0;
    if (unproven) keep = 0;
    return keep;
}

/* ================ The whole calls, for the replay (one thread at a time) ================ */

/* The thread's front goes back to the next allocator (decay, the bound). */
HPC_INLINE void hpc_front_give_back(struct hpc_cache *c, struct hpc_thread *t, int decayed,
                                    struct hpc_out *out) {
    out->p[out->n++] = t->front.p;
    c->fronted -= t->front.usable;
    hpc_count_given_back(c, t->front.usable, decayed);
    t->front.p = 0;
}

/* The front's block moves to the shared cache (fronts.c hl_front_to_shared). */
HPC_INLINE void hpc_front_to_shared(const struct hpc_settings *set, struct hpc_cache *c,
                                    struct hpc_thread *t, uint64_t now, struct hpc_out *out) {
    struct hpc_block f = t->front;
    t->front.p = 0;
    c->fronted -= f.usable;
    hpc_enter_shared(set, c, &f, now, out);
}

/* The bound at a miss that maps new memory (alloc.c hl_bound, fronts.c hl_bound_fronts: this
 * thread's front only; the replay has no other thread's at hand). */
HPC_INLINE void hpc_bound(const struct hpc_settings *set, struct hpc_cache *c,
                          struct hpc_thread *t, struct hpc_out *out) {
    uint64_t over = hpc_bound_shared(set, c, c->live, c->fronted, out);
    if (over > 0 && t->front.p) {
        hpc_front_give_back(c, t, 0, out);
        c->stats.bounded++;
    }
}

/* A request of n >= min bytes begins (alloc.c hl_malloc_large). */
HPC_INLINE void hpc_learn_alloc(struct hpc_thread *t, uint64_t n) { hpc_hist_alloc(&t->hist, n); }


/* A front's block (the thread's own, or another's: fronts.c hl_steal) serves a request: out
 * of the front, counted a hit. */
HPC_INLINE void hpc_front_take(struct hpc_cache *c, struct hpc_thread *owner,
                               struct hpc_block *got) {
    *got = owner->front;
    owner->front.p = 0;
    c->fronted -= got->usable;
    c->stats.hits++;
}

/* A kept block for n bytes at mask's alignment (alloc.c hl_take, before the other threads'
 * fronts): the thread's front first, then the shared cache. 1 and *got on a hit (hpc_hit
 * follows); 0: nothing here (the caller asks other fronts, then counts the miss: hpc_miss). */
HPC_INLINE int hpc_take(const struct hpc_settings *set, struct hpc_cache *c, struct hpc_thread *t,
                        uint64_t n, uintptr_t mask, uint64_t now, struct hpc_block *got,
                        struct hpc_out *out) {
    if (t->front.p) {
        if (hpc_expired(set, t->front.since, now)) {
            hpc_front_give_back(c, t, 1, out);
        } else if (hpc_serves(t->front.p, t->front.usable, n, mask)) {
            hpc_front_take(c, t, got);
            return 1;
        }
    }
    return c->nkept > 0 && hpc_take_shared(set, c, n, mask, now, got, out);
}

/* A request served from the cache: the block is live again, the thread's history and counter
 * learn it. */
HPC_INLINE void hpc_hit(const struct hpc_settings *set, struct hpc_cache *c, struct hpc_thread *t,
                        const struct hpc_block *got, uint64_t n) {
    c->live += got->usable;
    t->hist.last_p = got->p;
    hpc_learn_request(set, t->counter, n);
}

/* Nothing served the request: a miss, counted; the proof and the regret look at it. */
HPC_INLINE void hpc_miss(const struct hpc_settings *set, struct hpc_cache *c, uint64_t n,
                         uintptr_t mask) {
    c->stats.misses++;
    if (hpc_ghosts_asked(set, c)) hpc_ghost_hit(set, c, n, mask);
}

/* The thread exits (fronts.c hl_front_flush): its front's block joins the shared cache, its
 * reservation is freed. */
HPC_INLINE void hpc_thread_exit(const struct hpc_settings *set, struct hpc_cache *c,
                                struct hpc_thread *t, uint64_t now, struct hpc_out *out) {
    if (t->front.p) hpc_front_to_shared(set, c, t, now, out);
    c->front_bytes -= t->reserved;
    t->reserved = 0;
}

/* A block the next allocator made for a request of n >= min bytes (alloc.c hl_track): the
 * thread's history, and, in scope, the live bytes, the bound (a mapped block is new memory) and
 * the thread's counter. 1 if tracked (in scope). */
HPC_INLINE int hpc_track(const struct hpc_settings *set, struct hpc_cache *c, struct hpc_thread *t,
                         uintptr_t p, uint64_t usable, uint64_t n, int in_scope, int mapped,
                         struct hpc_out *out) {
    t->hist.last_p = p;
    if (!in_scope) return 0;
    c->live += usable;
    if (set->peak >= 0 && mapped) hpc_bound(set, c, t, out);
    hpc_learn_request(set, t->counter, n);
    return 1;
}

/* A tracked block the next allocator reallocates (realloc the cache does not serve): it leaves
 * the live bytes, nothing learned or kept. */
HPC_INLINE void hpc_untrack(struct hpc_cache *c, uint64_t usable) { c->live -= usable; }

/* The program frees p, a block it tracked, of `usable` bytes asked for as `req` (free.c
 * hl_free_large after the live set's lookup): the decision and its bookkeeping. `site_score`:
 * the table's entry at the free's (call site, class of req), as the layer's hl_site_score
 * answers it; -1: none (the counter, or the class scores, answer). */
HPC_INLINE enum hpc_fate hpc_free(const struct hpc_settings *set, struct hpc_cache *c,
                                  struct hpc_thread *t, uintptr_t p, uint64_t usable, uint64_t req,
                                  int site_score, uint64_t now, struct hpc_out *out) {
    int outgrown = hpc_outgrown(&t->hist, p, usable);
    int wanted = hpc_wanted(set, usable, outgrown);
    int unproven = wanted && hpc_unproven(c);
    int front = wanted && !unproven && set->fronts &&
                (usable <= t->reserved || hpc_reserve(set, c, &t->reserved, usable, out));
    int by_prediction = 0;
    req = req ? req : 1;
    int keep =
        hpc_keep_at_free(set, c, t->counter, req, site_score, wanted, unproven, &by_prediction);
    c->live -= usable;
    if (!keep) {
        if (unproven) {
            c->stats.unproven++;
            hpc_ghost_add(c, p, usable, hcp_class(req));
            return HPC_FREE_UNPROVEN;
        }
        if (outgrown) {
            c->stats.outgrown++;
            return HPC_FREE_OUTGROWN;
        }
        c->stats.declined++;
        if (by_prediction) hpc_ghost_add(c, p, usable, hcp_class(req));
        return HPC_FREE_DECLINED;
    }
    if (front) { /* free.c hl_free_to_front: the older front block moves to the shared cache */
        struct hpc_block old = t->front;
        t->front = (struct hpc_block){p, usable, 0, now, 0};
        c->fronted += usable;
        c->stats.kept++;
        if (old.p) {
            c->fronted -= old.usable;
            hpc_enter_shared(set, c, &old, now, out);
        }
        return HPC_FREE_KEPT;
    }
    if (t->front.p) hpc_front_to_shared(set, c, t, now, out); /* free.c hl_free_unlive */
    if (hpc_keep_shared(set, c, p, usable, now, out)) return HPC_FREE_KEPT;
    c->stats.declined++;
    return HPC_FREE_DECLINED;
}

/* A free of `usable` >= min bytes the layer did not hand out (free.c hl_free_out_of_scope,
 * hl_free_not_live): counted; `in_scope` 0 for glibc's heap. */
HPC_INLINE enum hpc_fate hpc_free_untracked(struct hpc_cache *c, struct hpc_thread *t,
                                            uintptr_t p, uint64_t usable, int in_scope) {
    int outgrown = hpc_outgrown(&t->hist, p, usable);
    if (!in_scope) {
        if (outgrown) c->stats.outgrown++;
        else c->stats.heap++;
        return outgrown ? HPC_FREE_OUTGROWN : HPC_FREE_HEAP;
    }
    c->stats.untracked++;
    c->stats.declined++;
    return HPC_FREE_UNTRACKED;
}
