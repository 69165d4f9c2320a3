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

/* The table's call-site key of a free (tasks/learning/sites.py, native/TABLE.md): the module
 * holding the free's return address, named as the tracer names it (the loader's name, the main
 * program by /proc/self/exe's target), crc32(path) << 32 xor (address - load bias), mixed and
 * taken modulo HL_SITES. The module is found by glibc's _dl_find_object (2.35+), else by
 * walking dl_iterate_phdr's list under the loader's lock, and each return address's answer is
 * remembered in a direct-mapped cache of words (address << 16 | (site + 1) << 1 | 1) written
 * and read whole, without a lock: a word is never torn, and one overwritten is found again.
 * Asked only at the guided policy's large frees with a table of sites, before any lock of the
 * layer is taken (the loader's lock may be taken inside, and a thread holding it may be
 * allocating). Known limits: a module unloaded and another loaded at its addresses keeps the
 * first's answers (as the tracer's module map does, FORMAT.md); a library dlopen'ed by a
 * relative name is hashed by that name, where the tracer makes it absolute (such a free finds
 * no entry and asks the counter). */
#define HL_SITES 4096u  /* tasks/learning/sites.py SITE_VOCABULARY */
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
static char hl_exe[4096]; /* /proc/self/exe's target, read at start */
static size_t hl_exe_len;
#define HL_SITE_CACHE_BITS 10
static uint64_t hl_site_cache[1u << HL_SITE_CACHE_BITS];

static uint32_t hl_crc32(const char *s, size_t n) { /* zlib's crc32: reflected 0xEDB88320 */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= (unsigned char)s[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* The key of a call from `offset` bytes past the load bias of the module the loader names
 * `name` ("" for the main program, which is named by its path as the tracer names it). */
static int hl_site_key(const char *name, uintptr_t offset) {
    size_t len = strlen(name);
    if (len == 0) {
        name = hl_exe;
        len = hl_exe_len;
    }
    uint64_t h = ((uint64_t)hl_crc32(name, len) << 32) ^ (uint64_t)offset;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return (int)(h % HL_SITES);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
extern int _dl_find_object(void *, struct dl_find_object *) __attribute__((weak));
#endif

struct hl_site_query {
    uintptr_t addr;
    int site;
};

static int hl_site_module(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct hl_site_query *q = data;
    uint64_t lo, hi, bias = (uint64_t)info->dlpi_addr;
    if (!hc_module_range(info, &lo, &hi) || q->addr < bias + lo || q->addr >= bias + hi) return 0;
    q->site = hl_site_key(info->dlpi_name ? info->dlpi_name : "", q->addr - bias);
    return 1;
}

/* The call-site key of a free returning to `ret`; -1 where no module holds it. No lock held. */
static int hl_site_of(const void *ret) {
    uintptr_t a = (uintptr_t)ret;
    if (a == 0) return -1;
    uint64_t *slot = &hl_site_cache[(uint64_t)a * 0x9E3779B97F4A7C15ull >> (64 - HL_SITE_CACHE_BITS)];
    uint64_t w = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if ((w & 1) && (w >> 16) == (uint64_t)a) return (int)((w >> 1) & 0x7FFF) - 1;
    struct hl_site_query q = {a, -1};
#ifdef DLFO_STRUCT_HAS_EH_DBASE
    /* glibc 2.35+: the loader's own lock-free lookup (made for unwinders), reading only its
     * tables; dl_iterate_phdr reads every module's program headers, pages a process may never
     * have touched (page faults: ../../README.md, History) */
    if (_dl_find_object != NULL) {
        struct dl_find_object fo;
        if (_dl_find_object((void *)a, &fo) == 0 && fo.dlfo_link_map != NULL) {
            const struct link_map *lm = fo.dlfo_link_map;
            q.site = hl_site_key(lm->l_name ? lm->l_name : "", a - (uintptr_t)lm->l_addr);
        }
    } else
#endif
        dl_iterate_phdr(hl_site_module, &q);
    if ((uint64_t)a >> 48 == 0) /* user addresses fit 48 bits: else asked again next time */
        __atomic_store_n(slot, (uint64_t)a << 16 | (uint64_t)(q.site + 1) << 1 | 1, __ATOMIC_RELAXED);
    return q.site;
}
