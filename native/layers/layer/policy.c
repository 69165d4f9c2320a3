/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Where the layer asks the policy core (../../policy/core.c) for its decisions, and what it
 * decides itself from what only a process can see. Every rule of the policies is the core's, the
 * one implementation the what-if replay runs too (tasks/whatif/policy_core.py); the layer holds
 * the locks each names and moves the blocks:
 *  - on request: hpc_hist_alloc (the outgrown rule's history), hpc_serves (a block serves a
 *    request: alloc.c's front, hpc_take_shared, fronts.c's hl_steal), the proof and the regret
 *    at a miss (hpc_ghost_hit);
 *  - on free: scope (below: glibc's chunk word), hpc_outgrown, hpc_wanted, hpc_keep_at_free
 *    (guided: with the table's call-site score, predict.c), hpc_keep_shared (largest's rule, the
 *    cap, the victims), hpc_reserve and hpc_enter_shared (fronts.c), hpc_ghost_add;
 *  - as time passes: hpc_expired and hpc_decay, the bound (hpc_bound_shared), and the layer's own
 *    advice to the kernel on idle blocks' pages (hl_advise_idle: no decision of what is kept).
 * What a decision sees: the settings (hl_core), the shared cache (hl_cache), the live set's
 * byte counts (live.c), the thread's history (hl_hist). */

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
 * large tensors together pays that at every step. So once glibc has trimmed at such a free, its
 * heap blocks are in scope too. sbrk(0) reads glibc's copy of the break (no syscall); another
 * thread moving it meanwhile can only turn scope on early. Thread arenas shrink their heaps
 * without the break and are not seen: their blocks stay glibc's. */
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
 * still: kept, such blocks are not reused (../../README.md, History). The thread's history:
 * its last request >= min, and the blocks its last two such requests got. */
static __thread struct hpc_history hl_hist;

static inline void hl_learn_alloc(size_t req) { hpc_hist_alloc(&hl_hist, req); }

/* ---- The proof and the regret ---- */

/* The proof. A cache pays only where the program asks again for what it freed, and a program
 * that seldom does pays for the blocks the layer keeps anyway (../../README.md, History). So the
 * layer keeps nothing until the process has made `proof` (2) requests that a large block it passed
 * on could have served: until then, each free it would have kept goes to the next allocator and is
 * remembered (its address and usable size, the last HPC_GHOSTS), and each miss looks for a
 * remembered block that serves it (hpc_ghost_hit). Where the proof never comes, the layer has
 * stepped aside on its own (the stats: proven=0), and the program holds what it would under
 * glibc. ARC's ghost lists and TinyLFU's doorkeeper admit blocks on the same kind of evidence.
 *
 * The regret (guided, regret=1). The thread's counter answers from the freeing thread's own
 * calls, and a block freed by a thread that never asks for one is passed on every time (a reader
 * thread's chunks freed by the main thread: ../../README.md, History). So after the proof the
 * frees the prediction passed on are remembered the same way, and a miss one of them would have
 * served is a regret of the process for that block's size class: the class's next HPC_REGRET
 * frees are kept whatever the thread's counter says. A remembered block that ages out unasked,
 * or a kept block given back idle, takes one back. Process-wide, under hl_lock; a miss reads
 * the count of remembered blocks without it (hpc_ghosts_asked), not to lock for nothing. */
static void hl_ghost_add(const void *p, size_t usable, unsigned cls) {
    hl_lock_take();
    hpc_ghost_add(&hl_cache, (uintptr_t)p, usable, cls);
    hl_lock_give();
}

static void hl_ghost_hit(size_t n, uintptr_t mask) {
    hl_lock_take();
    hpc_ghost_hit(&hl_core, &hl_cache, n, mask);
    hl_lock_give();
}

/* ---- What to keep at a free ---- */

/* The policy's rule at a free (hpc_keep_at_free): keep (1) or pass on (0). guided: the thread's
 * counter, asked with the table's (allocation context, class) score where the table has one
 * (format 4; *contexted counts those answers), else its (site, class) score (*sited), else its
 * class score or the counter itself. ctx: the block's slot's (predict.c). Called under the
 * block's shard lock (which covers *sited and *contexted). */
static inline int hl_keep_at_free(size_t req, int site, uint64_t ctx, int wanted, int unproven,
                                  struct hl_shard *s, int *passed_by_prediction) {
    struct hcp_counter *k = NULL;
    int score = -1;
    if (hl_set.policy == HL_GUIDED) { /* this thread's */
        k = hl_thread_counter();
        if (k != NULL && hl_use_sites) {
            /* format 4: the (context, class) entry where training saw that key; format 3 and
             * after it: the (site, class) entry; elsewhere the thread's own past, not the
             * class's average over other programs, which was wrong at sites training never saw
             * (../../README.md, History) */
            unsigned cls = hcp_class(req);
            score = hl_ctx_score(ctx, cls);
            if (score >= 0) {
                s->contexted++;
            } else {
                score = hl_site_score(site, cls);
                s->sited += (uint64_t)(score >= 0); /* the caller holds the shard's lock */
            }
        }
    }
    return hpc_keep_at_free(&hl_core, &hl_cache, k, req, score, wanted, unproven,
                            passed_by_prediction);
}

/* ---- As time passes: advice, the bound ---- */

static uint64_t hl_advise_at; /* the next scan for idle blocks to advise (under hl_lock) */

/* As time passes (the layer's own, no decision of what is kept): madv > 0: the pages of blocks kept idle for `madv` ms are
 * madvise(MADV_FREE)d, a few per call, at most every madv/2 ms (lazily: a block reused at once, the
 * tight loop, never pays the syscall and its TLB flush). A block being advised is out of the cache
 * meanwhile, so no other thread can take it while the kernel may still drop its pages. */
static void hl_advise_idle(uint64_t now) {
    if (hl_set.madv_ns <= 0 || now < __atomic_load_n(&hl_advise_at, __ATOMIC_RELAXED)) return;
    struct hpc_block todo[4];
    int n = 0;
    struct hpc_cache *c = &hl_cache;
    hl_lock_take();
    if (now >= hl_advise_at) {
        hl_advise_at = now + (uint64_t)hl_set.madv_ns / 2;
        for (int i = 0; i < c->nkept && n < 4;) {
            if (!c->kept[i].advised && now - c->kept[i].since >= (uint64_t)hl_set.madv_ns)
                todo[n++] = hpc_remove(c, i);
            else
                i++;
        }
    }
    hl_lock_give();
    if (n == 0) return;
    for (int i = 0; i < n; i++) hl_madvise((void *)todo[i].p, todo[i].usable);
    struct hpc_out out = {0};
    hl_lock_take();
    for (int i = 0; i < n; i++) {
        if (c->nkept < HPC_MAX_KEPT && c->bytes_kept + todo[i].usable <= hl_set.cap) {
            /* back in as it was (its stamp and since): the advice decided nothing */
            todo[i].advised = 1;
            c->kept[c->nkept] = todo[i];
            HPC_STORE(c->nkept, c->nkept + 1);
            c->bytes_kept += todo[i].usable;
        } else { /* the cache filled up meanwhile: give it back */
            out.p[out.n++] = todo[i].p;
            hpc_count_given_back(c, todo[i].usable, 0);
        }
    }
    hl_lock_give();
    hl_release(&out);
}

/* As time passes (at a miss that maps new memory): the cache's bound (hpc_bound_shared) on the
 * program's footprint. Under glibc, a mapped block's memory goes back
 * at its free: the program's large blocks take what is live of them, at most their peak, and
 * whatever the cache keeps comes on top of that: without a bound, a training step's freed
 * tensors are kept while the next step's grow beside them (../../README.md, History). So at a
 * miss that maps a block (new memory: hl_track), the oldest kept blocks
 * (largest: the smallest) go back until live + kept (fronts included) is within the live
 * blocks' peak so far plus `peak` percent (at most HPC_OUT_MAX a call; the next miss goes on). A
 * hit or a keep only moves a block between live and kept: the sum grows at such a miss alone.
 * The shards' counts are read without their locks (a count a moment old moves the bound by a
 * block). When the shared cache is not enough, the threads' fronts give theirs back too
 * (hl_bound_fronts). Not counted on either side: blocks below `min`, and glibc's heap. The
 * high-water mark of live blocks is taken at these misses: the bound can only be stricter. */
static void hl_bound_fronts(size_t over); /* fronts.c */
static void hl_bound(void) {
    struct hpc_out out = {0};
    hl_lock_take();
    size_t live = 0, fronted = 0;
    for (int i = 0; i < HL_SHARDS; i++) {
        live += __atomic_load_n(&hl_shards[i].live, __ATOMIC_RELAXED);
        fronted += __atomic_load_n(&hl_shards[i].fronted, __ATOMIC_RELAXED);
    }
    size_t over = hpc_bound_shared(&hl_core, &hl_cache, live, fronted, &out);
    hl_lock_give();
    hl_release(&out);
    if (over > 0 && hl_sharded) hl_bound_fronts(over);
}
