/*
 * heapcast's allocator layer: LD_PRELOAD over the system allocator (or whatever allocator comes
 * next), keeping freed large blocks and handing them out again, with the decision what to keep
 * and what to give back taken by a policy, optionally guided by a predictor computed in the
 * process as it runs. Build: `make -C native layer` -> native/build/libheapcast_layer.so.
 * Run: `HEAPCAST_LAYER=policy=guided,stats=1 LD_PRELOAD=.../libheapcast_layer.so prog args`.
 *
 * Why: glibc serves blocks >= its mmap threshold (128 KiB) with a fresh mmap and unmaps them on
 * free, so each large temporary is faulted in (and zeroed by the kernel) again; seed 002's numpy
 * case spends ~20% of its time there. A kept block is reused with its pages resident.
 *
 * Policies (one layer, configurations of it; `min`, `cap`, `madv` apply to all; `madv`: the
 * pages of a block kept idle for 100 ms are madvise(MADV_FREE)d, so the kernel may take them
 * back under memory pressure, as seed 002 asks; not at once: in a tight loop the syscall and
 * its TLB flush would cost ~1 us per free, where glibc reuses the block for ~25 ns):
 *  - seed002 (default): the n (4) largest recently freed blocks (/work/shared/seeds/002; the
 *    rules of layers/cache002.c and of tasks/whatif's `seed002`): a freed block is kept if fewer
 *    than n are, or if it is at least as large as the smallest kept one, which is given back.
 *  - seed001: size-class pools with timed decay (seeds/001): every freed block is kept; a block
 *    idle for more than `decay` ms is given back (checked at each of the layer's large-block
 *    calls: no timer thread, so a process that stops allocating keeps at most `cap` bytes).
 *  - guided: seed001's pools, but a freed block of class c is kept only when the thread's
 *    predictor says an allocation of class c comes soon: c is among the `topk` most likely calls
 *    at one of the next `horizon` calls of the thread (predictor.h: the online counter over the
 *    thread's large-block calls, predict then update, rolled forward with its own top-1; or a
 *    table file, `predictor=table:FILE`, ../TABLE.md). Causal: only the thread's past is used.
 *  - off: everything passes through (the loading cost alone).
 * Requests are served from the kept blocks by one rule: the most recently kept block that fits
 * (usable >= n and usable - n < n + 4096: at most half a block plus a page wasted) and has the
 * alignment asked for; calloc clears the n bytes. No fit: the next allocator.
 *
 * Ownership: the layer makes no blocks of its own; every block is the next allocator's, so
 * realloc, malloc_usable_size & co. of any pointer go there. The layer knows which large blocks
 * it handed out (a set of live blocks >= `min`, with their requested sizes, under one lock):
 * only those are ever kept. A free of anything else (a foreign pointer, a block made before the
 * layer started, a double free) goes to the real free as the program made it; a block freed
 * while it is kept (a double free) leaves the cache and both frees reach the real free, which
 * reports it as it would without the layer. Blocks below `min` (the tight loops) never take the
 * lock: malloc adds one compare, free one malloc_usable_size.
 *
 * Threads: one mutex over the kept blocks and the live set, taken only for blocks >= `min`,
 * whose real cost is an mmap or munmap (microseconds); syscalls (madvise) and the real
 * allocator are called outside it. The mutex is glibc's adaptive kind (it spins a little before
 * sleeping): its holds are tens of ns, and 8 threads freeing and taking 256 KiB blocks on 2 cores
 * paid 310-440 ns a pair with the plain kind, 170-210 with it (benchmarks/bench_layer.py; glibc
 * 27-30 there, since its dynamic mmap threshold keeps such blocks in its heap). One lock for the
 * whole cache is still the layer's limit under many threads: see that benchmark's figures. The predictor is per thread (initial-exec TLS pointer to an
 * mmapped counter, unmapped by a pthread key destructor). fork: pthread_atfork holds the lock
 * across fork; the child keeps its copy of the kept blocks.
 * Start-up: while dlsym looks up the next allocator, ../bootstrap_pool.h serves allocations;
 * every entry point checks for a function not yet looked up (pool, or ENOMEM for a realloc of a
 * block the pool did not make). Calls before the constructor pass through.
 *
 * Options: HEAPCAST_LAYER=name=value,... read once at start through HL_OPTIONS (name, default,
 * doc). A value it cannot parse: the layer runs as a pass-through and says so in one line on
 * stderr. Stats (stats=1: stderr, stats=PATH: appended to PATH) at exit, one line of integer
 * key=value pairs per process, written with write(2) from a stack buffer (no malloc).
 *
 * Table file (predictor=table:FILE, model=N): the format, what it answers and the refusal rules
 * are in ../TABLE.md (the one description; tasks/learning/table.py writes it). In short: a
 * 32-byte header (magic "HCLTAB\0\1", format 1, model version, 64, 4096, FNV-1a 64) and a
 * uint8[64][64] keep score, of which a free of class c reads [32 + c][c]. A file it cannot trust
 * is refused with one line on stderr, and the online counter is used.
 *
 * Not async-signal-safe (neither is glibc's malloc).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../bootstrap_pool.h"
#include "predictor.h"

#define HL_EXPORT __attribute__((visibility("default")))
#define HL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HL_LIKELY(x) __builtin_expect(!!(x), 1)
#define HL_MAX_KEPT 512 /* kept blocks at most (cap / min = 512 with the defaults) */
#define HL_MAX_N 64     /* seed002's n at most */

/* ------------------------------------------------------------------------------------------- */
/* Options: one table. X(name, default, doc)                                                      */

#define HL_OPTIONS(X)                                                                             \
    X(policy, "seed002", "seed002 | seed001 | guided | off")                                      \
    X(min, "128K", "blocks of at least this many usable bytes are considered (K, M, G suffixes)") \
    X(cap, "1G", "at most this many bytes kept; beyond, the oldest (seed002: smallest) go back")  \
    X(n, "4", "seed002: blocks kept at most (0..64)")                                             \
    X(madv, "100", "MADV_FREE a kept block's pages once idle this many ms (0: at once; off)")     \
    X(decay, "1000", "seed001, guided: a block idle this many ms is given back")                  \
    X(topk, "2", "guided: keep class c when it is among the k most likely calls ...")             \
    X(horizon, "4", "guided: ... at one of the next h calls (the counter rolled forward)")        \
    X(predictor, "online", "guided: online (the thread's counter) | table:FILE (TABLE.md)")       \
    X(model, "0", "table: the model version the file must come from (0: any)")                    \
    X(stats, "0", "0 | 1 (one line on stderr at exit) | a file path (one line appended)")

enum hl_policy { HL_OFF, HL_SEED002, HL_SEED001, HL_GUIDED };
static const char *const hl_policy_names[] = {"off", "seed002", "seed001", "guided"};

struct hl_settings {
    enum hl_policy policy;
    size_t min, cap;
    int n, topk, horizon;
    int64_t madv_ns; /* -1: never */
    uint64_t decay_ns;
    uint32_t model;
    char table[512]; /* table file path ("" = online counter) */
    char stats[512]; /* "" none, "1" stderr, else a path */
};
static struct hl_settings hl_set = {.policy = HL_OFF, .min = SIZE_MAX};

/* The one output path (stats, refusals): write(2) of a stack buffer, EINTR and partial writes
 * handled, errno kept. Never mallocs. */
static void hl_write(int fd, const char *s, size_t len) {
    int saved = errno;
    while (len > 0) {
        ssize_t w = write(fd, s, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        s += w;
        len -= (size_t)w;
    }
    errno = saved;
}

static char *hl_cat(char *p, char *end, const char *s) {
    while (*s && p < end) *p++ = *s++;
    return p;
}

static char *hl_num(char *p, char *end, uint64_t v) {
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n && p < end) *p++ = d[--n];
    return p;
}

/* One line "heapcast layer: <a><b><c><d>\n" on stderr. */
static void hl_say(const char *a, const char *b, const char *c, const char *d) {
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    p = hl_cat(p, end, "heapcast layer: ");
    p = hl_cat(p, end, a);
    p = hl_cat(p, end, b);
    p = hl_cat(p, end, c);
    p = hl_cat(p, end, d);
    *p++ = '\n';
    hl_write(2, line, (size_t)(p - line));
}

/* "123", "64K", "1M", "2G" -> bytes; 0 on a bad value. */
static int hl_parse_size(const char *s, size_t *out) {
    if (!*s) return 0;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    int shift = 0;
    if (*s == 'K' || *s == 'k') shift = 10, s++;
    else if (*s == 'M' || *s == 'm') shift = 20, s++;
    else if (*s == 'G' || *s == 'g') shift = 30, s++;
    if (*s || v > (UINT64_MAX >> shift)) return 0;
    *out = (size_t)(v << shift);
    return 1;
}

static int hl_parse_int(const char *s, long lo, long hi, long *out) {
    size_t v;
    if (!hl_parse_size(s, &v) || strpbrk(s, "KkMmGg") || (long)v < lo || (long)v > hi) return 0;
    *out = (long)v;
    return 1;
}

/* Apply one option; 0 if its value cannot be parsed. */
static int hl_apply(struct hl_settings *st, const char *name, const char *v) {
    long x;
    if (!strcmp(name, "policy")) {
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, hl_policy_names[i])) return st->policy = (enum hl_policy)i, 1;
        return 0;
    }
    if (!strcmp(name, "min")) return hl_parse_size(v, &st->min) && st->min > 0;
    if (!strcmp(name, "cap")) return hl_parse_size(v, &st->cap);
    if (!strcmp(name, "n")) return hl_parse_int(v, 0, HL_MAX_N, &x) ? (st->n = (int)x, 1) : 0;
    if (!strcmp(name, "madv")) {
        if (!strcmp(v, "off")) return st->madv_ns = -1, 1;
        return hl_parse_int(v, 0, 1L << 40, &x) ? (st->madv_ns = (int64_t)x * 1000000, 1) : 0;
    }
    if (!strcmp(name, "topk")) return hl_parse_int(v, 1, 64, &x) ? (st->topk = (int)x, 1) : 0;
    if (!strcmp(name, "horizon"))
        return hl_parse_int(v, 1, 64, &x) ? (st->horizon = (int)x, 1) : 0;
    if (!strcmp(name, "decay"))
        return hl_parse_int(v, 0, 1L << 40, &x) ? (st->decay_ns = (uint64_t)x * 1000000u, 1) : 0;
    if (!strcmp(name, "model"))
        return hl_parse_int(v, 0, 0x7fffffff, &x) ? (st->model = (uint32_t)x, 1) : 0;
    if (!strcmp(name, "predictor")) {
        if (!strcmp(v, "online")) return st->table[0] = '\0', 1;
        if (strncmp(v, "table:", 6) || !v[6] || strlen(v + 6) >= sizeof st->table) return 0;
        strcpy(st->table, v + 6);
        return 1;
    }
    if (!strcmp(name, "stats")) {
        if (!strcmp(v, "0")) return st->stats[0] = '\0', 1;
        if (!*v || strlen(v) >= sizeof st->stats) return 0;
        strcpy(st->stats, v);
        return 1;
    }
    return 0;
}

/* The settings from HEAPCAST_LAYER over the table's defaults; 0 (and one stderr line) if
 * something cannot be parsed. */
static int hl_read_settings(struct hl_settings *st) {
#define X(name, dflt, doc) {#name, dflt},
    static const struct {
        const char *name, *dflt;
    } defaults[] = {HL_OPTIONS(X)};
#undef X
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!hl_apply(st, defaults[i].name, defaults[i].dflt)) return 0; /* cannot happen */
    const char *env = getenv("HEAPCAST_LAYER");
    if (env == NULL) return 1;
    char buf[2048];
    if (strlen(env) >= sizeof buf) {
        hl_say("HEAPCAST_LAYER is too long", "", "", "; running as a pass-through");
        return 0;
    }
    strcpy(buf, env);
    for (char *item = buf, *next; item && *item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        char *eq = strchr(item, '=');
        int known = 0;
        if (eq) {
            *eq = '\0';
#define X(name, dflt, doc) known |= !strcmp(item, #name);
            HL_OPTIONS(X)
#undef X
        }
        if (!eq || !known || !hl_apply(st, item, eq + 1)) {
            if (eq) *eq = '=';
            hl_say("cannot parse HEAPCAST_LAYER item '", item,
                   "' (options: policy min cap n madv decay topk horizon predictor model stats)",
                   "; running as a pass-through");
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------- */
/* The next allocator                                                                             */

struct hl_real {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*memalign)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    size_t (*malloc_usable_size)(void *);
};
static struct hl_real hl_real;

static void hl_resolve(void) {
    static int resolving;
    if (__atomic_exchange_n(&resolving, 1, __ATOMIC_ACQUIRE)) return; /* nested: the pool */
    struct hl_real r;
#define L(name) r.name = (__typeof__(r.name))dlsym(RTLD_NEXT, #name)
    L(malloc), L(free), L(calloc), L(realloc), L(posix_memalign), L(aligned_alloc), L(memalign);
    L(valloc), L(pvalloc), L(malloc_usable_size);
#undef L
#define P(name) __atomic_store_n(&hl_real.name, r.name, __ATOMIC_RELEASE)
    P(free), P(malloc_usable_size), P(realloc), P(posix_memalign), P(aligned_alloc), P(memalign);
    P(valloc), P(pvalloc), P(calloc), P(malloc); /* malloc last: who sees it sees the others */
#undef P
    __atomic_store_n(&resolving, 0, __ATOMIC_RELEASE);
}

/* The real function `name`; NULL while dlsym runs (the caller uses the pool or refuses). */
#define HL_REAL(name)                                                                             \
    ({                                                                                            \
        __typeof__(hl_real.name) f_ = __atomic_load_n(&hl_real.name, __ATOMIC_ACQUIRE);            \
        if (HL_UNLIKELY(!f_)) {                                                                   \
            hl_resolve();                                                                         \
            f_ = __atomic_load_n(&hl_real.name, __ATOMIC_ACQUIRE);                                \
        }                                                                                         \
        f_;                                                                                       \
    })

/* ------------------------------------------------------------------------------------------- */
/* State (under hl_lock)                                                                          */

static pthread_mutex_t hl_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;
static size_t hl_active_min = SIZE_MAX; /* `min` once started and caching; SIZE_MAX: pass */
static size_t hl_page = 4096;

struct hl_kept {
    void *p;
    size_t usable;
    uint64_t stamp; /* larger = kept more recently */
    uint64_t since; /* CLOCK_MONOTONIC_COARSE ns when kept (decay, madv) */
    int advised;    /* its pages are madvise(MADV_FREE)d */
};
static struct hl_kept hl_kept[HL_MAX_KEPT];
static int hl_nkept;
static uint64_t hl_stamp;
static size_t hl_bytes_kept;

static struct {
    uint64_t hits, misses, kept, bytes_kept_peak, given_back, bytes_given_back, bytes_advised;
    uint64_t passed, double_frees, untracked, decayed, table_refused;
} hl_stats;

/* Live set: the large blocks handed out (key: address, value: requested size), open addressing
 * with linear probing, load <= 1/2, backward-shift deletion; grown by mmap (never malloc). If it
 * cannot grow, the layer stops keeping blocks (hl_active_min = SIZE_MAX). */
struct hl_live_slot {
    uintptr_t p;
    size_t req;
};
#define HL_LIVE_START 1024
static struct hl_live_slot hl_live_static[HL_LIVE_START];
static struct hl_live_slot *hl_live = hl_live_static;
static size_t hl_live_cap = HL_LIVE_START, hl_live_n;

static inline size_t hl_hash(uintptr_t p, size_t cap) {
    return (size_t)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static void hl_live_put_in(struct hl_live_slot *t, size_t cap, uintptr_t p, size_t req) {
    size_t i = hl_hash(p, cap);
    while (t[i].p && t[i].p != p) i = (i + 1) & (cap - 1);
    t[i].p = p;
    t[i].req = req;
}

static int hl_live_add(void *p, size_t req) {
    if ((hl_live_n + 1) * 2 > hl_live_cap) {
        size_t cap = hl_live_cap * 2;
        void *m = mmap(NULL, cap * sizeof *hl_live, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 0;
        struct hl_live_slot *t = m;
        for (size_t i = 0; i < hl_live_cap; i++)
            if (hl_live[i].p) hl_live_put_in(t, cap, hl_live[i].p, hl_live[i].req);
        if (hl_live != hl_live_static) munmap(hl_live, hl_live_cap * sizeof *hl_live);
        hl_live = t;
        hl_live_cap = cap;
    }
    size_t i = hl_hash((uintptr_t)p, hl_live_cap);
    while (hl_live[i].p && hl_live[i].p != (uintptr_t)p) i = (i + 1) & (hl_live_cap - 1);
    if (!hl_live[i].p) hl_live_n++;
    hl_live[i].p = (uintptr_t)p;
    hl_live[i].req = req;
    return 1;
}

/* Remove p; its requested size, or 0 if p is not a live block of ours. */
static size_t hl_live_take(void *p) {
    size_t mask = hl_live_cap - 1, i = hl_hash((uintptr_t)p, hl_live_cap);
    while (hl_live[i].p != (uintptr_t)p) {
        if (!hl_live[i].p) return 0;
        i = (i + 1) & mask;
    }
    size_t req = hl_live[i].req;
    hl_live_n--;
    for (size_t j = (i + 1) & mask; hl_live[j].p; j = (j + 1) & mask) {
        size_t home = hl_hash(hl_live[j].p, hl_live_cap);
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            hl_live[i] = hl_live[j];
            i = j;
        }
    }
    hl_live[i].p = 0;
    return req ? req : 1;
}

/* A large block handed to the program (lock not held). */
static void hl_track(void *p, size_t req) {
    if (p == NULL) return;
    pthread_mutex_lock(&hl_lock);
    if (!hl_live_add(p, req)) hl_active_min = SIZE_MAX; /* no memory for the set: step aside */
    pthread_mutex_unlock(&hl_lock);
}

static inline uint64_t hl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------- */
/* Per-thread predictor                                                                           */

static pthread_key_t hl_key;
static int hl_key_ok;
static __thread struct hcp_counter *hl_counter;
static __thread int hl_thread_state; /* 0 new, 1 registered, 2 exited */
static uint8_t hl_table[HCP_TOKENS][HCP_TOKENS];
static int hl_use_table;

static void hl_thread_exit(void *v) {
    struct hcp_counter *c = v;
    hl_thread_state = 2;
    hl_counter = NULL;
    if (c) munmap(c, sizeof *c);
}

static struct hcp_counter *hl_thread_counter(void) {
    if (HL_LIKELY(hl_counter != NULL)) return hl_counter;
    if (hl_thread_state != 0) return NULL; /* exited, or being registered (re-entry) */
    hl_thread_state = 1;
    void *m = mmap(NULL, sizeof(struct hcp_counter), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    if (hl_key_ok) pthread_setspecific(hl_key, m); /* may calloc (keys >= 32): state 1 guards */
    hl_counter = m;
    return m;
}

/* Token stream: the thread's calls on large blocks. */
static inline void hl_learn_alloc(size_t req) {
    if (hl_set.policy != HL_GUIDED) return;
    struct hcp_counter *c = hl_thread_counter();
    if (c) hcp_learn(c, hcp_class(req));
}

/* guided: learn the free, then ask whether an allocation of its class comes soon. */
static int hl_predict_reuse(size_t req) {
    struct hcp_counter *c = hl_thread_counter();
    unsigned cls = hcp_class(req);
    if (c == NULL) return 0;
    hcp_learn(c, HCP_FREE + cls);
    if (hl_use_table) return (unsigned)hl_table[HCP_FREE + cls][cls] * (unsigned)hl_set.topk >= 255u;
    return hcp_soon(c, cls, (unsigned)hl_set.topk, (unsigned)hl_set.horizon);
}

/* ------------------------------------------------------------------------------------------- */
/* Kept blocks                                                                                    */

static inline int hl_fits(size_t usable, size_t n) { return usable >= n && usable - n < n + 4096; }

static void hl_drop(int i, int decayed) {
    hl_bytes_kept -= hl_kept[i].usable;
    hl_stats.given_back++;
    hl_stats.bytes_given_back += hl_kept[i].usable;
    hl_stats.decayed += (uint64_t)decayed;
    hl_kept[i] = hl_kept[--hl_nkept];
}

#define HL_OUT_MAX 8
struct hl_out {
    int n;
    void *p[HL_OUT_MAX];
};

/* seed001/guided: blocks idle longer than `decay` go back (at most HL_OUT_MAX per call). */
static void hl_decay(struct hl_out *out, uint64_t now) {
    if (hl_set.policy == HL_SEED002) return;
    for (int i = 0; i < hl_nkept && out->n < HL_OUT_MAX;) {
        if (now - hl_kept[i].since > hl_set.decay_ns) {
            out->p[out->n++] = hl_kept[i].p;
            hl_drop(i, 1);
        } else {
            i++;
        }
    }
}

static void hl_release(struct hl_out *out) {
    void (*f)(void *) = hl_real.free;
    for (int i = 0; i < out->n; i++) f(out->p[i]);
}

static void hl_advise_idle(uint64_t now);

/* A kept block for n bytes at an address multiple of `align` (power of two, or 0), taken out of
 * the kept blocks and made live; NULL if none fits. */
static void *hl_take(size_t n, size_t align) {
    if (n < hl_active_min) return NULL;
    uintptr_t mask = align > 1 ? (uintptr_t)(align - 1) : 0;
    struct hl_out out = {0};
    void *p = NULL;
    uint64_t now = hl_set.policy == HL_SEED002 && hl_set.madv_ns <= 0 ? 0 : hl_now();
    pthread_mutex_lock(&hl_lock);
    hl_decay(&out, now);
    int best = -1;
    for (int i = 0; i < hl_nkept; i++)
        if (hl_fits(hl_kept[i].usable, n) && ((uintptr_t)hl_kept[i].p & mask) == 0 &&
            (best < 0 || hl_kept[i].stamp > hl_kept[best].stamp))
            best = i;
    if (best >= 0) {
        p = hl_kept[best].p;
        hl_bytes_kept -= hl_kept[best].usable;
        hl_kept[best] = hl_kept[--hl_nkept];
        hl_stats.hits++;
        if (!hl_live_add(p, n)) hl_active_min = SIZE_MAX;
    } else {
        hl_stats.misses++;
        hl_stats.passed++;
    }
    pthread_mutex_unlock(&hl_lock);
    hl_release(&out);
    hl_advise_idle(now);
    return p;
}

static uint64_t hl_advise_at; /* the next scan for idle blocks to advise (under hl_lock) */

static void hl_madvise(void *p, size_t usable) {
#ifdef MADV_FREE
    /* whole pages inside the block only: the first page holds the next allocator's header */
    uintptr_t a = ((uintptr_t)p + hl_page - 1) & ~(uintptr_t)(hl_page - 1);
    uintptr_t b = ((uintptr_t)p + usable) & ~(uintptr_t)(hl_page - 1);
    if (b > a && madvise((void *)a, b - a, MADV_FREE) == 0)
        __atomic_fetch_add(&hl_stats.bytes_advised, b - a, __ATOMIC_RELAXED);
#else
    (void)p;
    (void)usable;
#endif
}

/* madv > 0: the pages of blocks kept idle for `madv` ms are madvise(MADV_FREE)d, a few per
 * call, at most every madv/2 ms (lazily: a block reused at once, the tight loop, never pays the
 * syscall and its TLB flush). A block being advised is out of the cache meanwhile, so no other
 * thread can take it while the kernel may still drop its pages. */
static void hl_advise_idle(uint64_t now) {
    if (hl_set.madv_ns <= 0 || now < __atomic_load_n(&hl_advise_at, __ATOMIC_RELAXED)) return;
    struct hl_kept todo[4];
    int n = 0;
    pthread_mutex_lock(&hl_lock);
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
    pthread_mutex_unlock(&hl_lock);
    if (n == 0) return;
    for (int i = 0; i < n; i++) hl_madvise(todo[i].p, todo[i].usable);
    struct hl_out out = {0};
    pthread_mutex_lock(&hl_lock);
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
    pthread_mutex_unlock(&hl_lock);
    hl_release(&out);
}

/* Take p out of the kept blocks (under hl_lock); 1 if it was kept. */
static int hl_unkeep(void *p) {
    for (int i = 0; i < hl_nkept; i++)
        if (hl_kept[i].p == p) {
            hl_bytes_kept -= hl_kept[i].usable;
            hl_kept[i] = hl_kept[--hl_nkept];
            return 1;
        }
    return 0;
}

/* The program frees p (usable >= min). */
static void hl_free_large(void *p, size_t usable) {
    void (*real_free)(void *) = hl_real.free;
    int advised = hl_set.madv_ns == 0;
    uint64_t now = hl_set.policy == HL_SEED002 && hl_set.madv_ns <= 0 ? 0 : hl_now();
    pthread_mutex_lock(&hl_lock);
    size_t req = hl_live_take(p);
    if (req == 0) {
        /* not a live block of ours: a foreign pointer, a block from before the start, or a
         * double free. If it is kept, the program freed it twice: the block leaves the cache
         * and both frees reach the real free, which reports it as it would without the layer. */
        int twice = hl_unkeep(p);
        if (twice) hl_stats.double_frees++;
        else hl_stats.untracked++;
        hl_stats.passed++;
        pthread_mutex_unlock(&hl_lock);
        if (twice) real_free(p);
        real_free(p);
        return;
    }
    /* one lock hold for the whole decision (the predictor is this thread's: no sharing) */
    int keep = usable <= hl_set.cap;
    if (hl_set.policy == HL_GUIDED) keep = hl_predict_reuse(req) && keep;
    if (hl_set.policy == HL_SEED002 && hl_set.n == 0) keep = 0;
    if (!keep) {
        hl_stats.passed++;
        pthread_mutex_unlock(&hl_lock);
        real_free(p);
        return;
    }
    if (advised) { /* madv=0: advise before other threads can take it, outside the lock */
        pthread_mutex_unlock(&hl_lock);
        hl_madvise(p, usable);
        pthread_mutex_lock(&hl_lock);
    }
    struct hl_out out = {0};
    hl_decay(&out, now);
    if (hl_set.policy == HL_SEED002 && hl_nkept >= hl_set.n) {
        int small = 0;
        for (int i = 1; i < hl_nkept; i++)
            if (hl_kept[i].usable < hl_kept[small].usable ||
                (hl_kept[i].usable == hl_kept[small].usable &&
                 hl_kept[i].stamp < hl_kept[small].stamp))
                small = i;
        if (usable >= hl_kept[small].usable) {
            out.p[out.n++] = hl_kept[small].p;
            hl_drop(small, 0);
        } else {
            keep = 0;
        }
    }
    /* the cap (and the table's size): the oldest go back (seed002: the smallest) */
    while (keep && hl_nkept > 0 && out.n < HL_OUT_MAX &&
           (hl_bytes_kept + usable > hl_set.cap || hl_nkept >= HL_MAX_KEPT)) {
        int v = 0;
        for (int i = 1; i < hl_nkept; i++)
            if (hl_set.policy == HL_SEED002 ? hl_kept[i].usable < hl_kept[v].usable
                                           : hl_kept[i].stamp < hl_kept[v].stamp)
                v = i;
        out.p[out.n++] = hl_kept[v].p;
        hl_drop(v, 0);
    }
    if (keep && (hl_bytes_kept + usable > hl_set.cap || hl_nkept >= HL_MAX_KEPT)) keep = 0;
    if (keep) {
        hl_kept[hl_nkept++] = (struct hl_kept){p, usable, ++hl_stamp, now, advised};
        hl_bytes_kept += usable;
        hl_stats.kept++;
        if (hl_bytes_kept > hl_stats.bytes_kept_peak) hl_stats.bytes_kept_peak = hl_bytes_kept;
    } else {
        hl_stats.passed++;
    }
    pthread_mutex_unlock(&hl_lock);
    if (!keep) real_free(p);
    hl_release(&out);
    hl_advise_idle(now);
}

/* ------------------------------------------------------------------------------------------- */
/* Hooks                                                                                          */

static void *hl_malloc_large(size_t n) {
    hl_learn_alloc(n);
    void *p = hl_take(n, 0);
    if (p) return p;
    p = hl_real.malloc(n);
    hl_track(p, n);
    return p;
}

HL_EXPORT void *malloc(size_t n) {
    void *(*f)(size_t) = HL_REAL(malloc);
    if (HL_UNLIKELY(!f)) return hc_pool_alloc(n, 16);
    if (HL_LIKELY(n < hl_active_min)) return f(n);
    return hl_malloc_large(n);
}

HL_EXPORT void free(void *p) {
    if (p == NULL || HL_UNLIKELY(hc_in_pool(p))) return;
    void (*real_free)(void *) = HL_REAL(free);
    if (HL_UNLIKELY(!real_free)) return; /* cannot happen: p came from somewhere */
    if (hl_active_min != SIZE_MAX) {
        size_t usable = hl_real.malloc_usable_size(p);
        if (usable >= hl_active_min) {
            hl_free_large(p, usable);
            return;
        }
    }
    real_free(p);
}

HL_EXPORT void *calloc(size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    void *(*f)(size_t, size_t) = HL_REAL(calloc);
    if (HL_UNLIKELY(!f)) return hc_pool_alloc(total, 16);
    if (HL_LIKELY(total < hl_active_min)) return f(m, n);
    hl_learn_alloc(total);
    void *p = hl_take(total, 0);
    if (p) return memset(p, 0, total);
    p = f(m, n);
    hl_track(p, total);
    return p;
}

HL_EXPORT void *realloc(void *old, size_t n) {
    if (old == NULL) return malloc(n);
    if (HL_UNLIKELY(hc_in_pool(old))) {
        void *q = malloc(n);
        if (q) {
            size_t o = hc_pool_size(old);
            memcpy(q, old, o < n ? o : n);
        }
        return q;
    }
    if (n == 0) {
        free(old);
        return NULL;
    }
    void *(*real_realloc)(void *, size_t) = HL_REAL(realloc);
    if (HL_UNLIKELY(!real_realloc)) {
        /* start-up (dlsym re-entry), and old is not a pool block: it cannot be resized yet; a
         * failed realloc keeps the old block, as C allows */
        errno = ENOMEM;
        return NULL;
    }
    if (hl_active_min == SIZE_MAX) return real_realloc(old, n);
    size_t usable = hl_real.malloc_usable_size(old);
    if (usable < hl_active_min && n < hl_active_min) return real_realloc(old, n);
    /* a large block on either side: a kept block that fits n, old copied and freed (into the
     * cache); otherwise the real realloc (in place, or mremap: no copy) */
    if (n >= hl_active_min) {
        hl_learn_alloc(n);
        void *q = hl_take(n, 0);
        if (q) {
            memcpy(q, old, usable < n ? usable : n);
            free(old);
            return q;
        }
    }
    size_t req = 0;
    int kept = 0;
    if (usable >= hl_active_min) {
        pthread_mutex_lock(&hl_lock);
        req = hl_live_take(old);
        if (req == 0) kept = hl_unkeep(old); /* realloc of a freed block the cache holds */
        pthread_mutex_unlock(&hl_lock);
    }
    if (HL_UNLIKELY(kept)) {
        /* the program freed old and then reallocs it: the free the cache held back reaches
         * the real allocator first, then the realloc, as without the layer (never two owners) */
        hl_real.free(old);
    }
    void *q = real_realloc(old, n);
    if (q == NULL) {
        if (req) hl_track(old, req); /* failed: old stays the program's */
        return NULL;
    }
    if (n >= hl_active_min) hl_track(q, n);
    return q;
}

HL_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

static inline int hl_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* The aligned forms: a kept block serves one only if its address has the alignment; invalid
 * arguments go to the next allocator, which reports them as it does. */
static void *hl_aligned_large(size_t align, size_t n, void *(*f)(size_t, size_t)) {
    hl_learn_alloc(n);
    void *p = hl_take(n, align);
    if (p) return p;
    p = f(align, n);
    hl_track(p, n);
    return p;
}

HL_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    int (*f)(void **, size_t, size_t) = HL_REAL(posix_memalign);
    if (HL_UNLIKELY(!f)) {
        if (!hl_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
        void *p = hc_pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align) || align % sizeof(void *) != 0)
        return f(out, align, n);
    hl_learn_alloc(n);
    void *p = hl_take(n, align);
    if (p) {
        *out = p;
        return 0;
    }
    int rc = f(out, align, n);
    if (rc == 0) hl_track(*out, n);
    return rc;
}

HL_EXPORT void *aligned_alloc(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HL_REAL(aligned_alloc);
    if (HL_UNLIKELY(!f)) return hl_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align)) return f(align, n);
    return hl_aligned_large(align, n, f);
}

HL_EXPORT void *memalign(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HL_REAL(memalign);
    if (HL_UNLIKELY(!f)) return hl_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    if (HL_LIKELY(n < hl_active_min) || !hl_pow2(align)) return f(align, n);
    return hl_aligned_large(align, n, f);
}

HL_EXPORT void *valloc(size_t n) {
    void *(*f)(size_t) = HL_REAL(valloc);
    if (HL_UNLIKELY(!f)) return hc_pool_alloc(n, hl_page);
    if (HL_LIKELY(n < hl_active_min)) return f(n);
    hl_learn_alloc(n);
    void *p = hl_take(n, hl_page);
    if (p) return p;
    p = f(n);
    hl_track(p, n);
    return p;
}

HL_EXPORT void *pvalloc(size_t n) {
    void *(*f)(size_t) = HL_REAL(pvalloc);
    size_t rounded = (n + hl_page - 1) & ~(hl_page - 1);
    if (HL_UNLIKELY(!f)) return rounded >= n ? hc_pool_alloc(rounded, hl_page) : NULL;
    if (HL_LIKELY(rounded < hl_active_min) || rounded < n) return f(n);
    hl_learn_alloc(rounded);
    void *p = hl_take(rounded, hl_page);
    if (p) return p;
    p = f(n);
    hl_track(p, rounded);
    return p;
}

HL_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (HL_UNLIKELY(hc_in_pool(p))) return hc_pool_size(p);
    size_t (*f)(void *) = HL_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}

/* ------------------------------------------------------------------------------------------- */
/* Table file                                                                                     */

#define HL_TABLE_MAGIC "HCLTAB\0\1"
#define HL_TABLE_VERSION 1u
#define HL_FALLBACK "; the guided policy uses the online counter"

static uint64_t hl_fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Load the table into hl_table; NULL, or why it is refused. */
static const char *hl_load_table(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot be opened" HL_FALLBACK;
    unsigned char head[32];
    static unsigned char payload[HCP_TOKENS * HCP_TOKENS + 1];
    ssize_t a = read(fd, head, sizeof head);
    ssize_t b = a == (ssize_t)sizeof head ? read(fd, payload, sizeof payload) : -1;
    close(fd);
    if (a != (ssize_t)sizeof head) return "is shorter than its 32-byte header" HL_FALLBACK;
    if (memcmp(head, HL_TABLE_MAGIC, 8) != 0) return "is not a heapcast layer table (magic)" HL_FALLBACK;
    uint32_t version, model, tokens, bytes;
    uint64_t sum;
    memcpy(&version, head + 8, 4);
    memcpy(&model, head + 12, 4);
    memcpy(&tokens, head + 16, 4);
    memcpy(&bytes, head + 20, 4);
    memcpy(&sum, head + 24, 8);
    if (version != HL_TABLE_VERSION) return "has another format version (this layer reads 1)" HL_FALLBACK;
    if (tokens != HCP_TOKENS || bytes != HCP_TOKENS * HCP_TOKENS)
        return "has another shape (64 tokens, 4096 payload bytes expected)" HL_FALLBACK;
    if (b != (ssize_t)bytes) return "has a payload of the wrong length (truncated or extended)" HL_FALLBACK;
    if (hl_fnv1a(payload, bytes) != sum) return "is corrupt (payload checksum)" HL_FALLBACK;
    if (model == 0) return "names no model version" HL_FALLBACK;
    if (hl_set.model && model != hl_set.model) return "comes from another model version" HL_FALLBACK;
    memcpy(hl_table, payload, sizeof hl_table);
    return NULL;
}

/* ------------------------------------------------------------------------------------------- */
/* Start, fork, exit                                                                              */

static void hl_fork_prepare(void) { pthread_mutex_lock(&hl_lock); }
static void hl_fork_parent(void) { pthread_mutex_unlock(&hl_lock); }
static void hl_fork_child(void) { pthread_mutex_unlock(&hl_lock); }

__attribute__((constructor)) static void hl_init(void) {
    hl_resolve();
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) hl_page = (size_t)page;
    struct hl_settings st = hl_set;
    if (!hl_read_settings(&st)) {
        hl_set.policy = HL_OFF;
        return; /* pass-through (said on stderr) */
    }
    hl_set = st;
    if (hl_set.policy == HL_GUIDED && hl_set.table[0]) {
        const char *why = hl_load_table(hl_set.table);
        if (why) {
            hl_stats.table_refused = 1;
            hl_say("table file ", hl_set.table, " refused: it ", why);
        } else {
            hl_use_table = 1;
        }
    }
    if (hl_set.policy == HL_GUIDED) hl_key_ok = pthread_key_create(&hl_key, hl_thread_exit) == 0;
    pthread_atfork(hl_fork_prepare, hl_fork_parent, hl_fork_child);
    if (hl_set.policy != HL_OFF && hl_real.malloc_usable_size && hl_real.free)
        __atomic_store_n(&hl_active_min, hl_set.min, __ATOMIC_RELEASE);
}

__attribute__((destructor)) static void hl_fini(void) {
    if (!hl_set.stats[0]) return;
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    pthread_mutex_lock(&hl_lock);
#define F(key, v) p = hl_num(hl_cat(p, end, key "="), end, (uint64_t)(v)), p = hl_cat(p, end, " ")
    F("pid", getpid());
    F("policy", hl_set.policy);
    F("table", hl_use_table);
    F("hits", hl_stats.hits);
    F("misses", hl_stats.misses);
    F("kept", hl_stats.kept);
    F("bytes_kept_peak", hl_stats.bytes_kept_peak);
    F("bytes_kept_at_exit", hl_bytes_kept);
    F("given_back", hl_stats.given_back);
    F("bytes_given_back", hl_stats.bytes_given_back);
    F("bytes_advised", hl_stats.bytes_advised);
    F("decayed", hl_stats.decayed);
    F("passed", hl_stats.passed);
    F("double_frees", hl_stats.double_frees);
    /* frees of blocks >= min it did not hand out: made before it started, asked for below min,
     * or not the allocator's at all (a foreign pointer) */
    F("untracked", hl_stats.untracked);
    F("table_refused", hl_stats.table_refused);
#undef F
    pthread_mutex_unlock(&hl_lock);
    p[-1] = '\n';
    if (!strcmp(hl_set.stats, "1")) {
        char out[800];
        char *q = hl_cat(out, out + sizeof out, "heapcast layer: ");
        size_t len = (size_t)(p - line);
        memcpy(q, line, len);
        hl_write(2, out, (size_t)(q - out) + len);
        return;
    }
    int fd = open(hl_set.stats, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        hl_write(fd, line, (size_t)(p - line));
        close(fd);
    }
}
