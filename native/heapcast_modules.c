/* Part of heapcast.c (one translation unit; never compiled alone).
 * Module map (HEAPCAST_CALLER=1 only): the ELF modules mapped in the process, written as MODULE
 * records so that callers can be resolved offline despite ASLR (FORMAT.md, Modules).
 *
 * hc_modules_scan walks dl_iterate_phdr and appends a MODULE record (+ path records) for each
 * module not seen yet to hc_mlog, an mmap'd log of every module record of this process, then
 * writes the new bytes with one hc_write (a contiguous block of whole records). It runs at start
 * and on slow paths only (buffer flush, thread exit, exec, exit), and returns after the first
 * callback when the loader's dlpi_adds/dlpi_subs counters have not moved since the last scan:
 * a dlopen'ed module is in the file before the first flush of records that can call from it.
 * dlopen itself is not hooked: a wrapper would become dlopen's caller and change which
 * RUNPATH/$ORIGIN the loader applies.
 * A fork child inherits hc_mlog and writes it whole after its header (no dl_iterate_phdr in the
 * child's atfork handler).
 * Locks: hc_module_lock, then the loader's write lock (inside dl_iterate_phdr), then
 * hc_file_lock (hc_write). On buffer flushes the lock is only tried: a thread that holds the
 * loader's lock and allocates must never wait for a scanning thread that waits for that lock. */

#define HC_MODULE_SLOTS 8192u /* open-addressing table of (start, end) seen; 3/4 full at most */
static struct {
    uint64_t start, end;
} hc_mod_seen[HC_MODULE_SLOTS];
static unsigned hc_mod_count;
static unsigned long long hc_mod_adds, hc_mod_subs;
static int hc_mod_counted; /* hc_mod_adds/subs hold a scan's values */
static pthread_mutex_t hc_module_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *hc_mlog; /* every module record of this process, in order */
static size_t hc_mlog_len, hc_mlog_cap;

static int hc_mlog_reserve(size_t more) {
    if (hc_mlog_len + more <= hc_mlog_cap) return 0;
    size_t cap = hc_mlog_cap ? hc_mlog_cap : 64u * 1024u;
    while (cap < hc_mlog_len + more) cap *= 2;
    void *m = hc_mlog ? mremap(hc_mlog, hc_mlog_cap, cap, MREMAP_MAYMOVE)
                      : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    hc_mlog = m;
    hc_mlog_cap = cap;
    return 0;
}

/* 1 when (start, end) was not seen before (and is now), 0 when it was or the table is full. */
static int hc_mod_insert(uint64_t start, uint64_t end) {
    if (hc_mod_count >= HC_MODULE_SLOTS / 4 * 3) return 0;
    unsigned i = (unsigned)((start >> 12) * 0x9E3779B97F4A7C15ull >> 40) & (HC_MODULE_SLOTS - 1);
    for (;; i = (i + 1) & (HC_MODULE_SLOTS - 1)) {
        if (hc_mod_seen[i].start == 0 && hc_mod_seen[i].end == 0) break;
        if (hc_mod_seen[i].start == start && hc_mod_seen[i].end == end) return 0;
    }
    hc_mod_seen[i].start = start;
    hc_mod_seen[i].end = end;
    hc_mod_count++;
    return 1;
}

static void hc_mod_put(uint64_t *r, uint64_t op, uint64_t a, uint64_t b, uint64_t c, uint64_t size,
                       uint64_t caller) {
    r[0] = a;
    r[1] = b;
    r[2] = c;
    r[3] = size | (op << HC_OP_SHIFT);
    r[4] = caller;
    if (hc_flags & HC_FLAG_STACKS) r[5] = 0;
}

static int hc_module_cb(struct dl_phdr_info *info, size_t size, void *data) {
    int *index = data;
    int first = (*index)++ == 0;
    if (first && size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        if (hc_mod_counted && info->dlpi_adds == hc_mod_adds && info->dlpi_subs == hc_mod_subs)
            return 1; /* nothing loaded or unloaded since the last scan */
        if (hc_mod_counted && info->dlpi_subs != hc_mod_subs) {
            /* something was unloaded: another module may now sit at the same range, so record
             * every module again (the later record wins, FORMAT.md) */
            memset(hc_mod_seen, 0, sizeof hc_mod_seen);
            hc_mod_count = 0;
            hc_uw_forget(); /* and the unwinder's rules for its addresses */
        }
        hc_mod_adds = info->dlpi_adds;
        hc_mod_subs = info->dlpi_subs;
        hc_mod_counted = 1;
    }
    uint64_t lo, hi;
    if (!hc_module_range(info, &lo, &hi)) return 0;
    uint64_t bias = (uint64_t)info->dlpi_addr, start = bias + lo, end = bias + hi;
    if (!hc_mod_insert(start, end)) return 0;

    char path[PATH_MAX];
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    size_t len = 0;
    if (!*name && first) { /* the main program */
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        len = n > 0 ? (size_t)n : 0;
    } else if (*name && *name != '/' && realpath(name, path)) { /* dlopen("./lib.so") */
        len = strlen(path);
    } else {
        len = strnlen(name, sizeof path - 1);
        memcpy(path, name, len);
    }
    size_t chunks = (len + HC_MODULE_PATH_CHUNK - 1) / HC_MODULE_PATH_CHUNK;
    size_t words = hc_record_size / 8;
    if (hc_mlog_reserve((1 + chunks) * hc_record_size) != 0) return 0;
    uint64_t *r = (uint64_t *)(hc_mlog + hc_mlog_len);
    uint64_t now = hc_now();
    hc_mod_put(r, HC_OP_MODULE, now, start, end, len, bias);
    for (size_t k = 0; k < chunks; k++) {
        uint64_t *p = r + words * (k + 1);
        size_t at = k * HC_MODULE_PATH_CHUNK, n = len - at;
        if (n > HC_MODULE_PATH_CHUNK) n = HC_MODULE_PATH_CHUNK;
        hc_mod_put(p, HC_OP_MODULE_PATH, 0, 0, 0, n, 0);
        memcpy(p, path + at, n);
    }
    hc_mlog_len += (1 + chunks) * hc_record_size;
    return 0;
}

/* Records the modules loaded since the last scan. Guard set; `wait`: block on the module lock
 * (start, exit, exec), else only try it (buffer flushes, thread exit). */
static void hc_modules_scan(int wait) {
    if (!(hc_flags & HC_FLAG_CALLER) || !__atomic_load_n(&hc_tracing, __ATOMIC_RELAXED)) return;
    if (wait) pthread_mutex_lock(&hc_module_lock);
    else if (pthread_mutex_trylock(&hc_module_lock) != 0) return;
    size_t before = hc_mlog_len;
    int index = 0;
    dl_iterate_phdr(hc_module_cb, &index);
    if (hc_mlog_len > before) hc_write(hc_mlog + before, hc_mlog_len - before);
    pthread_mutex_unlock(&hc_module_lock);
}
