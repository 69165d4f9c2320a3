/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The policy's decisions, apart from the locks and bookkeeping around them, so that one policy
 * core can later serve the layer and the what-if simulator alike (tasks/whatif/simulate.py
 * replays these rules today). The decisions:
 *  - on request: hl_fits (which kept block serves a request; alloc.c's hl_take takes the most
 *    recent that fits), and hl_learn_alloc (the outgrown rule's history);
 *  - on free: hl_in_scope, hl_outgrown, hl_wanted, hl_keep_at_free (with predict.c's
 *    hl_predict_reuse for guided), hl_seed002_admit, and, making room, hl_make_room and
 *    hl_victim;
 *  - as time passes: hl_decay (idle blocks go back), hl_advise_idle (idle blocks' pages are
 *    advised), hl_bound (at a miss that maps new memory), and the proof and the regret
 *    (hl_ghost_add at a free passed on, hl_ghost_hit at a miss).
 * What a decision sees: the settings (hl_set), the shared cache (cache.c), the live set's byte
 * counts (live.c), the thread's history; the callers hold the locks each names. */

/* ---- What may be kept: scope (on free) ---- */

/* Scope: glibc serves a block from its heap (below its mmap threshold, which follows the
 * largest freed mmapped block: hl_follow) or with a fresh mmap, unmapped at its free. Only the
 * second costs what a cache saves (the syscalls and a fault per page); a heap block glibc reuses
 * itself cheaply, for any size, and the same block held in the cache is memory glibc cannot
 * use for anything else (kept, heap blocks made programs hold more memory than under glibc for
 * no time gained: ../../README.md, History). So by default (scope=mapped) the layer keeps only
 * blocks glibc made by mmap (IS_MMAPPED, bit 1 of the size word before the block: glibc's chunk
 * layout), when the next allocator is glibc's (__libc_malloc); over another allocator it cannot
 * tell, and keeps any. scope=all keeps heap blocks too (a
 * thread-per-connection server's blocks then cross arenas through the cache). */
static int hl_glibc_next;
static int hl_trimmed; /* glibc lowered its break at a large free the layer passed on */

/* glibc's size word before a block: its chunk's size, header included, in all but the 3 low
 * bits, which are flags (2: IS_MMAPPED). Read only when the next allocator is glibc's. */
static inline size_t hl_chunk_word(const void *p) { return ((const size_t *)p)[-1]; }

/* p is memory of its own mapping (over another allocator the layer cannot tell: as if so) */
static inline int hl_mapped(const void *p) {
    return !hl_glibc_next || (hl_chunk_word(p) & 2) != 0;
}

/* A decision, on free (and at tracking, alloc.c): p may be kept at all. Scope only widens
 * (hl_trimmed), so a block out of scope at its free was out of scope when made. */
static inline int hl_in_scope(const void *p) {
    return hl_set.scope_all || hl_mapped(p) || __atomic_load_n(&hl_trimmed, __ATOMIC_RELAXED);
}

/* A large free the layer does not keep goes to the next allocator. glibc may then give heap
 * memory back too: when its top grows past the trim threshold it lowers the break (sbrk), and the
 * next blocks are faulted in again, page by page, as mmapped ones are: a training loop freeing its
 * large tensors together pays that at every step (seed 001's case). So once glibc has trimmed at
 * such a free, its heap blocks are in scope too. sbrk(0) reads glibc's copy of the break (no
 * syscall); another thread moving it meanwhile can only turn scope on early. Thread arenas shrink
 * their heaps without the break and are not seen: their blocks stay glibc's. */
static void hl_pass_free(void *p) {
    void *brk0 = hl_glibc_next && !hl_trimmed ? sbrk(0) : NULL;
    hc_real.free(p);
    if (brk0 != NULL && (char *)sbrk(0) < (char *)brk0)
        __atomic_store_n(&hl_trimmed, 1, __ATOMIC_RELAXED);
}

/* ---- The outgrown rule (on request, on free) ---- */

/* Outgrown: the thread's last request was larger than the block freed, and that block is what
 * its request before got: the program grows a buffer by malloc, copy and free (strings,
 * vectors, hash tables). The block cannot serve that size, and the next step asks for more
 * still: kept, such blocks are not reused (../../README.md, History). The thread's last
 * request >= min, and the blocks its last two such requests got (NULL: not yet, or none). */
static __thread size_t hl_last_req;
static __thread void *hl_last_p, *hl_prev_p;

/* A request >= min begins: the outgrown rule's history. */
static inline void hl_learn_alloc(size_t req) {
    hl_last_req = req;
    hl_prev_p = hl_last_p;
    hl_last_p = NULL;
}

/* A decision, on free: the program has just outgrown p (usable bytes). */
static inline int hl_outgrown(const void *p, size_t usable) {
    return p == hl_prev_p && hl_last_req > usable;
}

/* A decision, on free: a block of `usable` bytes may be kept (under the cap, not outgrown),
 * before the policy's own rule (hl_keep_at_free) and the proof. */
static inline int hl_wanted(size_t usable, int outgrown) {
    return usable <= hl_set.cap && !outgrown;
}

/* ---- Which kept block serves a request ---- */

/* A decision, on request: a kept block of `usable` bytes serves a request of n bytes (at most
 * half a block plus a page wasted). The request path (alloc.c) takes the most recently kept
 * block that fits and has the alignment asked for: the thread's front, then the shared cache,
 * then another thread's front. */
static inline int hl_fits(size_t usable, size_t n) { return usable >= n && usable - n < n + 4096; }

/* ---- The proof and the regret ---- */

/* The proof. A cache pays only where the program asks again for what it freed, and a program
 * that seldom does pays for the blocks the layer keeps anyway (../../README.md, History). So the
 * layer keeps nothing until the process has made `proof` (2) requests that a large block it passed
 * on could have served: until then, each free it would have kept goes to the next allocator and is
 * remembered (its address and usable size, the last HL_GHOSTS), and each miss looks for a
 * remembered block that fits by the cache's own rule (hl_fits, the alignment). Where the proof
 * never comes, the layer has stepped aside on its own (the stats: proven=0), and the program holds
 * what it would under glibc. Where it comes, the first `proof` reuses are glibc's. ARC's ghost
 * lists and TinyLFU's doorkeeper admit blocks on the same kind of evidence. Process-wide, under
 * hl_lock (only until proven); tasks/whatif/simulate.py replays it.
 *
 * The regret (guided, regret=1; off by default, not replayed by the simulator). The thread's
 * counter answers from the freeing thread's own calls, and a block freed by a thread that never
 * asks for one is passed on every time (a reader thread's chunks freed by the main thread:
 * ../../README.md, History), and a program no table knows has nothing else. So after
 * the proof the frees the prediction passed on are remembered the same way, and a miss one of
 * them would have served is a regret of the process for that block's size class: the class's
 * next HL_REGRET frees are kept whatever the thread's counter says. A remembered block that ages
 * out of the list unasked, or a kept block given back idle (decay), takes one back. What the
 * process as a whole asks for, learnt from its own misses, as an allocator can: no training. */
#define HL_GHOSTS 8
#define HL_REGRET 4
static struct {
    uintptr_t p;
    size_t usable;
    unsigned cls; /* the freed block's size class (its request's) */
} hl_ghost[HL_GHOSTS]; /* oldest first */
static int hl_nghost; /* changed under hl_lock, read without it by a miss (hl_take) */
static int hl_proven; /* read without the lock: a stale 0 remembers one more block */
static uint64_t hl_proof_hits;
/* per size class: frees to keep on the process's regrets; written under hl_lock, read without */
static int hl_regret[HL_CLASSES];
static uint64_t hl_regret_hits, hl_regret_keeps;

static inline void hl_regret_less(unsigned cls) { /* under hl_lock */
    int r = hl_regret[cls % HL_CLASSES];
    if (r > 0) __atomic_store_n(&hl_regret[cls % HL_CLASSES], r - 1, __ATOMIC_RELAXED);
}

static inline int hl_unproven(void) { return !__atomic_load_n(&hl_proven, __ATOMIC_RELAXED); }

static void hl_ghost_drop(int i) {
    int n = hl_nghost - 1;
    for (; i < n; i++) hl_ghost[i] = hl_ghost[i + 1];
    __atomic_store_n(&hl_nghost, n, __ATOMIC_RELAXED);
}

/* As time passes (the proof, the regret): a free the layer would have kept, passed on before the
 * proof; or, after it (regret=1), a free the prediction passed on */
static void hl_ghost_add(const void *p, size_t usable, unsigned cls) {
    hl_lock_take();
    if (hl_nghost == HL_GHOSTS) {
        if (!hl_unproven()) hl_regret_less(hl_ghost[0].cls); /* aged out, never asked for */
        hl_ghost_drop(0);
    }
    hl_ghost[hl_nghost].p = (uintptr_t)p;
    hl_ghost[hl_nghost].usable = usable;
    hl_ghost[hl_nghost].cls = cls;
    __atomic_store_n(&hl_nghost, hl_nghost + 1, __ATOMIC_RELAXED);
    hl_lock_give();
}

/* As time passes (the proof, the regret): a miss the most recent remembered block that fits would
 * have served: before the proof, a step towards it; after it, a regret for that block's class */
static void hl_ghost_hit(size_t n, uintptr_t mask) {
    hl_lock_take();
    for (int i = hl_nghost - 1; i >= 0; i--)
        if (hl_fits(hl_ghost[i].usable, n) && (hl_ghost[i].p & mask) == 0) {
            unsigned cls = hl_ghost[i].cls;
            hl_ghost_drop(i);
            if (hl_unproven()) {
                if (++hl_proof_hits >= (uint64_t)hl_set.proof)
                    __atomic_store_n(&hl_proven, 1, __ATOMIC_RELAXED);
            } else {
                hl_regret_hits++;
                __atomic_store_n(&hl_regret[cls % HL_CLASSES], HL_REGRET, __ATOMIC_RELAXED);
            }
            break;
        }
    hl_lock_give();
}

/* ---- What to keep at a free, and what goes back to make room ---- */

/* A decision, on free, of the block's policy: keep it (1) or pass it on (0). `wanted`: in scope
 * and hl_wanted; `unproven`: before the proof (nothing is kept). guided asks the thread's
 * predictor (hl_predict_reuse: learns the free first; *sited counts the frees a call-site entry
 * answered), and with regret=1 the process's regrets for the class overrule a "no"
 * (*passed_by_prediction set when none did: the free is remembered, hl_ghost_add). seed002
 * with n=0 keeps nothing. Called under the block's shard lock (which covers *sited). */
static inline int hl_keep_at_free(size_t req, int site, int wanted, int unproven, uint64_t *sited,
                                  int *passed_by_prediction) {
    int keep = wanted;
    if (hl_set.policy == HL_GUIDED) { /* this thread's */
        int by_site = 0;
        int soon = hl_predict_reuse(req, site, &by_site);
        *sited += (uint64_t)by_site; /* the caller holds the counter's lock: no atomic */
        if (!soon && hl_set.regret && wanted && !unproven) {
            /* the process's regrets for the class (hl_regret) overrule the thread's counter */
            if (__atomic_load_n(&hl_regret[hcp_class(req)], __ATOMIC_RELAXED) > 0) {
                soon = 1;
                __atomic_fetch_add(&hl_regret_keeps, 1, __ATOMIC_RELAXED);
            } else {
                *passed_by_prediction = 1;
            }
        }
        keep = soon && keep;
    }
    if (hl_set.policy == HL_SEED002 && hl_set.n == 0) keep = 0;
    if (unproven) keep = 0;
    return keep;
}

/* A decision, on free (seed002): with n blocks kept, the freed block of `usable` bytes enters
 * only if it is at least as large as the smallest kept one (the oldest of equals), which goes
 * back into out; 0 if it is smaller (not kept). Other policies: 1. Under hl_lock. */
static inline int hl_seed002_admit(size_t usable, struct hl_out *out) {
    if (hl_set.policy == HL_SEED002 && hl_nkept >= hl_set.n) {
        int small = 0;
        for (int i = 1; i < hl_nkept; i++)
            if (hl_kept[i].usable < hl_kept[small].usable ||
                (hl_kept[i].usable == hl_kept[small].usable &&
                 hl_kept[i].stamp < hl_kept[small].stamp))
                small = i;
        if (usable >= hl_kept[small].usable) {
            out->p[out->n++] = hl_kept[small].p;
            hl_drop(small, 0);
        } else {
            return 0;
        }
    }
    return 1;
}

/* A decision, making room: the index of the kept block that goes back first: the oldest (seed002:
 * the smallest, the oldest of equals, as tasks/whatif/simulate.py replays it). hl_nkept > 0, under
 * hl_lock. */
static int hl_victim(void) {
    int v = 0;
    for (int i = 1; i < hl_nkept; i++) {
        int older = hl_kept[i].stamp < hl_kept[v].stamp;
        if (hl_set.policy == HL_SEED002 ? hl_kept[i].usable < hl_kept[v].usable ||
                                              (hl_kept[i].usable == hl_kept[v].usable && older)
                                        : older)
            v = i;
    }
    return v;
}

/* A decision, making room: room under the cap for `extra` more bytes (and, with `slot`, a free
 * entry in hl_kept): the oldest kept blocks (seed002: the smallest) go back into out until there
 * is; 1 if there is. Under hl_lock. */
static int hl_make_room(size_t extra, int slot, struct hl_out *out) {
#define HL_FULL (hl_bytes_kept + hl_front_bytes + extra > hl_set.cap || (slot && hl_nkept >= HL_MAX_KEPT))
    while (hl_nkept > 0 && out->n < HL_OUT_MAX && HL_FULL) {
        int v = hl_victim();
        out->p[out->n++] = hl_kept[v].p;
        hl_drop(v, 0);
    }
    return !HL_FULL;
#undef HL_FULL
}

/* ---- As time passes: decay, advice, the bound ---- */

/* A decision, as time passes (seed001, guided): blocks idle longer than `decay` go back (at most
 * HL_OUT_MAX per call). */
static void hl_decay(struct hl_out *out, uint64_t now) {
    if (hl_set.policy == HL_SEED002) return;
    for (int i = 0; i < hl_nkept && out->n < HL_OUT_MAX;) {
        if (now - hl_kept[i].since > hl_set.decay_ns) {
            out->p[out->n++] = hl_kept[i].p;
            if (hl_set.regret) hl_regret_less(hcp_class(hl_kept[i].usable)); /* kept for nothing */
            hl_drop(i, 1);
        } else {
            i++;
        }
    }
}

static uint64_t hl_advise_at; /* the next scan for idle blocks to advise (under hl_lock) */

/* A decision, as time passes: madv > 0: the pages of blocks kept idle for `madv` ms are
 * madvise(MADV_FREE)d, a few per call, at most every madv/2 ms (lazily: a block reused at once, the
 * tight loop, never pays the syscall and its TLB flush). A block being advised is out of the cache
 * meanwhile, so no other thread can take it while the kernel may still drop its pages. */
static void hl_advise_idle(uint64_t now) {
    if (hl_set.madv_ns <= 0 || now < __atomic_load_n(&hl_advise_at, __ATOMIC_RELAXED)) return;
    struct hl_kept todo[4];
    int n = 0;
    hl_lock_take();
    if (now >= hl_advise_at) {
        hl_advise_at = now + (uint64_t)hl_set.madv_ns / 2;
        for (int i = 0; i < hl_nkept && n < 4;) {
            if (!hl_kept[i].advised && now - hl_kept[i].since >= (uint64_t)hl_set.madv_ns) {
                todo[n++] = hl_kept[i];
                hl_bytes_kept -= hl_kept[i].usable;
                hl_kept[i] = hl_kept[--hl_nkept];
            } else {
                i++;
            }
        }
    }
    hl_lock_give();
    if (n == 0) return;
    for (int i = 0; i < n; i++) hl_madvise(todo[i].p, todo[i].usable);
    struct hl_out out = {0};
    hl_lock_take();
    for (int i = 0; i < n; i++) {
        if (hl_nkept < HL_MAX_KEPT && hl_bytes_kept + todo[i].usable <= hl_set.cap) {
            todo[i].advised = 1;
            hl_kept[hl_nkept++] = todo[i];
            hl_bytes_kept += todo[i].usable;
        } else { /* the cache filled up meanwhile: give it back */
            out.p[out.n++] = todo[i].p;
            hl_stats.given_back++;
            hl_stats.bytes_given_back += todo[i].usable;
        }
    }
    hl_lock_give();
    hl_release(&out);
}

/* A decision, as time passes (at a miss that maps new memory): the cache's bound on the
 * program's footprint. Under glibc, a mapped block's memory goes back
 * at its free: the program's large blocks take what is live of them, at most their peak, and
 * whatever the cache keeps comes on top of that: without a bound, a training step's freed
 * tensors are kept while the next step's grow beside them (../../README.md, History). So at a
 * miss that maps a block (new memory: hl_track), the oldest kept blocks
 * (seed002: the smallest) go back until live + kept (fronts included) is within the live
 * blocks' peak so far plus `peak` percent (at most HL_OUT_MAX a call; the next miss goes on). A
 * hit or a keep only moves a block between live and kept: the sum grows at such a miss alone.
 * The shards' counts are read without their locks (a count a moment old moves the bound by a
 * block). When the shared cache is not enough, the threads' fronts give theirs back too
 * (hl_bound_fronts). Not counted on either side: blocks below `min`, and glibc's heap. The
 * high-water mark of live blocks is taken at these misses: the bound can only be stricter. */
static void hl_bound_fronts(size_t over); /* fronts.c */
static void hl_bound(void) {
    struct hl_out out = {0};
    hl_lock_take();
    size_t live = 0, fronted = 0;
    for (int i = 0; i < HL_SHARDS; i++) {
        live += __atomic_load_n(&hl_shards[i].live, __ATOMIC_RELAXED);
        fronted += __atomic_load_n(&hl_shards[i].fronted, __ATOMIC_RELAXED);
    }
    if (live > hl_stats.live_peak) hl_stats.live_peak = live;
    size_t limit = hl_stats.live_peak + hl_stats.live_peak / 100 * (size_t)hl_set.peak;
    size_t total = live + fronted + hl_bytes_kept;
    size_t over = total > limit ? total - limit : 0;
    while (over > 0 && hl_nkept > 0 && out.n < HL_OUT_MAX) {
        int v = hl_victim();
        over -= over < hl_kept[v].usable ? over : hl_kept[v].usable;
        out.p[out.n++] = hl_kept[v].p;
        hl_drop(v, 0);
        HL_COUNT(bounded);
    }
    hl_lock_give();
    hl_release(&out);
    if (over > 0 && hl_sharded) hl_bound_fronts(over);
}
