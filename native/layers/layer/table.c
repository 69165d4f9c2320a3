/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The table file (predictor=table:FILE): read once in the constructor into hl_table (the class
 * scores) and hl_site_set (the call-site entries the layer can ask), or refused with one line.
 * The format and the refusal rules: ../../TABLE.md. */

#define HL_TABLE_MAGIC "HCLTAB\0\1"
#define HL_CLASS_BYTES (HCP_TOKENS * HCP_TOKENS)
#define HL_MAX_SITE_ENTRIES (HL_SITES * HL_CLASSES)
#define HL_FALLBACK "; the guided policy uses the online counter"

/* The head's checks (../../table_head.h): formats 2 (class scores) and 3 (with site entries). */
static const struct hc_table_kind hl_table_kind =
    HC_TABLE_KIND(HL_TABLE_MAGIC, "layer table", 2u, 3u, "2 and 3", HL_FALLBACK);

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

/* Load the table: the class scores into hl_table and, format 3, the site entries the layer can
 * ask into hl_site_set; NULL, or why it is refused. Read in 4 KiB chunks on the stack, never
 * copied whole: the class scores go straight to hl_table (read only once hl_use_table is set,
 * on success), the site entries are read once to check and count them, then again into a set
 * sized to them. */
static const char *hl_load_table(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot be opened" HL_FALLBACK;
    unsigned char buf[4096];
    struct hc_table_head h = {0};
    uint64_t got = 0xcbf29ce484222325ull;
    struct hl_site_load l = {0};
    const char *why = hc_read_table_head(fd, &hl_table_kind, &h);
    if (why) goto out;
    size_t sites = h.bytes >= HL_CLASS_BYTES ? h.bytes - HL_CLASS_BYTES : 0;
    if (h.shape != HCP_TOKENS || h.bytes < HL_CLASS_BYTES || (h.version == 2u && sites != 0) ||
        sites % 4 != 0 || sites / 4 > HL_MAX_SITE_ENTRIES) {
        why = h.version == 3u ? "has another shape (64 tokens, 4096 payload bytes and 4 per site entry expected)" HL_FALLBACK
                              : "has another shape (64 tokens, 4096 payload bytes expected)" HL_FALLBACK;
        goto out;
    }
    l.cmin = hcp_class(hl_set.min / 2);
    size_t n = hl_read_payload(fd, 0, HL_CLASS_BYTES, &got, buf, sizeof buf, hl_take_classes, NULL);
    uint64_t after_classes = got;
    n += hl_read_payload(fd, HL_CLASS_BYTES, sites, &got, buf, sizeof buf, hl_take_sites, &l);
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
    if (h.model == 0) {
        why = "names no model version" HL_FALLBACK;
        goto out;
    }
    if (hl_set.model && h.model != hl_set.model) {
        why = "comes from another model version" HL_FALLBACK;
        goto out;
    }
    /* accepted: the set of the entries it can ask, the entries read again (a file changed
     * between the reads makes the sum differ: refused, nothing kept) */
    if (l.asked > 0) {
        for (hl_site_bits = 4; (1u << hl_site_bits) < 2 * l.asked; hl_site_bits++) {
        }
        size_t size = (sizeof *hl_site_set) << hl_site_bits;
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            hl_site_set = m;
            struct hl_site_load fill = {.cmin = l.cmin, .insert = 1};
            uint64_t again = after_classes;
            hl_read_payload(fd, HL_CLASS_BYTES, sites, &again, buf, sizeof buf, hl_take_sites, &fill);
            if (again != h.sum || fill.asked != l.asked) {
                munmap(m, size);
                hl_site_set = NULL;
                why = "changed while it was read" HL_FALLBACK;
                goto out;
            }
            mprotect(m, size, PROT_READ);
        }
    }
    hl_use_sites = sites > 0; /* entries in the file: a key it lacks asks the counter */
out:
    close(fd);
    return why;
}
