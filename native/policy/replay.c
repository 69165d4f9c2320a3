/*
 * The what-if replay through the policy core: a traced run's events, one batch per call, each
 * event through the core's entry points as the layer's hooks would call them (hooks.c, alloc.c,
 * free.c), the per-event loop here in C. Built as native/build/libheapcast_policy.so (`make -C
 * native policy`); tasks/whatif/policy_core.py is its binding (ctypes over numpy arrays).
 *
 * Events, one row each, in the order the process made them (several processes may be merged by
 * time; every process has its own cache, every thread its own state):
 *   req[i]      bytes the row asks for (malloc & co., realloc's new size), -1: none
 *   freed[i]    bytes of the block the row frees (free, realloc's old block), -1: none
 *   partner[i]  the row whose request made the block row i frees, -1: unknown (not the layer's)
 *   align[i]    alignment the request asks for (posix_memalign & co., valloc: a page), <= 1: none
 *   addr[i]     the address the traced request got: its low bits are the block's alignment
 *   usable[i]   usable bytes of the block the next allocator makes for the request (a model of
 *               glibc's, tasks/whatif/policy_core.py; a mapped block realloc'ed to a mapped
 *               size: hpc_mremap_usable, from the block the layer really handed out)
 *   time[i]     ns; proc[i], thread[i]: indexes (threads numbered over all processes)
 * A realloc row is a request first; served from the cache, the old block is freed as by free;
 * not served, the next allocator reallocates it (it leaves the live bytes, nothing is kept).
 * What a trace cannot tell the replay (named once, here): the layer's clock is its own (the
 * traced times are the tracer's); the interleaving of threads at the layer's locks (the replay
 * runs the traced order); which other thread's front a miss takes (hl_steal: the first hint slot
 * that serves; here the first thread of the process, in thread index order, whose front serves,
 * with thread_proc given); when a thread exits (hl_thread_exit hands its front to the shared
 * cache; a trace records no exit, so here, with exits given, at the thread's last traced row,
 * and never for a process's first thread, whose front the layer keeps to the end); and glibc's
 * heap trimmed (hl_trimmed): a block is in scope iff it is mapped, i.e. asked for >=
 * mmap_threshold (a static threshold), or scope=all. benchmarks/bench_whatif_threads.py measures
 * what they change on multi-threaded runs.
 *
 * Per row out: decision[i] = request (0: not asked, 1: hit, 2: miss) | free fate << 2 (enum
 * hpc_fate; 0: not asked); got_usable[i]: usable bytes of the block the request got (-1: none);
 * kept_bytes[i] (NULL: not written): usable bytes the row's process keeps after the row (its
 * shared cache and its threads' fronts), the simulator's idle bytes.
 * The counters are the caches' (struct hpc_stats; hpc_replay_stats sums them).
 */
#include "core.c"

#define HPC_EXPORT __attribute__((visibility("default")))

HPC_EXPORT void hpc_sizes(int64_t *out) {
    out[0] = (int64_t)sizeof(struct hpc_cache);
    out[1] = (int64_t)sizeof(struct hpc_thread);
    out[2] = (int64_t)sizeof(struct hcp_counter);
    out[3] = (int64_t)(sizeof(struct hpc_stats) / sizeof(uint64_t));
}

/* glibc's malloc_usable_size of the block it makes for a request of `req` bytes aligned to
 * `align` (<= 16: malloc's own), as the layer sees it: on the heap (below the mmap threshold)
 * its chunk less 8; mapped, the mapping less the pointer's offset in it (16, or for an aligned
 * request the alignment, glibc mapping a chunk with room to align it). */
static inline int64_t hpc_chunk(int64_t s) {
    int64_t c = (s + 8 + 15) & ~(int64_t)15;
    return c < 32 ? 32 : c;
}
static inline int64_t hpc_pages(int64_t x) { return (x + 4095) / 4096 * 4096; }
static inline int64_t hpc_usable(int64_t req, int64_t align, uint64_t mmap_threshold) {
    if (req < 0) return -1;
    if ((uint64_t)req < mmap_threshold) return hpc_chunk(req) - 8;
    if (align <= 16) return hpc_pages(hpc_chunk(req) + 8) - 16;
    return hpc_pages(hpc_chunk(hpc_chunk(req) + align + 32) + 8) - align;
}

/* The usable bytes of n requests (-1 where req < 0): tasks/whatif/policy_core.py glibc_usable. */
HPC_EXPORT void hpc_glibc_usable(int64_t n, const int64_t *req, const int64_t *align,
                                 uint64_t mmap_threshold, int64_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = hpc_usable(req[i], align[i], mmap_threshold);
}

struct hpc_rows { /* the per-row scratch the caller gives */
    uintptr_t *p;
    uint8_t *tracked;
};

/* The row's pseudo address: the row in the high bits (identity), the traced address's low 32
 * bits below (its alignment). */
static inline uintptr_t hpc_row_p(int64_t i, uint64_t addr) {
    return ((uintptr_t)(i + 1) << 32) | (addr ? (addr & 0xFFFFFFFFu) : 16u);
}

/* glibc's realloc of a mapped block to a mapped size (mremap_chunk): the block keeps its offset
 * in its first page (16, or an aligned block's), and its usable bytes follow from it. */
static inline uint64_t hpc_mremap_usable(uintptr_t old_p, uint64_t n) {
    uint64_t off = ((old_p & 4095u) + 4096u - 16u) & 4095u; /* the chunk's offset in its map */
    int64_t chunk = hpc_chunk((int64_t)n);
    return (uint64_t)(hpc_pages(chunk + (int64_t)off + 8) - (int64_t)off - 16);
}

static inline int hpc_free_row(const struct hpc_settings *set, struct hpc_cache *c,
                               struct hpc_thread *t, int64_t a, int64_t f, const int64_t *req,
                               const int64_t *got_usable, const struct hpc_rows *rows,
                               uint64_t mmap_threshold, int scope_all, int site_score,
                               uint64_t now, struct hpc_out *out) {
    if (a < 0) { /* a block the trace did not see made: not the layer's */
        if (f < 0 || (uint64_t)f < set->min) return 0;
        return hpc_free_untracked(c, t, 0, (uint64_t)f, scope_all || (uint64_t)f >= mmap_threshold);
    }
    uint64_t u = (uint64_t)got_usable[a];
    if (got_usable[a] < 0 || u < set->min) return 0; /* a small block: straight to glibc */
    if (!rows->tracked[a])
        return hpc_free_untracked(c, t, rows->p[a], u,
                                  scope_all || (uint64_t)req[a] >= mmap_threshold);
    return hpc_free(set, c, t, rows->p[a], u, (uint64_t)req[a], site_score, now, out);
}

/* A miss takes a block from another thread's front of the same process (fronts.c hl_steal):
 * the first, in thread index order, whose block serves the request. */
static int hpc_steal(struct hpc_cache *c, struct hpc_thread *threads, int32_t n_threads,
                     const int32_t *thread_proc, int32_t proc, int32_t self, uint64_t n,
                     uintptr_t mask, struct hpc_block *got) {
    if (c->fronted == 0) return 0;
    for (int32_t j = 0; j < n_threads; j++) {
        struct hpc_thread *o = &threads[j];
        if (j != self && thread_proc[j] == proc && o->front.p &&
            hpc_serves(o->front.p, o->front.usable, n, mask)) {
            hpc_front_take(c, o, got);
            return 1;
        }
    }
    return 0;
}

/* Replays rows [0, n) through caches[proc], threads[thread]; caches and threads zeroed by the
 * caller on the first batch (start=1 initialises them), counters (guided) zeroed memory for
 * n_threads counters; thread_proc[j] (NULL: no steals) each thread's process, exits[i] (NULL:
 * none) 1 where a thread exits after row i; site_score[i] (NULL: none) the layer table's entry
 * at the (call site, size class of the block's request) of the free in row i (a realloc row's
 * old block included), -1 where the table has none (the layer's hl_site_score: -1 asks the
 * counter; with site entries the caller gives no class_table, as the layer does). Returns rows
 * replayed. */
HPC_EXPORT int64_t hpc_replay(const struct hpc_settings *set, int64_t n, const int64_t *req,
                              const int64_t *freed, const int64_t *partner, const int64_t *align,
                              const uint64_t *addr, const int64_t *usable, const int64_t *time,
                              const int32_t *proc, const int32_t *thread, struct hpc_cache *caches,
                              int32_t n_proc, struct hpc_thread *threads, int32_t n_threads,
                              struct hcp_counter *counters, uint64_t mmap_threshold,
                              int32_t scope_all, int32_t start, uint8_t *decision,
                              int64_t *got_usable, uintptr_t *row_p, uint8_t *row_tracked,
                              int64_t *kept_bytes, const int32_t *thread_proc,
                              const uint8_t *exits, const int16_t *site_score) {
    if (start) {
        for (int32_t i = 0; i < n_proc; i++) hpc_cache_init(set, &caches[i]);
        for (int32_t i = 0; i < n_threads; i++) {
            threads[i] = (struct hpc_thread){0};
            threads[i].counter = counters ? &counters[i] : NULL;
        }
    }
    struct hpc_rows rows = {row_p, row_tracked};
    for (int64_t i = 0; i < n; i++) {
        struct hpc_cache *c = &caches[proc[i]];
        struct hpc_thread *t = &threads[thread[i]];
        struct hpc_out out = {0};
        int64_t s = req[i], f = freed[i], a = partner[i];
        uint64_t now = (uint64_t)time[i];
        int rc = 0, fc = 0, site = site_score ? site_score[i] : -1;
        got_usable[i] = -1;
        row_tracked[i] = 0;
        if (s >= 0) {
            int hit = 0;
            struct hpc_block got;
            if ((uint64_t)s >= set->min && set->policy != HPC_OFF) {
                uintptr_t mask = align[i] > 1 ? (uintptr_t)(align[i] - 1) : 0;
                hpc_learn_alloc(t, (uint64_t)s);
                hit = hpc_take(set, c, t, (uint64_t)s, mask, now, &got, &out) ||
                      (thread_proc && hpc_steal(c, threads, n_threads, thread_proc, proc[i],
                                                thread[i], (uint64_t)s, mask, &got));
                if (hit) hpc_hit(set, c, t, &got, (uint64_t)s);
                else hpc_miss(set, c, (uint64_t)s, mask);
                rc = hit ? 1 : 2;
            }
            if (hit) {
                row_p[i] = got.p;
                got_usable[i] = (int64_t)got.usable;
                row_tracked[i] = 1;
                if (f >= 0)
                    fc = hpc_free_row(set, c, t, a, f, req, got_usable, &rows, mmap_threshold,
                                      scope_all, site, now, &out);
            } else {
                if (f >= 0 && a >= 0 && row_tracked[a]) hpc_untrack(c, (uint64_t)got_usable[a]);
                int mapped = (uint64_t)s >= mmap_threshold;
                row_p[i] = hpc_row_p(i, addr[i]);
                got_usable[i] = usable[i];
                if (f >= 0 && a >= 0 && mapped && got_usable[a] >= 0 &&
                    (uint64_t)req[a] >= mmap_threshold) { /* mremap: the old block's offset */
                    row_p[i] = hpc_row_p(i, row_p[a]);
                    got_usable[i] = (int64_t)hpc_mremap_usable(row_p[a], (uint64_t)s);
                }
                if (rc)
                    row_tracked[i] = (uint8_t)hpc_track(set, c, t, row_p[i],
                                                        (uint64_t)got_usable[i], (uint64_t)s,
                                                        scope_all || mapped, mapped, &out);
            }
        } else if (f >= 0 && set->policy != HPC_OFF) {
            fc = hpc_free_row(set, c, t, a, f, req, got_usable, &rows, mmap_threshold, scope_all,
                              site, now, &out);
        }
        decision[i] = (uint8_t)(rc | fc << 2);
        if (exits && exits[i]) hpc_thread_exit(set, c, t, now, &out);
        if (kept_bytes) kept_bytes[i] = (int64_t)(c->bytes_kept + c->fronted);
    }
    return n;
}

/* The counters of n_proc caches summed (struct hpc_stats' order; live_peak and bytes_kept_peak
 * summed too), then bytes kept at the end (shared caches) and in the fronts. */
HPC_EXPORT void hpc_replay_stats(const struct hpc_cache *caches, int32_t n_proc, uint64_t *out) {
    const size_t k = sizeof(struct hpc_stats) / sizeof(uint64_t);
    for (size_t j = 0; j < k + 2; j++) out[j] = 0;
    for (int32_t i = 0; i < n_proc; i++) {
        const uint64_t *s = (const uint64_t *)&caches[i].stats;
        for (size_t j = 0; j < k; j++) out[j] += s[j];
        out[k] += caches[i].bytes_kept;
        out[k + 1] += caches[i].fronted;
    }
}
