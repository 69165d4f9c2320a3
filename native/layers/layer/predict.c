/* Part of layers/layer.c (one translation unit; never compiled alone).
 * guided's predictor in the process: the thread's online counter (../predictor.h) fed with the
 * thread's calls on large blocks, and the table file's answers (class scores, call-site entries
 * keyed by the free's return address, and format 4's entries keyed by the block's allocation
 * context). The question at a free is the core's (hpc_predict_reuse; policy.c's hl_keep_at_free
 * asks it with the context's or the call site's score). */

static __thread struct hcp_counter *hl_counter; /* mmapped at registration (fronts.c) */

/* the table file's class scores (format 2, or 3 without site entries; table.c loads it) */
static uint8_t hl_table[HCP_TOKENS][HCP_TOKENS];
static int hl_use_table;

static void hl_thread_register(void); /* fronts.c: maps the thread's counter */

/* The thread's counter (NULL: none could be mapped, or the thread is being registered). */
static inline struct hcp_counter *hl_thread_counter(void) {
    if (HL_LIKELY(hl_counter != NULL)) return hl_counter;
    hl_thread_register();
    return hl_counter;
}

/* guided's token stream: the thread's calls on the large blocks in scope, the only ones it can
 * keep. A request is learned once its block is known to be one (a hit in hl_take, a block in
 * scope in hl_track); a block glibc serves from its heap is neither learned nor predicted, at
 * its request or its free, where learning it cost threads passing heap blocks a measurable part
 * of a pair (../../README.md, Measured). */
static inline void hl_learn_request(size_t req) {
    if (hl_set.policy == HL_GUIDED) hpc_learn_request(&hl_core, hl_thread_counter(), req);
}

/* Call sites (table format 3) */

/* The table's call-site key of a free (tasks/learning/sites.py, native/TABLE.md): the return
 * address's key as ../../site_key.h computes it (shared with the placement layer), asked only at
 * the guided policy's large frees with a table of sites, before any lock of the layer is taken
 * (the loader's lock may be taken inside, and a thread holding it may be allocating). */
#define HL_SITES HC_SITES /* tasks/learning/sites.py SITE_VOCABULARY */
#define HL_CLASSES 32u  /* size classes: a free's token is HCP_FREE + class */
/* The table's (site, class) entries the layer can ask (classes of blocks >= min / 2), in an
 * open-addressing set of words ((site * 32 + class + 1) << 8 | score; 0: empty), at most half
 * full, mmap'd to its size: the file's entries for small blocks are never asked, and a dense
 * [4096][32] array would be touched whole by every process (page faults and peak memory for
 * nothing; ../../README.md, History). Built once in the constructor, read-only after. */
static uint32_t *hl_site_set;
static uint32_t hl_site_bits; /* the set has 1 << hl_site_bits words */
static int hl_use_sites;      /* format 3 with site entries: unknown keys ask the counter */

static inline uint32_t hl_site_slot(uint32_t key) { return (key * 0x9E3779B1u) >> (32 - hl_site_bits); }

/* The keep score of (site, class), or -1 if the table has none. */
static inline int hl_site_score(int site, unsigned cls) {
    if (hl_site_set == NULL || site < 0 || cls >= HL_CLASSES) return -1;
    uint32_t key = (uint32_t)site * HL_CLASSES + cls + 1, mask = (1u << hl_site_bits) - 1;
    for (uint32_t i = hl_site_slot(key);; i = (i + 1) & mask) {
        uint32_t w = hl_site_set[i];
        if (w == 0) return -1;
        if (w >> 8 == key) return (int)(w & 0xFF);
    }
}
/* The call-site key of a free returning to `ret`; -1 where no module holds it. No lock held. */
static inline int hl_site_of(const void *ret) { return hc_site_of(ret); }

/* Calling contexts (table format 4, ../../TABLE.md "Context entries") */

/* A free carries no stack, so the context the table asks at a free is its block's allocation's:
 * the key of the allocating call's first hl_ctx_depth frames (../../context_key.h, the key the
 * dataset's contexts name), computed where the allocation hands out a block the policy may
 * keep (a kept block taken, or a new block in scope: alloc.c, fronts.c), before any lock of the
 * layer, and kept in the block's live-set slot (live.c) until its free. Asked only by the
 * guided policy with a table of context entries (hl_ctx_set): otherwise nothing is computed, and
 * no call below `min` ever is. */
#define HL_CTX_HAS (1ull << 63) /* a slot's ctx: HL_CTX_HAS | key (63 bits); 0: none */

/* The table's (context, class) entries the layer can ask, in an open-addressing set of
 * {HL_CTX_HAS | key, class << 8 | score} (ctx 0: empty), at most half full, mmap'd to its size,
 * built once in the constructor and read-only after (table.c). */
struct hl_ctx_entry {
    uint64_t ctx;
    uint32_t cls_score;
};
static struct hl_ctx_entry *hl_ctx_set;
static uint32_t hl_ctx_bits; /* the set has 1 << hl_ctx_bits entries */
static unsigned hl_ctx_depth; /* the file's depth (2..HC_CTX_MAX) */

static inline uint32_t hl_ctx_slot(uint64_t ctx, unsigned cls) {
    return (uint32_t)(((ctx ^ cls) * 0x9E3779B97F4A7C15ull) >> (64 - hl_ctx_bits));
}

/* The keep score of (context, class), or -1 if the table has none (ctx: a slot's). */
static inline int hl_ctx_score(uint64_t ctx, unsigned cls) {
    if (hl_ctx_set == NULL || !(ctx & HL_CTX_HAS) || cls >= HL_CLASSES) return -1;
    uint32_t mask = (1u << hl_ctx_bits) - 1;
    for (uint32_t i = hl_ctx_slot(ctx, cls);; i = (i + 1) & mask) {
        const struct hl_ctx_entry *e = &hl_ctx_set[i];
        if (e->ctx == 0) return -1;
        if (e->ctx == ctx && e->cls_score >> 8 == cls) return (int)(e->cls_score & 0xFF);
    }
}

/* The context of the allocating call that returns to `ret` (the hook's caller), or 0. The hooks
 * keep no frame on their pass-through path (a pass-through malloc is a compare and a jump;
 * hooks.c), so frame 0 is found by stepping up from this function's own frame through the
 * layer's (each by its .eh_frame rule, the tracer's unwinder) to the frame that returns to
 * `ret`; from there the walk is the placement layer's (hc_ctx_at: the thread's last walk
 * reused). A walk that does not reach `ret` within a few frames (a frame the unwinder's checks
 * refuse) has no context: the free asks the call site, then the counter. No lock held. */
static __attribute__((noinline)) uint64_t hl_ctx_from(const void *ret) {
    const uint64_t *f = __builtin_frame_address(0);
    uint64_t ip = f[1], sp = (uint64_t)(uintptr_t)(f + 2), bp = f[0];
    int exact = 0;
    for (int i = 0; i < 16 && ip != (uint64_t)(uintptr_t)ret; i++) {
        uint8_t how = 0, used_bp = 0;
        if (!hc_step(&ip, &sp, &bp, &exact, &how, &used_bp)) return 0;
    }
    if (ip != (uint64_t)(uintptr_t)ret) return 0;
    return hc_ctx_at(ip, sp, bp, hl_ctx_depth) | HL_CTX_HAS;
}

/* A large request's context, computed at most once and only when asked (the request's block is
 * one the policy may keep): `ret` the hook's return address, `ctx` 0 until computed. */
struct hl_ask {
    const void *ret;
    uint64_t ctx;
    int done;
};
#define HL_ASK() (struct hl_ask){__builtin_return_address(0), 0, 0}

static inline uint64_t hl_ask_ctx(struct hl_ask *a) {
    if (HL_LIKELY(hl_ctx_set == NULL) || a == NULL) return 0;
    if (!a->done) {
        a->done = 1;
        a->ctx = a->ret != NULL ? hl_ctx_from(a->ret) : 0;
    }
    return a->ctx;
}
