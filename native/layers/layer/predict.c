/* Part of layers/layer.c (one translation unit; never compiled alone).
 * guided's predictor in the process: the thread's online counter (../predictor.h) fed with the
 * thread's calls on large blocks, and the table file's answers (class scores, and call-site
 * entries keyed by the free's return address). The question at a free is the core's
 * (hpc_predict_reuse; policy.c's hl_keep_at_free asks it with the call site's score). */

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
