/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The table file (predictor=table:FILE): read once in the constructor into hl_table (the class
 * scores) and hl_site_set (the call-site entries the layer can ask), or refused with one line.
 * Format 4 adds the calling contexts' entries (hl_ctx_set, predict.c). The format and the refusal
 * rules: ../../TABLE.md. */

#define HL_TABLE_MAGIC "HCLTAB\0\1"
#define HL_CLASS_BYTES (HCP_TOKENS * HCP_TOKENS)
#define HL_MAX_SITE_ENTRIES (HL_SITES * HL_CLASSES)
#define HL_FALLBACK "; the guided policy uses the online counter"

/* The head's checks (../../table_head.h): formats 2 (class scores), 3 (with site entries) and 4
 * (with site and context entries). */
static const struct hc_table_kind hl_table_kind =
    HC_TABLE_KIND(HL_TABLE_MAGIC, "layer table", 2u, 4u, "2, 3 and 4", HL_FALLBACK);
#define HL_CTX_HEAD_BYTES 8u  /* format 4: u32 depth, u32 site entries, after the class scores */
#define HL_CTX_ENTRY_BYTES 12u /* format 4: u64 context, u32 class << 8 | score */
#define HL_MAX_CTX_ENTRIES (1u << 22)

static uint64_t hl_fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The payload's bytes [from, from + n) read in chunks through buf (no allocation, nothing kept
 * but what `take` does with them); the FNV-1a of what was read goes on from *sum. Returns the
 * bytes read. take(ctx, offset, bytes, count) gets each chunk. */
static size_t hl_read_payload(int fd, size_t from, size_t n, uint64_t *sum, unsigned char *buf,
                              size_t cap, void (*take)(void *, size_t, const unsigned char *, size_t),
                              void *ctx) {
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < cap ? n - done : cap;
        ssize_t got = pread(fd, buf, want, (off_t)(HC_TABLE_HEAD_BYTES + from + done));
        if (got <= 0) break;
        *sum = hl_fnv1a(*sum, buf, (size_t)got);
        if (take) take(ctx, from + done, buf, (size_t)got);
        done += (size_t)got;
    }
    return done;
}

struct hl_site_load {
    unsigned cmin;   /* the smallest class the layer can ask (blocks >= min / 2) */
    uint32_t last;   /* the previous entry's key + 1: keys must rise */
    int disorder;    /* a key did not rise, or is out of range */
    size_t asked;    /* entries of classes >= cmin */
    int insert;      /* second pass: into hl_site_set */
    unsigned char part[4];
    size_t have;     /* bytes of a word split across chunks */
};

static void hl_take_sites(void *ctx, size_t off, const unsigned char *p, size_t n) {
    (void)off;
    struct hl_site_load *l = ctx;
    for (size_t i = 0; i < n; i++) {
        l->part[l->have++] = p[i];
        if (l->have < 4) continue;
        l->have = 0;
        uint32_t w = (uint32_t)l->part[0] | (uint32_t)l->part[1] << 8 | (uint32_t)l->part[2] << 16 |
                     (uint32_t)l->part[3] << 24;
        uint32_t key = w >> 8; /* site * 32 + class */
        if (key >= HL_MAX_SITE_ENTRIES || key + 1 <= l->last) l->disorder = 1;
        l->last = key + 1;
        if (key % HL_CLASSES < l->cmin) continue;
        l->asked++;
        if (!l->insert) continue;
        uint32_t k = key + 1, mask = (1u << hl_site_bits) - 1, i2 = hl_site_slot(k);
        while (hl_site_set[i2] != 0) i2 = (i2 + 1) & mask;
        hl_site_set[i2] = k << 8 | (w & 0xFF);
    }
}

static void hl_take_classes(void *ctx, size_t off, const unsigned char *p, size_t n) {
    (void)ctx;
    memcpy((unsigned char *)hl_table + off, p, n);
}

struct hl_ctx_load {
    unsigned cmin;     /* the smallest class the layer can ask */
    uint64_t last_ctx; /* the previous entry's (context, class) */
    unsigned last_cls;
    int any;           /* an entry was read */
    int disorder;      /* a key did not rise, or is out of range */
    size_t asked;      /* entries of classes >= cmin */
    int insert;        /* second pass: into hl_ctx_set */
    unsigned char part[HL_CTX_ENTRY_BYTES];
    size_t have;
};

static void hl_take_ctxs(void *ctx, size_t off, const unsigned char *p, size_t n) {
    (void)off;
    struct hl_ctx_load *l = ctx;
    for (size_t i = 0; i < n; i++) {
        l->part[l->have++] = p[i];
        if (l->have < HL_CTX_ENTRY_BYTES) continue;
        l->have = 0;
        uint64_t key = 0;
        for (int b = 7; b >= 0; b--) key = key << 8 | l->part[b];
        uint32_t w = (uint32_t)l->part[8] | (uint32_t)l->part[9] << 8 |
                     (uint32_t)l->part[10] << 16 | (uint32_t)l->part[11] << 24;
        unsigned cls = w >> 8;
        if ((key & HL_CTX_HAS) || cls >= HL_CLASSES ||
            (l->any && (key < l->last_ctx || (key == l->last_ctx && cls <= l->last_cls))))
            l->disorder = 1;
        l->any = 1, l->last_ctx = key, l->last_cls = cls;
        if (cls < l->cmin || cls >= HL_CLASSES) continue;
        l->asked++;
        if (!l->insert) continue;
        uint64_t tag = key | HL_CTX_HAS;
        uint32_t mask = (1u << hl_ctx_bits) - 1, j = hl_ctx_slot(tag, cls);
        while (hl_ctx_set[j].ctx != 0) j = (j + 1) & mask;
        hl_ctx_set[j] = (struct hl_ctx_entry){tag, cls << 8 | (w & 0xFF)};
    }
}

static void hl_take_bytes(void *ctx, size_t off, const unsigned char *p, size_t n) {
    struct { unsigned char *to; size_t from; } *d = ctx;
    memcpy(d->to + (off - d->from), p, n);
}

/* A set of 1 << *bits words of `word` bytes for `asked` entries (at most half full), mmap'd. */
static void *hl_set_map(size_t asked, size_t word, uint32_t *bits, size_t *size) {
    for (*bits = 4; ((size_t)1 << *bits) < 2 * asked; (*bits)++) {
    }
    *size = word << *bits;
    void *m = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* Load the table: the class scores into hl_table and, formats 3 and 4, the site entries the layer
 * can ask into hl_site_set, format 4 the context entries into hl_ctx_set; NULL, or why it is
 * refused. Read in 4 KiB chunks on the stack, never copied whole: the class scores go straight
 * to hl_table (read only once hl_use_table is set, on success), the entries are read once to
 * check and count them, then again into sets sized to them. */
static const char *hl_load_table(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot be opened" HL_FALLBACK;
    unsigned char buf[4096];
    struct hc_table_head h = {0};
    uint64_t got = 0xcbf29ce484222325ull;
    struct hl_site_load l = {0};
    struct hl_ctx_load lc = {0};
    const char *why = hc_read_table_head(fd, &hl_table_kind, &h);
    if (why) goto out;
    int v4 = h.version == 4u;
    size_t head4 = v4 ? HL_CTX_HEAD_BYTES : 0;
    if (h.shape != HCP_TOKENS || h.bytes < HL_CLASS_BYTES + head4) {
        why = v4 ? "has another shape (64 tokens, 4096 + 8 payload bytes and the entries expected)" HL_FALLBACK
                 : h.version == 3u ? "has another shape (64 tokens, 4096 payload bytes and 4 per site entry expected)" HL_FALLBACK
                 : "has another shape (64 tokens, 4096 payload bytes expected)" HL_FALLBACK;
        goto out;
    }
    l.cmin = lc.cmin = hcp_class(hl_set.min / 2);
    size_t n = hl_read_payload(fd, 0, HL_CLASS_BYTES, &got, buf, sizeof buf, hl_take_classes, NULL);
    /* format 4: the context depth and the number of site entries */
    unsigned char head[HL_CTX_HEAD_BYTES] = {0};
    struct { unsigned char *to; size_t from; } into = {head, HL_CLASS_BYTES};
    if (v4) n += hl_read_payload(fd, HL_CLASS_BYTES, head4, &got, buf, sizeof buf, hl_take_bytes, &into);
    uint32_t depth = 0, nsites = 0;
    memcpy(&depth, head, 4);
    memcpy(&nsites, head + 4, 4);
    uint64_t after_head = got;
    size_t rest = h.bytes - HL_CLASS_BYTES - head4;
    size_t sites = v4 ? (size_t)nsites * 4 : rest;
    size_t ctxs = v4 && sites <= rest ? rest - sites : 0;
    if ((h.version == 2u && sites != 0) || sites % 4 != 0 || sites / 4 > HL_MAX_SITE_ENTRIES ||
        (v4 && (sites > rest || ctxs % HL_CTX_ENTRY_BYTES != 0 ||
                ctxs / HL_CTX_ENTRY_BYTES > HL_MAX_CTX_ENTRIES))) {
        why = v4 ? "has another shape (site entries of 4 bytes, then context entries of 12 expected)" HL_FALLBACK
                 : h.version == 3u ? "has another shape (64 tokens, 4096 payload bytes and 4 per site entry expected)" HL_FALLBACK
                 : "has another shape (64 tokens, 4096 payload bytes expected)" HL_FALLBACK;
        goto out;
    }
    if (v4 && (depth < 2 || depth > HC_CTX_MAX)) {
        why = "has a context depth outside 2..16" HL_FALLBACK;
        goto out;
    }
    size_t at_ctxs = HL_CLASS_BYTES + head4 + sites;
    n += hl_read_payload(fd, HL_CLASS_BYTES + head4, sites, &got, buf, sizeof buf, hl_take_sites, &l);
    n += hl_read_payload(fd, at_ctxs, ctxs, &got, buf, sizeof buf, hl_take_ctxs, &lc);
    if (n != h.bytes || pread(fd, buf, 1, (off_t)(HC_TABLE_HEAD_BYTES + h.bytes)) != 0) {
        why = "has a payload of the wrong length (truncated or extended)" HL_FALLBACK;
        goto out;
    }
    if (got != h.sum) {
        why = "is corrupt (payload checksum)" HL_FALLBACK;
        goto out;
    }
    if (l.disorder) {
        why = "is corrupt (site entries out of order)" HL_FALLBACK;
        goto out;
    }
    if (lc.disorder) {
        why = "is corrupt (context entries out of order or out of range)" HL_FALLBACK;
        goto out;
    }
    if (h.model == 0) {
        why = "names no model version" HL_FALLBACK;
        goto out;
    }
    if (hl_set.model && h.model != hl_set.model) {
        why = "comes from another model version" HL_FALLBACK;
        goto out;
    }
    /* accepted: the sets of the entries it can ask, the entries read again (a file changed
     * between the reads makes the sum differ: refused, nothing kept) */
    size_t site_size = 0, ctx_size = 0;
    if (l.asked > 0) hl_site_set = hl_set_map(l.asked, sizeof *hl_site_set, &hl_site_bits, &site_size);
    if (lc.asked > 0) hl_ctx_set = hl_set_map(lc.asked, sizeof *hl_ctx_set, &hl_ctx_bits, &ctx_size);
    if (hl_site_set != NULL || hl_ctx_set != NULL) {
        struct hl_site_load fill = {.cmin = l.cmin, .insert = hl_site_set != NULL};
        struct hl_ctx_load fillc = {.cmin = lc.cmin, .insert = hl_ctx_set != NULL};
        uint64_t again = after_head;
        hl_read_payload(fd, HL_CLASS_BYTES + head4, sites, &again, buf, sizeof buf, hl_take_sites, &fill);
        hl_read_payload(fd, at_ctxs, ctxs, &again, buf, sizeof buf, hl_take_ctxs, &fillc);
        if (again != h.sum || fill.asked != l.asked || fillc.asked != lc.asked) {
            if (hl_site_set) munmap(hl_site_set, site_size);
            if (hl_ctx_set) munmap(hl_ctx_set, ctx_size);
            hl_site_set = NULL;
            hl_ctx_set = NULL;
            why = "changed while it was read" HL_FALLBACK;
            goto out;
        }
        if (hl_site_set) mprotect(hl_site_set, site_size, PROT_READ);
        if (hl_ctx_set) mprotect(hl_ctx_set, ctx_size, PROT_READ);
    }
    hl_ctx_depth = depth;
    /* entries in the file: a key it lacks asks the counter */
    hl_use_sites = sites > 0 || ctxs > 0;
out:
    close(fd);
    return why;
}
