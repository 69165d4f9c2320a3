/* Part of layers/place.c (one translation unit; never compiled alone).
 * The lifetime table (table=FILE; the format: ../TABLE.md, "The placement's lifetime table"),
 * distilled from the registered network at registration: at each allocation the call site's key
 * (../site_key.h, the key the training data names: module and offset, hashed) and size class are
 * looked up first; where the table knows them its answer places the block, elsewhere the online
 * counter does (which learns on every site all the same). A file it cannot trust is refused with
 * one line naming it, and the counter answers everything.
 *
 * Per call-site key (../site_key.h, the key training data names), one word: the size classes the
 * table knows at that site (low 32 bits) and those of them it says are long (high 32): long when
 * the entry's score is at least 128 (P(long) >= 1/2). A dense 32 KiB array, touched only when a
 * table is loaded (at start, in hp_start), read-only after: no lock, safe after fork. */
#define HP_LIFE_MAGIC "HCLIFE\0\1"
#define HP_LIFE_FORMAT 1u
#define HP_LIFE_CLASSES 32u
#define HP_LIFE_LONG 128u /* score / 255 >= ~1/2 */
#define HP_LIFE_FALLBACK "; placement uses the online counter"
/* The head's checks (../table_head.h): format 1 only. */
static const struct hc_table_kind hp_life_kind = HC_TABLE_KIND(
    HP_LIFE_MAGIC, "lifetime table", HP_LIFE_FORMAT, HP_LIFE_FORMAT, "1", HP_LIFE_FALLBACK);
static uint64_t hp_life[HC_SITES];
static int hp_life_on;      /* a table in use: the hot path asks it first */
static int hp_life_refused; /* table= given and refused (the stats line's table_refused) */

static inline unsigned hp_class(size_t n) { /* tasks/dataset/tokens.py: bit length, at most 31 */
    unsigned b = n ? 64u - (unsigned)__builtin_clzll((unsigned long long)n) : 0u;
    return b < 31u ? b : 31u;
}

/* Load the table into hp_life; NULL, or why it is refused (hp_life left all zero). Read in
 * 4 KiB chunks on the stack with pread: no allocation (it runs inside the first hooked call). */
static const char *hp_load_life(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot be opened" HP_LIFE_FALLBACK;
    unsigned char buf[4096];
    struct hc_table_head h = {0};
    uint32_t last = 0;
    uint64_t got = 0xcbf29ce484222325ull;
    size_t done = 0;
    int disorder = 0;
    const char *why = hc_read_table_head(fd, &hp_life_kind, &h);
    if (why) goto out;
    if (h.shape != HP_LIFE_CLASSES || h.bytes % 4 != 0 ||
        h.bytes / 4 > HC_SITES * HP_LIFE_CLASSES) {
        why = "has another shape (32 size classes, 4 bytes per entry expected)" HP_LIFE_FALLBACK;
        goto out;
    }
    if (hp_set.model && h.model != hp_set.model) {
        why = "comes from another model version" HP_LIFE_FALLBACK;
        goto out;
    }
    while (done < h.bytes) { /* whole words per chunk: 4096 and bytes are multiples of 4 */
        size_t want = h.bytes - done < sizeof buf ? h.bytes - done : sizeof buf;
        ssize_t n = pread(fd, buf, want, (off_t)(HC_TABLE_HEAD_BYTES + done));
        if (n <= 0 || n % 4 != 0) break;
        for (ssize_t i = 0; i < n; i++) got = (got ^ buf[i]) * 0x100000001b3ull;
        for (ssize_t i = 0; i < n; i += 4) {
            uint32_t w = (uint32_t)buf[i] | (uint32_t)buf[i + 1] << 8 |
                         (uint32_t)buf[i + 2] << 16 | (uint32_t)buf[i + 3] << 24;
            uint32_t key = w >> 8; /* site * 32 + class */
            if (key >= HC_SITES * HP_LIFE_CLASSES || key + 1 <= last) {
                disorder = 1;
                continue;
            }
            last = key + 1;
            unsigned c = key % HP_LIFE_CLASSES;
            uint64_t bits = (uint64_t)1 << c;
            if ((w & 0xFF) >= HP_LIFE_LONG) bits |= (uint64_t)1 << (32 + c);
            hp_life[key / HP_LIFE_CLASSES] |= bits;
        }
        done += (size_t)n;
    }
    if (done != h.bytes || pread(fd, buf, 1, (off_t)(HC_TABLE_HEAD_BYTES + h.bytes)) != 0)
        why = "has a payload of the wrong length (truncated or extended)" HP_LIFE_FALLBACK;
    else if (got != h.sum)
        why = "is corrupt (payload checksum)" HP_LIFE_FALLBACK;
    else if (disorder)
        why = "is corrupt (entries out of order)" HP_LIFE_FALLBACK;
out:
    close(fd);
    if (why) memset(hp_life, 0, sizeof hp_life); /* nothing of a refused file is asked */
    return why;
}

/* With a table: its answer where it knows (the site's key, the class), else -1 (the counter
 * answers). Counted either way, in the thread's stripe. */
static __attribute__((noinline)) int hp_life_long(size_t n, uintptr_t site) {
    struct hp_stripe *s = hp_stripe();
    int key = hc_site_of((const void *)site);
    if (key >= 0) {
        uint64_t w = hp_life[key];
        unsigned c = hp_class(n);
        if ((w >> c) & 1) {
            HP_COUNT(s, table_answers);
            return (int)((w >> (32 + c)) & 1);
        }
    }
    HP_COUNT(s, counter_answers);
    return -1;
}
