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
 *    thread's calls on large blocks in scope, predict then update, rolled forward with its own
 *    top-1; or a table file, `predictor=table:FILE`, ../TABLE.md). Causal: only the thread's
 *    past is used.
 *  - off: everything passes through (the loading cost alone).
 * Requests are served from the kept blocks by one rule: the most recently kept block that fits
 * (usable >= n and usable - n < n + 4096: at most half a block plus a page wasted) and has the
 * alignment asked for (the thread's front first, then the shared cache); calloc clears the n
 * bytes. No fit: the next allocator.
 * What any policy may keep (a free it cannot keep goes to the next allocator, counted): a block
 * glibc made by mmap (`scope=mapped`, the default, which takes in glibc's heap blocks too once
 * glibc has trimmed its heap at a large free: hl_pass_free; `scope=all`: heap blocks always;
 * `heap` in the stats counts the frees left to glibc's heap), and not one the program has just
 * outgrown (its thread's last request was larger and this block is what the request before
 * got: grown by malloc, copy and free; `outgrown`).
 * Both keep the cache from holding memory the program would not have held under glibc: small
 * programs held 4-24% more, a threaded stress 25-40% more (hl_in_scope, hl_free_large).
 * And a bound (`peak`, default 4%): at a miss that maps new memory, kept blocks go back until
 * the large blocks live plus those kept (fronts included) are within the program's own peak of
 * live large blocks plus 4%, which is what glibc, unmapping each at its free, holds at most
 * (hl_bound). A training step's freed tensors, kept while the next step's grew, had made
 * keras_video peak at 1.09x glibc's memory. `bounded` in the stats counts those given back.
 *
 * Ownership: the layer makes no blocks of its own; every block is the next allocator's, so
 * realloc, malloc_usable_size & co. of any pointer go there. The layer knows which large blocks
 * it handed out (a set of live blocks >= `min`, with their requested sizes): only those are
 * ever kept. A free of anything else (a foreign pointer, a block made before the layer started,
 * a double free) goes to the real free as the program made it; a block freed while it is kept
 * (a double free, from any thread) leaves the cache and both frees reach the real free, which
 * reports it as it would without the layer. Blocks below `min` (the tight loops) never take a
 * lock: malloc adds one compare, free one read of glibc's size word before the block (over
 * another allocator, malloc_usable_size). Nor do blocks out of scope (glibc's
 * heap): untracked, their frees go straight to glibc (hl_track, hl_free_large).
 *
 * Threads (locks are taken only for blocks >= `min`, whose real cost is an mmap or munmap;
 * syscalls (madvise) and the real allocator are called outside them; each, the shared cache's
 * and a shard's, is a test-and-set word that spins a little and then yields its core):
 *  - seed002: one lock over the kept blocks and the live set, as its rule (the n largest in the
 *    process) needs the whole cache at every free. 8 threads freeing and taking 256 KiB blocks
 *    on 2 cores pay ~90-250 ns a pair there (glibc ~25-35: its dynamic mmap threshold keeps
 *    such blocks in its heap; benchmarks/bench_layer.py).
 *  - seed001, guided: the block a thread kept last waits in the thread's own front (TLS), and
 *    the thread's next request that it fits takes it back under one of 16 live-set shards'
 *    locks (by address), never the shared cache's: ~45-75 ns a pair in the same loop (it was
 *    ~160-330 with one lock). Its live-set slot carries the front's ticket: a second free by
 *    any thread finds it there (double free, as above), and the front, finding its ticket gone,
 *    forgets the block without touching it. An older front block moves to the shared cache
 *    (hl_lock, then a shard's: the one order), under the same rules as any kept block. A front
 *    counts against the cap through the thread's reservation (the largest block its front
 *    held); its block is not advised, and decays at the thread's next large call; at the
 *    thread's exit (pthread key destructor) it joins the shared cache. A thread that finds
 *    nothing in the shared cache takes a fitting block from another thread's front (hl_steal:
 *    the fronts' hints, then the shard and the ticket decide), so an idle thread holds nothing
 *    the others need. The order of reuse across threads differs from one shared cache's (the
 *    simulator's one cache is exact for one thread).
 * The predictor is per thread (initial-exec TLS pointer to an mmapped counter, unmapped by the
 * same destructor). fork: pthread_atfork holds every lock across fork; the child keeps its copy
 * of the shared cache and of the forking thread's front (the other threads' fronts stay out of
 * reach there: at most one block each, never handed out).
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
 * are in ../TABLE.md (the one description; tasks/learning/table.py writes it). In short (format
 * 3): a header, a keep score per size class, and (call site, class) entries in rising order; a
 * free whose (site, class) the table has reads that entry, any other asks the online counter (a
 * file without entries, or format 2: the class's score). A file it cannot trust is refused with
 * one line on stderr, and the online counter is used.
 *
 * Not async-signal-safe (neither is glibc's malloc).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../bootstrap_pool.h"
#include "../module_range.h"
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
    X(scope, "mapped", "mapped: keep only blocks glibc would give back to the kernel | all")       \
    X(n, "4", "seed002: blocks kept at most (0..64)")                                             \
    X(madv, "100", "MADV_FREE a kept block's pages once idle this many ms (0: at once; off)")     \
    X(decay, "1000", "seed001, guided: a block idle this many ms is given back")                  \
    X(topk, "2", "guided: keep class c when it is among the k most likely calls ...")             \
    X(horizon, "4", "guided: ... at one of the next h calls (the counter rolled forward)")        \
    X(predictor, "online", "guided: online (the thread's counter) | table:FILE (TABLE.md)")       \
    X(model, "0", "table: the model version the file must come from (0: any)")                    \
    X(follow, "1", "1: raise glibc's mmap threshold as glibc would on the frees it keeps; 0: no") \
    X(peak, "4", "kept blocks never lift live + kept above the live blocks' peak + this % (off)") \
    X(proof, "2", "keep nothing until N requests could have reused a block passed on (0: at once)") \
    X(regret, "0", "guided: 1: keep a class the process asked again for soon after passing one on") \
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
    int follow;      /* raise glibc's mmap threshold as glibc would (hl_follow) */
    int scope_all;   /* keep blocks from glibc's heap too (scope=all) */
    int peak;        /* hl_bound's headroom in % of the live blocks' peak; -1: no bound */
    int proof;       /* hl_ghost_hit: reuses seen before anything is kept */
    int regret;      /* guided: the process's regrets overrule the thread's counter (hl_regret) */
    char table[512]; /* table file path ("" = online counter) */
    char stats[512]; /* "" none, "1" stderr, else a path */
};
static struct hl_settings hl_set = {.policy = HL_OFF, .min = SIZE_MAX, .peak = -1};

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
    if (!strcmp(name, "scope")) {
        if (!strcmp(v, "mapped") || !strcmp(v, "all")) return st->scope_all = v[0] == 'a', 1;
        return 0;
    }
    if (!strcmp(name, "peak")) {
        if (!strcmp(v, "off")) return st->peak = -1, 1;
        return hl_parse_int(v, 0, 1000, &x) ? (st->peak = (int)x, 1) : 0;
    }
    if (!strcmp(name, "proof"))
        return hl_parse_int(v, 0, 1 << 20, &x) ? (st->proof = (int)x, 1) : 0;
    if (!strcmp(name, "follow")) return hl_parse_int(v, 0, 1, &x) ? (st->follow = (int)x, 1) : 0;
    if (!strcmp(name, "regret")) return hl_parse_int(v, 0, 1, &x) ? (st->regret = (int)x, 1) : 0;
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
#define X(name, dflt, doc) " " #name
            hl_say("cannot parse HEAPCAST_LAYER item '", item, "' (options:" HL_OPTIONS(X) ")",
                   "; running as a pass-through");
#undef X
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
    int (*mallopt)(int, int);
};
static struct hl_real hl_real;

static void hl_resolve(void) {
    static int resolving;
    if (__atomic_exchange_n(&resolving, 1, __ATOMIC_ACQUIRE)) return; /* nested: the pool */
    struct hl_real r;
#define L(name) r.name = (__typeof__(r.name))dlsym(RTLD_NEXT, #name)
    L(malloc), L(free), L(calloc), L(realloc), L(posix_memalign), L(aligned_alloc), L(memalign);
    L(valloc), L(pvalloc), L(malloc_usable_size), L(mallopt);
#undef L
#define P(name) __atomic_store_n(&hl_real.name, r.name, __ATOMIC_RELEASE)
    P(mallopt), P(free), P(malloc_usable_size), P(realloc), P(posix_memalign), P(aligned_alloc);
    P(memalign);
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
static size_t hl_front_bytes; /* the threads' front reservations, counted against the cap */

static struct {
    uint64_t hits, kept, bytes_kept_peak, given_back, bytes_given_back, bytes_advised;
    uint64_t double_frees, untracked, decayed, table_refused;
    uint64_t live_peak; /* bytes: the program's large blocks live at once, at most (hl_bound) */
} hl_stats;
/* The counters taken outside hl_lock (a free the policy declines takes only its shard's lock, or
 * none for glibc's heap; a miss is known after the other threads' fronts are asked), one stripe
 * of them per thread: one counter line for all made 8 threads passing 256 KiB heap blocks meet
 * on it at every call. A thread owns its stripe (claimed at its first count from a mask, given
 * back by its key's destructor, hl_thread_exit), so it counts with a plain load and store: the
 * atomic add it replaces (~4.7 ns here, one at each large call passed on) was half of what the
 * layer added to glibc's own large heap blocks (perf: 74-77% of hl_take's and hl_free_large's
 * samples on it). A thread finding none free (HL_STRIPES live threads) or without a destructor
 * shares the last stripe, counting atomically. Summed at exit; a stripe given back keeps its
 * counts, and its next owner adds to them (the mask's release and acquire order the two). */
#define HL_STRIPES 64 /* owned; hl_stripes[HL_STRIPES] is the shared one */
struct hl_stripe {
    /* calls passed through, one counter each (the stats' `passed` is their sum): misses, and
     * frees left to glibc's heap, of outgrown blocks, or declined otherwise (policy, cap, a
     * double free, a block the layer did not hand out) */
    uint64_t misses, heap, outgrown, declined, unproven;
    uint64_t bounded;
} __attribute__((aligned(64)));
static struct hl_stripe hl_stripes[HL_STRIPES + 1];
static uint64_t hl_stripes_owned; /* bit i: stripe i belongs to a live thread */
static __thread struct hl_stripe *hl_my_stripe;
static __thread int hl_my_stripe_slot = -1;
static pthread_key_t hl_key; /* its destructor: hl_thread_exit */
static int hl_key_ok;

/* A free bit of *used, now set, or -1 (all set). */
static int hl_slot_claim(uint64_t *used) {
    uint64_t u = __atomic_load_n(used, __ATOMIC_RELAXED);
    while (u != ~(uint64_t)0) {
        int i = __builtin_ctzll(~u);
        if (__atomic_compare_exchange_n(used, &u, u | (uint64_t)1 << i, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return i;
    }
    return -1;
}

static uint64_t hl_stripe_sharers; /* threads that count on the shared stripe (stats) */

static __attribute__((noinline)) struct hl_stripe *hl_stripe_claim(void) {
    hl_my_stripe = &hl_stripes[HL_STRIPES]; /* first: a count made meanwhile (re-entry) shares */
    /* own one only where the destructor will give it back: a thread's key value is NULL until
     * set (pthread_setspecific may calloc: a small block, never counted) */
    int i = -1;
    if (hl_key_ok && (pthread_getspecific(hl_key) != NULL ||
                      pthread_setspecific(hl_key, (void *)&hl_my_stripe) == 0))
        i = hl_slot_claim(&hl_stripes_owned);
    if (i < 0) {
        __atomic_fetch_add(&hl_stripe_sharers, 1, __ATOMIC_RELAXED);
        return hl_my_stripe;
    }
    hl_my_stripe_slot = i;
    return hl_my_stripe = &hl_stripes[i];
}

static void hl_stripe_release(void) { /* at the thread's exit: later counts share */
    int i = hl_my_stripe_slot;
    hl_my_stripe = &hl_stripes[HL_STRIPES];
    hl_my_stripe_slot = -1;
    if (i >= 0) __atomic_fetch_and(&hl_stripes_owned, ~((uint64_t)1 << i), __ATOMIC_RELEASE);
}

static inline void hl_count(size_t offset) {
    struct hl_stripe *s = hl_my_stripe;
    if (HL_UNLIKELY(s == NULL)) s = hl_stripe_claim();
    uint64_t *f = (uint64_t *)((char *)s + offset);
    if (HL_LIKELY(s != &hl_stripes[HL_STRIPES]))
        __atomic_store_n(f, __atomic_load_n(f, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(f, 1, __ATOMIC_RELAXED);
}
#define HL_COUNT(field) hl_count(offsetof(struct hl_stripe, field))
static uint64_t hl_striped(size_t offset) { /* a field's sum over the stripes */
    uint64_t n = 0;
    for (int i = 0; i <= HL_STRIPES; i++)
        n += __atomic_load_n((uint64_t *)((char *)&hl_stripes[i] + offset), __ATOMIC_RELAXED);
    return n;
}
#define HL_STRIPED(field) hl_striped(offsetof(struct hl_stripe, field))

/* Live set: the large blocks handed out (key: address, value: requested size) and the blocks
 * kept in a thread's front (ticket != 0), in HL_SHARDS shards by address, each under its own
 * lock: threads freeing and taking different blocks rarely meet. Open addressing with linear
 * probing, load <= 1/2, backward-shift deletion; grown by mmap (never malloc). If a shard cannot
 * grow, the layer stops keeping blocks (hl_active_min = SIZE_MAX). */
struct hl_live_slot {
    uintptr_t p;
    size_t req, usable;
    uint64_t ticket; /* 0: the program's; else in the front of the thread that holds this ticket */
};
/* A shard's lock: a test-and-set word (0 free, 1 held) whose unlock is a plain release store,
 * as snmalloc's and rpmalloc's locks are. Its holds are one probe of a shard's table, and each
 * atomic read-modify-write costs ~4.7 ns here: the futex word it replaces (U. Drepper, "Futexes
 * Are Tricky", mutex 2) needed one to give the lock back, so that a sleeper is woken, and a kept
 * pair takes the lock twice (256 KiB kept pairs, guided, 8 threads: 49.8 -> 40.1 ns, 1 thread:
 * 44.4 -> 35.3; benchmarks/results/layer_unlock.md).
 * A waiter spins a little, as glibc's adaptive mutex does, then yields its core: on 2 cores
 * with 8 threads the holder may be the one waiting for a core, and spinning would keep it
 * waiting. */
struct hl_spin {
    int w;
};

static inline void hl_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int hl_spin_try(struct hl_spin *l) {
    int free_ = 0;
    return __atomic_compare_exchange_n(&l->w, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static __attribute__((noinline)) void hl_spin_wait(struct hl_spin *l) {
    for (unsigned i = 0;; i++) {
        if (i < 100) hl_relax();
        else sched_yield();
        if (__atomic_load_n(&l->w, __ATOMIC_RELAXED) == 0 && hl_spin_try(l)) return;
    }
}

/* A process that has never started a thread takes no shard lock: glibc says so in
 * __libc_single_threaded (2.32+; weak, so that an older glibc just takes the locks), false from
 * the first pthread_create on, and its own malloc skips its arena locks on the same word. Each
 * lock was an atomic read-modify-write, ~4.7 ns here: a kept block's pair took four (256 KiB,
 * main alone: seed001 39.1 -> 26.5 ns, glibc 11.6). A lock not taken leaves its word 0, which
 * the unlock's store leaves as it is (a lock taken before a fork is given back in the child
 * likewise). A program that makes threads with a bare clone() breaks glibc's own malloc in the
 * same way. */
extern char __libc_single_threaded __attribute__((weak));

static inline int hl_single_threaded(void) {
    return &__libc_single_threaded != NULL &&
           __atomic_load_n(&__libc_single_threaded, __ATOMIC_RELAXED);
}

static inline void hl_spin_lock(struct hl_spin *l) {
    if (hl_single_threaded()) return;
    if (HL_UNLIKELY(!hl_spin_try(l))) hl_spin_wait(l);
}

/* A lock not taken (one thread) is 0 already, and storing 0 again is harmless: no other thread
 * exists to hold it. */
static inline void hl_spin_unlock(struct hl_spin *l) { __atomic_store_n(&l->w, 0, __ATOMIC_RELEASE); }

/* hl_lock, the shared cache's (and seed002's live set's): a lock of the same kind, skipped
 * likewise while the process has one thread (seed002 takes it at every large call: a kept
 * pair, main alone, 34.5 -> 26.4 ns). It was glibc's adaptive mutex, whose lock and unlock are
 * each a read-modify-write: seed002's kept pairs, 45.2 -> 33.1 ns with 1 thread
 * (benchmarks/results/layer_unlock.md). Its holds are longer than a shard's (the decay and
 * make-room scans of up to HL_MAX_KEPT blocks), which the waiters' yield covers. */
static struct hl_spin hl_lock;
static inline void hl_lock_take(void) { hl_spin_lock(&hl_lock); }
static inline void hl_lock_give(void) { hl_spin_unlock(&hl_lock); }

#define HL_SHARDS 16
#define HL_SHARD_START 128
struct hl_shard {
    struct hl_spin lock;
    struct hl_live_slot *t;
    size_t cap, n;
    uint64_t hits, kept; /* the fronts' (the shared cache's are in hl_stats) */
    uint64_t sited;      /* frees a table's call-site entry answered (counted under the lock) */
    size_t live, fronted; /* bytes (usable) of its slots: the program's, in a thread's front */
    struct hl_live_slot first[HL_SHARD_START];
} __attribute__((aligned(64)));
static struct hl_shard hl_shards[HL_SHARDS];

static inline uint64_t hl_mix(uintptr_t p) { return (uint64_t)p * 0x9E3779B97F4A7C15ull; }
static inline struct hl_shard *hl_shard_of(const void *p) {
    return &hl_shards[hl_mix((uintptr_t)p) >> 60]; /* the top bits; slots use bits 20 and up */
}
static inline size_t hl_hash(uintptr_t p, size_t cap) {
    return (size_t)(hl_mix(p) >> 20) & (cap - 1);
}

static void hl_shards_init(void) {
    for (int i = 0; i < HL_SHARDS; i++) {
        struct hl_shard *s = &hl_shards[i];
        s->t = s->first;
        s->cap = HL_SHARD_START;
    }
}

/* Fronts on (seed001, guided): each shard has its own lock, taken after hl_lock where both are
 * held. Off (seed002, whose rule needs hl_lock at every free anyway): hl_lock covers the live
 * set too, so that a call takes one lock, not two. */
static int hl_sharded;

/* The lock over s's slots, taken with no lock held; hl_live_unlock gives it back. */
static inline void hl_live_lock(struct hl_shard *s) {
    if (hl_sharded) hl_spin_lock(&s->lock);
    else hl_lock_take();
}

static inline void hl_live_unlock(struct hl_shard *s) {
    if (hl_sharded) hl_spin_unlock(&s->lock);
    else hl_lock_give();
}

static inline void hl_nested_lock(struct hl_shard *s) { /* hl_lock held */
    if (hl_sharded) hl_spin_lock(&s->lock);
}

static inline void hl_nested_unlock(struct hl_shard *s) {
    if (hl_sharded) hl_spin_unlock(&s->lock);
}

/* The slot of p in t (cap slots), or the empty slot where it would go. */
static inline size_t hl_probe(const struct hl_live_slot *t, size_t cap, uintptr_t p) {
    size_t i = hl_hash(p, cap);
    while (t[i].p && t[i].p != p) i = (i + 1) & (cap - 1);
    return i;
}

static struct hl_live_slot *hl_live_find(struct hl_shard *s, const void *p) {
    struct hl_live_slot *e = &s->t[hl_probe(s->t, s->cap, (uintptr_t)p)];
    return e->p ? e : NULL;
}

/* A shard's byte counts move under its lock and are read without it (hl_bound): one writer,
 * relaxed stores (plain moves on x86-64, no lock prefix). */
static inline void hl_bytes_move(size_t *from, size_t *to, size_t n) {
    if (from) __atomic_store_n(from, *from - n, __ATOMIC_RELAXED);
    if (to) __atomic_store_n(to, *to + n, __ATOMIC_RELAXED);
}

/* A slot leaves s's byte counts (it is removed, or replaced). */
static inline void hl_unaccount(struct hl_shard *s, const struct hl_live_slot *e) {
    hl_bytes_move(e->ticket ? &s->fronted : &s->live, NULL, e->usable);
}

/* Add p as the program's (under s->lock); 0 if the shard cannot grow. */
static int hl_live_add(struct hl_shard *s, void *p, size_t req, size_t usable) {
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap * 2;
        void *m = mmap(NULL, cap * sizeof *s->t, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 0;
        struct hl_live_slot *t = m;
        for (size_t i = 0; i < s->cap; i++)
            if (s->t[i].p) t[hl_probe(t, cap, s->t[i].p)] = s->t[i];
        if (s->t != s->first) munmap(s->t, s->cap * sizeof *s->t);
        s->t = t;
        s->cap = cap;
    }
    size_t i = hl_probe(s->t, s->cap, (uintptr_t)p);
    if (!s->t[i].p) s->n++;
    else hl_unaccount(s, &s->t[i]);
    s->t[i] = (struct hl_live_slot){(uintptr_t)p, req, usable, 0};
    hl_bytes_move(NULL, &s->live, usable);
    return 1;
}

/* Remove the slot e (under s->lock). */
static void hl_live_remove(struct hl_shard *s, struct hl_live_slot *e) {
    size_t mask = s->cap - 1, i = (size_t)(e - s->t);
    hl_unaccount(s, e);
    s->n--;
    for (size_t j = (i + 1) & mask; s->t[j].p; j = (j + 1) & mask) {
        size_t home = hl_hash(s->t[j].p, s->cap);
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->t[i] = s->t[j];
            i = j;
        }
    }
    s->t[i].p = 0;
}

/* Scope: glibc serves a block from its heap (below its mmap threshold, which follows the
 * largest freed mmapped block: hl_follow) or with a fresh mmap, unmapped at its free. Only the
 * second costs what a cache saves (the syscalls and a fault per page); a heap block glibc reuses
 * itself in ~25 ns, for any size, and the same block held in the cache is memory glibc cannot
 * use for anything else. Kept, heap blocks made the layer hold 25-40% more than glibc on a
 * threaded allocation stress (mstress, 12 MB) for no time gained. So by default (scope=mapped)
 * the layer keeps only blocks glibc made by mmap (IS_MMAPPED, bit 1 of the size word before
 * the block: glibc's chunk layout), when the next allocator is glibc's (__libc_malloc); over
 * another allocator it cannot tell, and keeps any. scope=all keeps heap blocks too: a
 * thread-per-connection server (kv_service) then held 8% less than under glibc, its threads'
 * blocks crossing arenas through the cache. */
static int hl_glibc_next;
static int hl_trimmed; /* glibc lowered its break at a large free the layer passed on */

/* glibc's size word before a block: its chunk's size, header included, in all but the 3 low
 * bits, which are flags (2: IS_MMAPPED). Read only when the next allocator is glibc's. */
static inline size_t hl_chunk_word(const void *p) { return ((const size_t *)p)[-1]; }

/* p is memory of its own mapping (over another allocator the layer cannot tell: as if so) */
static inline int hl_mapped(const void *p) {
    return !hl_glibc_next || (hl_chunk_word(p) & 2) != 0;
}

static inline int hl_in_scope(const void *p) {
    return hl_set.scope_all || hl_mapped(p) || __atomic_load_n(&hl_trimmed, __ATOMIC_RELAXED);
}

/* A large free the layer does not keep goes to the next allocator. glibc may then give heap
 * memory back too: when its top grows past the trim threshold it lowers the break (sbrk), and
 * the next blocks are faulted in again, page by page, as mmapped ones are. A training loop
 * freeing its 16 MB tensors together pays that at every step (seed 001's case: glibc 0.77 s,
 * the layer keeping them 0.63 s). So once glibc has trimmed at such a free, its heap blocks are
 * in scope too. sbrk(0) reads glibc's copy of the break (no syscall); another thread moving it
 * meanwhile can only turn scope on early. Thread arenas shrink their heaps without the break
 * and are not seen: their blocks stay glibc's. */
static void hl_pass_free(void *p) {
    void *brk0 = hl_glibc_next && !hl_trimmed ? sbrk(0) : NULL;
    hl_real.free(p);
    if (brk0 != NULL && (char *)sbrk(0) < (char *)brk0)
        __atomic_store_n(&hl_trimmed, 1, __ATOMIC_RELAXED);
}
/* The thread's last request >= min, and the blocks its last two such requests got (NULL: not
 * yet, or none): hl_free_large's outgrown rule. */
static __thread size_t hl_last_req;
static __thread void *hl_last_p, *hl_prev_p;

static void hl_bound(void);
static inline void hl_learn_request(size_t req);

/* A large block of the next allocator's is the program's (no lock held): entered in the live
 * set if in scope; 1 if it was. */
static int hl_live_track(void *p, size_t req) {
    if (p == NULL) return 0;
    hl_last_p = p;
    /* a block out of scope (glibc's heap) is never kept: its free goes straight to glibc
     * (hl_free_large), so it is not tracked either. Scope only widens (hl_trimmed), so it was
     * out of scope when made if it is at its free. */
    if (!hl_in_scope(p)) return 0;
    size_t usable = hl_real.malloc_usable_size(p);
    struct hl_shard *s = hl_shard_of(p);
    hl_live_lock(s);
    if (!hl_live_add(s, p, req, usable)) hl_active_min = SIZE_MAX; /* no memory for the set */
    hl_live_unlock(s);
    /* a mapped block is new memory; a heap block is not, and giving kept blocks back to glibc's
     * heap then frees no page (bigblocks, heap in scope once trimmed: 4.9 MB against 4.0) */
    if (hl_set.peak >= 0 && hl_mapped(p)) hl_bound();
    return 1;
}

/* A large block the next allocator made for a request of req bytes: tracked, and learned
 * (guided) if in scope. */
static void hl_track(void *p, size_t req) {
    if (hl_live_track(p, req)) hl_learn_request(req);
}

static inline uint64_t hl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------- */
/* Per thread: the predictor and the front                                                       */

static __thread struct hcp_counter *hl_counter;
static __thread int hl_thread_state; /* 0 new, 1 being registered, 2 registered, 3 exited */
static uint8_t hl_table[HCP_TOKENS][HCP_TOKENS];
static int hl_use_table;

/* seed001, guided: the block a thread kept last waits in the thread's own front, outside the
 * shared cache, and the thread's next request that it fits takes it back under its shard's lock
 * alone (the tight loop of one thread, and of many threads at once, never meets the others).
 * Its live-set slot carries the front's ticket, so a second free of it by any thread is seen
 * (a double free: the slot goes, both frees reach the real free) and the front, finding its
 * ticket gone, forgets the block without touching it. A front's block counts against the cap
 * through the thread's reservation (the largest front block it held, in hl_front_bytes). */
struct hl_front {
    void *p;
    size_t usable;
    uint64_t ticket, since;
    size_t reserved; /* this thread's share of hl_front_bytes */
};
static __thread struct hl_front hl_front;
static __thread uint64_t hl_ticket_next; /* thread id << 40 | sequence; 0: no id yet */
static uint32_t hl_thread_ids;

/* What the fronts hold, for the other threads: a thread that finds nothing in the shared cache
 * takes a fitting block from another thread's front (its shard's lock and the front's ticket
 * decide, as for a double free: the owner, finding its ticket gone, forgets the block). Without
 * it, a block waiting in an idle thread's front is lost to the others: a thread-per-connection
 * server kept 3-10% more memory (kv_service). A hint is written by its thread only, under a
 * sequence count (odd while it changes), and read by the others without a lock; a thread gets
 * one of HL_HINTS slots when it registers (none left: no front for it). */
#define HL_HINTS 64
struct hl_hint {
    uint64_t seq;
    void *p;
    size_t usable;
    uint64_t ticket;
} __attribute__((aligned(64)));
static struct hl_hint hl_hints[HL_HINTS];
static uint64_t hl_hints_used; /* bit i: slot i belongs to a live thread */
static __thread int hl_hint_slot = -1;

static void hl_hint_write(void *p, size_t usable, uint64_t ticket) {
    struct hl_hint *h = &hl_hints[hl_hint_slot];
    uint64_t seq = h->seq;
    __atomic_store_n(&h->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h->p, p, __ATOMIC_RELAXED);
    __atomic_store_n(&h->usable, usable, __ATOMIC_RELAXED);
    __atomic_store_n(&h->ticket, ticket, __ATOMIC_RELAXED);
    __atomic_store_n(&h->seq, seq + 2, __ATOMIC_RELEASE);
}

/* The thread's front holds p now (NULL: nothing), and its hint says so. */
static inline void hl_front_set(void *p, size_t usable, uint64_t ticket, uint64_t since) {
    hl_front.p = p;
    hl_front.usable = usable;
    hl_front.ticket = ticket;
    hl_front.since = since;
    if (hl_hint_slot >= 0) hl_hint_write(p, usable, ticket);
}

static inline void hl_front_clear(void) { hl_front_set(NULL, 0, 0, 0); }

static void hl_hint_release(void) {
    if (hl_hint_slot < 0) return;
    hl_hint_write(NULL, 0, 0);
    __atomic_fetch_and(&hl_hints_used, ~((uint64_t)1 << hl_hint_slot), __ATOMIC_RELEASE);
    hl_hint_slot = -1;
}

static inline uint64_t hl_new_ticket(void) {
    if (HL_UNLIKELY(hl_ticket_next == 0))
        hl_ticket_next = ((uint64_t)__atomic_add_fetch(&hl_thread_ids, 1, __ATOMIC_RELAXED) << 40) | 1;
    return hl_ticket_next++;
}

static void hl_front_flush(void);

static void hl_thread_exit(void *v) {
    (void)v;
    hl_front_flush();
    hl_hint_release();
    hl_stripe_release();
    hl_thread_state = 3;
    struct hcp_counter *c = hl_counter;
    hl_counter = NULL;
    if (c) munmap(c, sizeof *c);
}

/* The thread's counter (guided), its key (whose destructor hands its front to the shared cache
 * at exit) and its hint slot. */
static void hl_thread_register(void) {
    if (hl_thread_state != 0) return; /* registered, exited, or being registered (re-entry) */
    hl_thread_state = 1;
    if (hl_set.policy == HL_GUIDED) {
        void *m = mmap(NULL, sizeof(struct hcp_counter), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) hl_counter = m;
    }
    /* non-NULL, so that the destructor runs; may calloc (keys >= 32): state 1 guards */
    if (hl_key_ok &&
        pthread_setspecific(hl_key, hl_counter ? (void *)hl_counter : (void *)&hl_front) == 0 &&
        hl_sharded)
        hl_hint_slot = hl_slot_claim(&hl_hints_used);
    hl_thread_state = 2;
}

static inline struct hcp_counter *hl_thread_counter(void) {
    if (HL_LIKELY(hl_counter != NULL)) return hl_counter;
    hl_thread_register();
    return hl_counter;
}

/* The thread may keep a block in its front: a policy with pools and a destructor to empty it. */
static inline int hl_front_open(void) {
    if (hl_set.policy != HL_SEED001 && hl_set.policy != HL_GUIDED) return 0;
    if (HL_UNLIKELY(hl_thread_state != 2)) hl_thread_register();
    return hl_thread_state == 2 && hl_hint_slot >= 0; /* a destructor and a hint slot */
}

/* A request >= min begins: the outgrown rule's history. */
static inline void hl_learn_alloc(size_t req) {
    hl_last_req = req;
    hl_prev_p = hl_last_p;
    hl_last_p = NULL;
}

/* guided's token stream: the thread's calls on the large blocks in scope, the only ones it can
 * keep. A request is learned once its block is known to be one (a hit in hl_take, a block in
 * scope in hl_track); a block glibc serves from its heap is neither learned nor predicted, at
 * its request or its free: 8 threads passing 256 KiB heap blocks paid ~12 ns a pair for it. */
static inline void hl_learn_request(size_t req) {
    if (hl_set.policy != HL_GUIDED) return;
    struct hcp_counter *c = hl_thread_counter();
    if (c) hcp_learn(c, hcp_class(req));
}

/* guided: a free of a block of `size` bytes, learned. */
static inline struct hcp_counter *hl_learn_free(size_t size) {
    struct hcp_counter *c = hl_thread_counter();
    if (c) hcp_learn(c, HCP_FREE + hcp_class(size));
    return c;
}

/* ------------------------------------------------------------------------------------------- */
/* Call sites (table format 3)                                                                    */

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
 * [4096][32] array touched whole cost every process ~75 page faults and ~0.3 MB (perl: 5.8 ->
 * 6.4 MB peak). Built once in the constructor, read-only after. */
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
     * have touched: perl under the table paid ~30 page faults more than under the counter */
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

/* guided: learn the free, then ask whether an allocation of its class comes soon. `site`: the
 * free's call-site key (hl_site_of), -1 if none or not asked; *by_site set to 1 if a call-site
 * entry answered. */
static int hl_predict_reuse(size_t req, int site, int *by_site) {
    unsigned cls = hcp_class(req);
    struct hcp_counter *c = hl_learn_free(req);
    if (c == NULL) return 0;
    if (hl_use_sites) {
        /* format 3: the (site, class) entry where training saw that key; elsewhere the thread's
         * own past, not the class's average over other programs: at sites training never saw,
         * the full night's network kept 7% of frees and 40% came back soon, where the class
         * said keep (benchmarks/results/table_sites_full.json) */
        int score = hl_site_score(site, cls);
        if (score >= 0) {
            *by_site = 1;
            return (unsigned)score * (unsigned)hl_set.topk >= 255u;
        }
    } else if (hl_use_table) { /* format 2, or a file without site entries: the class score */
        return (unsigned)hl_table[HCP_FREE + cls][cls] * (unsigned)hl_set.topk >= 255u;
    }
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

/* The proof. A cache pays only where the program asks again for what it freed, and a program
 * that seldom does paid for the blocks the layer kept anyway: sqlite3 (6 large calls, 1 reuse)
 * held 0.5 MB kept beside its 4.4 MB while its small blocks peaked, numpy_stack (12 large calls,
 * 1 reuse) likewise. So the layer keeps nothing until the process has made `proof` (2) requests
 * that a large block it passed on could have served: until then, each free it would have kept
 * goes to the next allocator and is remembered (its address and usable size, the last
 * HL_GHOSTS), and each miss looks for a remembered block that fits by the cache's own rule
 * (hl_fits, the alignment). Where the proof never comes, the layer has stepped aside on its
 * own (the stats: proven=0), and the program holds what it would under glibc (sqlite3: 1.08x
 * glibc's peak memory with proof=0, 1.02x with 2). Where it comes, the first reuses were
 * glibc's: 2 on seed 002's numpy case (28 hits with proof=0 or 2; with proof=4, 26 hits and
 * 5% more time), and glibc's heap took some of a training loop's blocks meanwhile (77 hits
 * with proof=0 or 2, 54 with 4: its blocks came from glibc's heap until glibc trimmed it).
 * ARC's ghost lists and TinyLFU's doorkeeper admit blocks on the same kind of evidence.
 * Process-wide, under hl_lock (only until proven); tasks/whatif/simulate.py replays it.
 *
 * The regret (guided, regret=1; off by default, not replayed by the simulator). The thread's
 * counter answers from the freeing thread's own calls, and a block freed by a thread that never
 * asks for one is passed on every time: a reader thread's chunks freed by the main thread
 * (numpy_pipeline) got no hit from the counter, where a table trained on numpy's call site got
 * 38 (benchmarks/results/layer_pipeline.md), and a program no table knows had nothing. So after
 * the proof the frees the prediction passed on are remembered the same way, and a miss one of
 * them would have served is a regret of the process for that block's size class: the class's
 * next HL_REGRET frees are kept whatever the thread's counter says. A remembered block that ages
 * out of the list unasked, or a kept block given back idle (decay), takes one back. What the
 * process as a whole asks for, learnt from its own misses, as an allocator can: no training. */
#define HL_GHOSTS 8
#define HL_REGRET 4
static struct {
    uintptr_t p;
    size_t usable;
    unsigned cls; /* the freed block's size class (its request's) */
} hl_ghost[HL_GHOSTS]; /* oldest first */
static int hl_nghost; /* changed under hl_lock, read without it by a miss (hl_take) */
static int hl_proven; /* read without the lock: a stale 0 remembers one more block */
static uint64_t hl_proof_hits;
/* per size class: frees to keep on the process's regrets; written under hl_lock, read without */
static int hl_regret[HL_CLASSES];
static uint64_t hl_regret_hits, hl_regret_keeps;

static inline void hl_regret_less(unsigned cls) { /* under hl_lock */
    int r = hl_regret[cls % HL_CLASSES];
    if (r > 0) __atomic_store_n(&hl_regret[cls % HL_CLASSES], r - 1, __ATOMIC_RELAXED);
}

static inline int hl_unproven(void) { return !__atomic_load_n(&hl_proven, __ATOMIC_RELAXED); }

static void hl_ghost_drop(int i) {
    int n = hl_nghost - 1;
    for (; i < n; i++) hl_ghost[i] = hl_ghost[i + 1];
    __atomic_store_n(&hl_nghost, n, __ATOMIC_RELAXED);
}

/* a free the layer would have kept, passed on before the proof; or, after it (regret=1), a
 * free the prediction passed on */
static void hl_ghost_add(const void *p, size_t usable, unsigned cls) {
    hl_lock_take();
    if (hl_nghost == HL_GHOSTS) {
        if (!hl_unproven()) hl_regret_less(hl_ghost[0].cls); /* aged out, never asked for */
        hl_ghost_drop(0);
    }
    hl_ghost[hl_nghost].p = (uintptr_t)p;
    hl_ghost[hl_nghost].usable = usable;
    hl_ghost[hl_nghost].cls = cls;
    __atomic_store_n(&hl_nghost, hl_nghost + 1, __ATOMIC_RELAXED);
    hl_lock_give();
}

/* a miss the most recent remembered block that fits would have served: before the proof, a
 * step towards it; after it, a regret for that block's class */
static void hl_ghost_hit(size_t n, uintptr_t mask) {
    hl_lock_take();
    for (int i = hl_nghost - 1; i >= 0; i--)
        if (hl_fits(hl_ghost[i].usable, n) && (hl_ghost[i].p & mask) == 0) {
            unsigned cls = hl_ghost[i].cls;
            hl_ghost_drop(i);
            if (hl_unproven()) {
                if (++hl_proof_hits >= (uint64_t)hl_set.proof)
                    __atomic_store_n(&hl_proven, 1, __ATOMIC_RELAXED);
            } else {
                hl_regret_hits++;
                __atomic_store_n(&hl_regret[cls % HL_CLASSES], HL_REGRET, __ATOMIC_RELAXED);
            }
            break;
        }
    hl_lock_give();
}

#define HL_OUT_MAX 8
struct hl_out {
    int n;
    void *p[HL_OUT_MAX + 1]; /* loops stop at HL_OUT_MAX: the spare is for the block at hand */
};

/* seed001/guided: blocks idle longer than `decay` go back (at most HL_OUT_MAX per call). */
static void hl_decay(struct hl_out *out, uint64_t now) {
    if (hl_set.policy == HL_SEED002) return;
    for (int i = 0; i < hl_nkept && out->n < HL_OUT_MAX;) {
        if (now - hl_kept[i].since > hl_set.decay_ns) {
            out->p[out->n++] = hl_kept[i].p;
            if (hl_set.regret) hl_regret_less(hcp_class(hl_kept[i].usable)); /* kept for nothing */
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

/* The index of the kept block that goes back first to make room: the oldest (seed002: the
 * smallest, the oldest of equals, as tasks/whatif/simulate.py replays it). hl_nkept > 0, under
 * hl_lock. */
static int hl_victim(void) {
    int v = 0;
    for (int i = 1; i < hl_nkept; i++) {
        int older = hl_kept[i].stamp < hl_kept[v].stamp;
        if (hl_set.policy == HL_SEED002 ? hl_kept[i].usable < hl_kept[v].usable ||
                                              (hl_kept[i].usable == hl_kept[v].usable && older)
                                        : older)
            v = i;
    }
    return v;
}

/* Room under the cap for `extra` more bytes (and, with `slot`, a free entry in hl_kept): the
 * oldest kept blocks (seed002: the smallest) go back into out until there is; 1 if there is.
 * Under hl_lock. */
static int hl_make_room(size_t extra, int slot, struct hl_out *out) {
#define HL_FULL (hl_bytes_kept + hl_front_bytes + extra > hl_set.cap || (slot && hl_nkept >= HL_MAX_KEPT))
    while (hl_nkept > 0 && out->n < HL_OUT_MAX && HL_FULL) {
        int v = hl_victim();
        out->p[out->n++] = hl_kept[v].p;
        hl_drop(v, 0);
    }
    return !HL_FULL;
#undef HL_FULL
}

/* The cache's bound on the program's footprint. Under glibc, a mapped block's memory goes back
 * at its free: the program's large blocks take what is live of them, at most their peak, and
 * whatever the cache keeps comes on top of that. keras_video (seed 003's case: TensorFlow fixes
 * glibc's threshold at 128 KiB, so every tensor is mapped) peaked at 1.09x glibc's memory under
 * the layer, one step's freed tensors kept while the next step's grew beside them. So at a miss
 * that maps a block (new memory: hl_track), the oldest kept blocks
 * (seed002: the smallest) go back until live + kept (fronts included) is within the live
 * blocks' peak so far plus `peak` percent (at most HL_OUT_MAX a call; the next miss goes on). A
 * hit or a keep only moves a block between live and kept: the sum grows at such a miss alone.
 * The shards' counts are read without their locks (a count a moment old moves the bound by a
 * block). When the shared cache is not enough, the threads' fronts give theirs back too
 * (hl_bound_fronts). Not counted on either side: blocks below `min`, and glibc's heap. The
 * high-water mark of live blocks is taken at these misses: the bound can only be stricter. */
static void hl_bound_fronts(size_t over);
static void hl_bound(void) {
    struct hl_out out = {0};
    hl_lock_take();
    size_t live = 0, fronted = 0;
    for (int i = 0; i < HL_SHARDS; i++) {
        live += __atomic_load_n(&hl_shards[i].live, __ATOMIC_RELAXED);
        fronted += __atomic_load_n(&hl_shards[i].fronted, __ATOMIC_RELAXED);
    }
    if (live > hl_stats.live_peak) hl_stats.live_peak = live;
    size_t limit = hl_stats.live_peak + hl_stats.live_peak / 100 * (size_t)hl_set.peak;
    size_t total = live + fronted + hl_bytes_kept;
    size_t over = total > limit ? total - limit : 0;
    while (over > 0 && hl_nkept > 0 && out.n < HL_OUT_MAX) {
        int v = hl_victim();
        over -= over < hl_kept[v].usable ? over : hl_kept[v].usable;
        out.p[out.n++] = hl_kept[v].p;
        hl_drop(v, 0);
        HL_COUNT(bounded);
    }
    hl_lock_give();
    hl_release(&out);
    if (over > 0 && hl_sharded) hl_bound_fronts(over);
}

static inline void hl_note_peak(void) {
    if (hl_bytes_kept + hl_front_bytes > hl_stats.bytes_kept_peak)
        hl_stats.bytes_kept_peak = hl_bytes_kept + hl_front_bytes;
}

/* The front f still holds its block (its ticket is in the live set): 1, and the block is the
 * program's again (req > 0) or out of the live set (req == 0); 0 if a second free took it. */
static int hl_front_claim(const struct hl_front *f, size_t req) {
    struct hl_shard *s = hl_shard_of(f->p);
    hl_spin_lock(&s->lock);
    struct hl_live_slot *e = hl_live_find(s, f->p);
    int ours = e != NULL && e->ticket == f->ticket;
    if (ours && req) {
        hl_bytes_move(&s->fronted, &s->live, e->usable);
        e->ticket = 0;
        e->req = req;
        s->hits++;
    } else if (ours) {
        hl_live_remove(s, e);
    }
    hl_spin_unlock(&s->lock);
    return ours;
}

/* The front's block goes back to the next allocator (idle past `decay`, the thread exits, or
 * hl_bound; f may be another thread's front); 0 if a second free took it first. */
static int hl_front_give_back(const struct hl_front *f, int decayed) {
    if (!hl_front_claim(f, 0)) return 0;
    hl_lock_take();
    hl_stats.given_back++;
    hl_stats.bytes_given_back += f->usable;
    hl_stats.decayed += (uint64_t)decayed;
    hl_lock_give();
    hl_real.free(f->p);
    return 1;
}

/* f leaves its thread's front for the shared cache (a newer block takes its place), as any
 * kept block enters it: idle blocks decay, the oldest make room under the cap, or it goes back. */
static void hl_front_to_shared(const struct hl_front *f, uint64_t now) {
    struct hl_out out = {0};
    hl_lock_take();
    if (hl_front_claim(f, 0)) {
        hl_decay(&out, now);
        if (hl_make_room(f->usable, 1, &out)) {
            hl_kept[hl_nkept++] = (struct hl_kept){f->p, f->usable, ++hl_stamp, f->since, 0};
            hl_bytes_kept += f->usable;
            hl_note_peak();
        } else {
            out.p[out.n++] = f->p;
            hl_stats.given_back++;
            hl_stats.bytes_given_back += f->usable;
        }
    }
    hl_lock_give();
    hl_release(&out);
}

/* The thread exits: its front's block joins the shared cache, where the next thread can take
 * it (given back, a thread-per-connection server kept 10% more memory and missed ~550 of 5500
 * reuses: kv_service), and its reservation is freed. */
static void hl_front_flush(void) {
    struct hl_front f = hl_front;
    hl_front_clear();
    if (f.p) hl_front_to_shared(&f, hl_now());
    if (hl_front.reserved) {
        hl_lock_take();
        hl_front_bytes -= hl_front.reserved;
        hl_lock_give();
        hl_front.reserved = 0;
    }
}

/* Room under the cap for this thread's front to hold `usable` bytes: its reservation grows to
 * that, the shared cache's oldest going back if needed (no lock held); 1 if reserved. */
static int hl_reserve(size_t usable) {
    struct hl_out out = {0};
    size_t extra = usable - hl_front.reserved;
    hl_lock_take();
    int ok = hl_make_room(extra, 0, &out);
    if (ok) {
        hl_front_bytes += extra;
        hl_front.reserved = usable;
        hl_note_peak();
    }
    hl_lock_give();
    hl_release(&out);
    return ok;
}

/* Another thread's front as its hint says (read without a lock): 1 and *f if it names a block,
 * 0 if it names none or was torn (being written). Stale is possible: the block's shard and its
 * ticket decide (hl_front_claim). */
static int hl_hint_read(const struct hl_hint *h, struct hl_front *f) {
    uint64_t seq = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
    void *p = __atomic_load_n(&h->p, __ATOMIC_RELAXED);
    size_t usable = __atomic_load_n(&h->usable, __ATOMIC_RELAXED);
    uint64_t ticket = __atomic_load_n(&h->ticket, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if ((seq & 1) || __atomic_load_n(&h->seq, __ATOMIC_RELAXED) != seq || p == NULL) return 0;
    *f = (struct hl_front){.p = p, .usable = usable, .ticket = ticket};
    return 1;
}

/* The other live threads' hint slots, as a bit set. */
static inline uint64_t hl_other_hints(void) {
    uint64_t used = __atomic_load_n(&hl_hints_used, __ATOMIC_ACQUIRE);
    return hl_hint_slot >= 0 ? used & ~((uint64_t)1 << hl_hint_slot) : used;
}

/* Nothing fits in the shared cache: a fitting block from another thread's front, made live for
 * n bytes; NULL if none. */
static void *hl_steal(size_t n, uintptr_t mask) {
    for (uint64_t used = hl_other_hints(); used; used &= used - 1) {
        struct hl_front f;
        if (!hl_hint_read(&hl_hints[__builtin_ctzll(used)], &f)) continue;
        if (!hl_fits(f.usable, n) || ((uintptr_t)f.p & mask) != 0) continue;
        if (hl_front_claim(&f, n)) return f.p; /* as its owner would take it back */
    }
    return NULL;
}

/* hl_bound, the shared cache emptied and still `over` bytes above the bound: the fronts' blocks
 * go back, this thread's first, then the others' (as a double free takes one: the ticket
 * leaves the live set, and the owner, finding it gone, forgets the block). Without this, every
 * thread's front held its last block on top of the peak (guided on tests' phases: +2 MiB). */
static size_t hl_bound_give_back(const struct hl_front *f, size_t over) {
    if (!hl_front_give_back(f, 0)) return over; /* a second free took it first */
    HL_COUNT(bounded);
    return over - (over < f->usable ? over : f->usable);
}

static void hl_bound_fronts(size_t over) {
    struct hl_front f = hl_front;
    if (f.p != NULL) {
        hl_front_clear();
        over = hl_bound_give_back(&f, over);
    }
    for (uint64_t used = hl_other_hints(); over > 0 && used; used &= used - 1)
        if (hl_hint_read(&hl_hints[__builtin_ctzll(used)], &f)) over = hl_bound_give_back(&f, over);
}

/* A kept block for n bytes at an address multiple of `align` (power of two, or 0), taken out of
 * the kept blocks and made live; NULL if none fits. The thread's front first (its most recent
 * kept block), then the shared cache, then the other threads' fronts. */
static void *hl_take(size_t n, size_t align) {
    if (n < hl_active_min) return NULL;
    uintptr_t mask = align > 1 ? (uintptr_t)(align - 1) : 0;
    struct hl_out out = {0};
    void *p = NULL;
    /* the clock only where something is kept (decay, advice): a thread whose blocks all come
     * from glibc's heap reads none */
    int timed = !(hl_set.policy == HL_SEED002 && hl_set.madv_ns <= 0);
    uint64_t now = 0;
    if (hl_front.p != NULL) {
        if (timed) now = hl_now();
        struct hl_front f = hl_front;
        if (now - f.since > hl_set.decay_ns) {
            hl_front_clear();
            hl_front_give_back(&f, 1);
        } else if (hl_fits(f.usable, n) && ((uintptr_t)f.p & mask) == 0) {
            hl_front_clear();
            if (hl_front_claim(&f, n)) {
                hl_advise_idle(now);
                hl_learn_request(n);
                return hl_last_p = f.p;
            }
        }
    }
    /* an empty shared cache is not locked for: where the rules leave most blocks to glibc's
     * heap (a policy that declines, scope), 8 threads missing here met on hl_lock at every
     * call (guided's 256 KiB pair: 65 -> 210 ns). A block kept meanwhile is missed once. */
    if (__atomic_load_n(&hl_nkept, __ATOMIC_RELAXED) == 0) goto shared_done;
    if (timed && now == 0) now = hl_now();
    hl_lock_take();
    hl_decay(&out, now);
    int best = -1;
    for (int i = 0; i < hl_nkept; i++)
        if (hl_fits(hl_kept[i].usable, n) && ((uintptr_t)hl_kept[i].p & mask) == 0 &&
            (best < 0 || hl_kept[i].stamp > hl_kept[best].stamp))
            best = i;
    if (best >= 0) {
        p = hl_kept[best].p;
        size_t usable = hl_kept[best].usable;
        hl_bytes_kept -= usable;
        hl_kept[best] = hl_kept[--hl_nkept];
        hl_stats.hits++;
        /* live before hl_lock goes: a second free of p meanwhile looks in the cache, then here */
        struct hl_shard *s = hl_shard_of(p);
        hl_nested_lock(s);
        if (!hl_live_add(s, p, n, usable)) hl_active_min = SIZE_MAX;
        hl_nested_unlock(s);
    }
    hl_lock_give();
shared_done:
    if (p == NULL && hl_sharded) p = hl_steal(n, mask);
    if (p == NULL) {
        HL_COUNT(misses);
        /* not locked for when nothing is remembered: a program whose large blocks all come
         * from glibc's heap never gives the proof, and 8 threads missing there met on hl_lock
         * at every call (256 KiB heap blocks: ~70 -> ~45 ns a pair) */
        if ((hl_unproven() || hl_set.regret) && __atomic_load_n(&hl_nghost, __ATOMIC_RELAXED) > 0)
            hl_ghost_hit(n, mask);
    }
    hl_release(&out);
    if (now) hl_advise_idle(now);
    if (p) {
        hl_last_p = p;
        hl_learn_request(n);
    }
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
    hl_lock_take();
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
    hl_lock_give();
    if (n == 0) return;
    for (int i = 0; i < n; i++) hl_madvise(todo[i].p, todo[i].usable);
    struct hl_out out = {0};
    hl_lock_take();
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
    hl_lock_give();
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

/* The program frees p (usable >= min), returning to `caller`. */
static void hl_free_large(void *p, size_t usable, const void *caller) {
    void (*real_free)(void *) = hl_real.free;
    int advised = hl_set.madv_ns == 0;
    /* Outgrown: the thread's last request was larger than this block, and this block is what
     * its request before got: the program grows a buffer by malloc, copy and free (strings,
     * vectors, hash tables). The block cannot serve that size, and the next step asks for more
     * still: kept, such blocks were never reused (perl: 1.4 MB kept beside its 10 MB peak; with
     * the rule, 11 kept and 11 reused). */
    int outgrown = p == hl_prev_p && hl_last_req > usable;
    if (!hl_in_scope(p)) {
        /* glibc's heap, untracked (hl_track): no lock, no live set, nothing learned (guided:
         * hl_learn_request). 8 threads taking and freeing 256 KiB heap blocks paid ~150-250 ns
         * a pair for their tracking, against glibc's ~27. */
        if (outgrown) HL_COUNT(outgrown);
        else HL_COUNT(heap);
        hl_pass_free(p);
        return;
    }
    uint64_t now = hl_set.policy == HL_SEED002 && hl_set.madv_ns <= 0 ? 0 : hl_now();
    /* before any lock (see Call sites); only where the table has an entry it can ask */
    int site = hl_site_set != NULL ? hl_site_of(caller) : -1;
    int wanted = usable <= hl_set.cap && !outgrown;
    int unproven = wanted && hl_unproven(); /* passed on, remembered (hl_ghost_add) */
    /* the front: seed001/guided, a block the thread's reservation covers (madv=0 advises every
     * kept block at once: the shared path) */
    int front = wanted && !unproven && !advised && hl_front_open() &&
                (usable <= hl_front.reserved || hl_reserve(usable));
    struct hl_shard *s = hl_shard_of(p);
again:;
    hl_live_lock(s);
    struct hl_live_slot *e = hl_live_find(s, p);
    if (HL_UNLIKELY(e == NULL || e->ticket != 0)) {
        /* not a live block of ours: a foreign pointer, a block from before the start, or a
         * double free. If it is kept (in a front or the shared cache), the program freed it
         * twice: the block leaves the cache and both frees reach the real free, which reports
         * it as it would without the layer. */
        int twice = e != NULL;
        if (twice) hl_live_remove(s, e); /* its front, finding its ticket gone, forgets it */
        if (hl_sharded) {
            hl_live_unlock(s);
            hl_lock_take();
        }
        if (!twice && !(twice = hl_unkeep(p)) && hl_sharded) {
            /* a shared take may be making p live (it holds hl_lock, then p's shard): look again */
            hl_nested_lock(s);
            int live = hl_live_find(s, p) != NULL;
            hl_nested_unlock(s);
            if (live) {
                hl_lock_give();
                goto again;
            }
        }
        if (twice) hl_stats.double_frees++;
        else hl_stats.untracked++;
        HL_COUNT(declined);
        hl_lock_give();
        if (twice) real_free(p);
        real_free(p);
        return;
    }
    size_t req = e->req ? e->req : 1;
    int keep = wanted;
    int passed_by_prediction = 0; /* regret=1: remembered (hl_ghost_add) */
    if (hl_set.policy == HL_GUIDED) { /* this thread's */
        int by_site = 0;
        int soon = hl_predict_reuse(req, site, &by_site);
        s->sited += (uint64_t)by_site; /* under s's lock: no atomic (~5 ns a free) */
        if (!soon && hl_set.regret && wanted && !unproven) {
            /* the process's regrets for the class (hl_regret) overrule the thread's counter */
            if (__atomic_load_n(&hl_regret[hcp_class(req)], __ATOMIC_RELAXED) > 0) {
                soon = 1;
                __atomic_fetch_add(&hl_regret_keeps, 1, __ATOMIC_RELAXED);
            } else {
                passed_by_prediction = 1;
            }
        }
        keep = soon && keep;
    }
    if (hl_set.policy == HL_SEED002 && hl_set.n == 0) keep = 0;
    if (unproven) keep = 0;
    if (keep && front) {
        hl_bytes_move(&s->live, &s->fronted, e->usable);
        e->ticket = hl_new_ticket();
        s->kept++;
        struct hl_front old = hl_front;
        hl_front_set(p, usable, e->ticket, now);
        hl_live_unlock(s);
        if (old.p) hl_front_to_shared(&old, now);
        hl_advise_idle(now);
        return;
    }
    if (!keep) {
        hl_live_remove(s, e);
        hl_live_unlock(s);
        if (unproven) {
            HL_COUNT(unproven);
            hl_ghost_add(p, usable, hcp_class(req));
        } else if (outgrown) {
            HL_COUNT(outgrown);
        } else {
            HL_COUNT(declined);
            if (passed_by_prediction) hl_ghost_add(p, usable, hcp_class(req));
        }
        hl_pass_free(p);
        return;
    }
    if (!hl_sharded) {
        hl_live_remove(s, e); /* hl_live_lock took hl_lock: held on to the end */
    } else {
        /* the shared cache: p leaves the live set under hl_lock (taken before its shard's, the
         * one order), so that a second free of p finds it live or kept, never neither */
        hl_live_unlock(s);
        if (hl_front.p) { /* the thread's front holds an older block: it goes first, in order */
            struct hl_front old = hl_front;
            hl_front_clear();
            hl_front_to_shared(&old, now);
        }
        hl_lock_take();
        hl_nested_lock(s);
        e = hl_live_find(s, p);
        int ours = e != NULL && e->ticket == 0;
        if (ours) hl_live_remove(s, e);
        hl_nested_unlock(s);
        if (!ours) { /* a second free came first: this one is the second */
            hl_lock_give();
            goto again;
        }
    }
    if (advised) { /* madv=0: advise before other threads can take it, outside the lock */
        hl_lock_give();
        hl_madvise(p, usable);
        hl_lock_take();
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
    keep = keep && hl_make_room(usable, 1, &out);
    if (keep) {
        hl_kept[hl_nkept++] = (struct hl_kept){p, usable, ++hl_stamp, now, advised};
        hl_bytes_kept += usable;
        hl_stats.kept++;
        hl_note_peak();
    } else {
        HL_COUNT(declined);
    }
    hl_lock_give();
    if (!keep) hl_pass_free(p);
    hl_release(&out);
    hl_advise_idle(now);
}

/* ------------------------------------------------------------------------------------------- */
/* glibc's dynamic mmap threshold                                                               */

/* glibc serves blocks of M_MMAP_THRESHOLD bytes and more (128 KiB at start) with a fresh mmap,
 * and at the free of a larger mmapped block raises the threshold to that block's size (at most
 * 32 MiB; the trim threshold to twice that): a program that frees large blocks soon gets them
 * from its heap, pages already there. The cache keeps those frees from glibc, so its threshold
 * stayed at 128 KiB and every block the cache could not serve was a fresh mmap, faulted in
 * page by page: a thread-per-connection server (kv_service, 64-512 KiB values) ran 3-8% slower
 * under the layer than under glibc alone (and 27% slower under glibc with the threshold fixed
 * at 128 KiB). So the layer applies glibc's rule itself, with mallopt, at every free of a block
 * of 128 KiB or more it sees (kept or not: once the layer has set the threshold, glibc stops
 * following on its own). A block larger than the threshold was mmapped when it was made, as
 * the threshold only grows. Not when the threshold is fixed: by the user (MALLOC_MMAP_THRESHOLD_,
 * MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or their GLIBC_TUNABLES, which turn
 * glibc's own following off), by the program (mallopt, interposed below) or by follow=0. Over
 * another allocator, mallopt is its (a no-op in tcmalloc) or glibc's unused one. */
#define HL_FOLLOW_MIN ((size_t)128 * 1024)                    /* DEFAULT_MMAP_THRESHOLD_MIN */
#define HL_FOLLOW_MAX ((size_t)4 * 1024 * 1024 * sizeof(long)) /* DEFAULT_MMAP_THRESHOLD_MAX */
static size_t hl_follow_at; /* glibc's threshold as the layer set it; 0: not followed */
static pthread_mutex_t hl_follow_lock = PTHREAD_MUTEX_INITIALIZER;

static int hl_threshold_fixed(void) {
    static const char *const vars[] = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                       "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"};
    static const char *const tunables[] = {"glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold",
                                           "glibc.malloc.top_pad", "glibc.malloc.mmap_max"};
    for (int i = 0; i < 4; i++)
        if (getenv(vars[i])) return 1;
    const char *t = getenv("GLIBC_TUNABLES");
    for (int i = 0; t && i < 4; i++)
        if (strstr(t, tunables[i])) return 1;
    return 0;
}

/* The program frees a block of `usable` bytes (>= 128 KiB): glibc's rule, for its chunk
 * (usable + the 16-byte header). */
static void hl_follow(size_t usable) {
    size_t chunk = usable + 2 * sizeof(size_t);
    size_t at = __atomic_load_n(&hl_follow_at, __ATOMIC_RELAXED);
    if (HL_LIKELY(at == 0 || chunk <= at || chunk > HL_FOLLOW_MAX)) return;
    pthread_mutex_lock(&hl_follow_lock);
    if (hl_follow_at != 0 && chunk > hl_follow_at && hl_real.mallopt) {
        __atomic_store_n(&hl_follow_at, chunk, __ATOMIC_RELAXED);
        hl_real.mallopt(M_MMAP_THRESHOLD, (int)chunk);
        hl_real.mallopt(M_TRIM_THRESHOLD, (int)(2 * chunk));
    }
    pthread_mutex_unlock(&hl_follow_lock);
}

/* the mmap threshold the program fixed itself (0: none), for the stats: TensorFlow's generator
 * dataset fixes it at 128 KiB, and every block glibc serves from there up is a fresh mapping */
static int hl_program_threshold;

/* The program sets a threshold of its own: glibc stops following, and so does the layer. */
HL_EXPORT int mallopt(int param, int value) {
    int (*f)(int, int) = HL_REAL(mallopt);
    if (param == M_MMAP_THRESHOLD || param == M_TRIM_THRESHOLD || param == M_TOP_PAD ||
        param == M_MMAP_MAX) {
        if (param == M_MMAP_THRESHOLD)
            __atomic_store_n(&hl_program_threshold, value, __ATOMIC_RELAXED);
        pthread_mutex_lock(&hl_follow_lock);
        __atomic_store_n(&hl_follow_at, 0, __ATOMIC_RELAXED);
        int rc = f ? f(param, value) : 0;
        pthread_mutex_unlock(&hl_follow_lock);
        return rc;
    }
    return f ? f(param, value) : 0;
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

/* free's body; `caller`: where the program's call returns (the table's call-site key) */
static inline __attribute__((always_inline)) void hl_free_from(void *p, const void *caller) {
    if (p == NULL || HL_UNLIKELY(hc_in_pool(p))) return;
    void (*real_free)(void *) = HL_REAL(free);
    if (HL_UNLIKELY(!real_free)) return; /* cannot happen: p came from somewhere */
    size_t min = hl_active_min;
    if (min != SIZE_MAX) {
        /* over glibc, the chunk's size word before the block (its size, header included, and 3
         * flag bits) tells a small block at once: most frees are of small blocks, and
         * malloc_usable_size cost each ~3 ns (numpy_stack, 0.6 M frees: +1.8% time) */
        size_t small = min < HL_FOLLOW_MIN ? min : HL_FOLLOW_MIN;
        if (hl_glibc_next && (hl_chunk_word(p) & ~(size_t)7) < small) {
            real_free(p);
            return;
        }
        size_t usable = hl_real.malloc_usable_size(p);
        if (usable >= HL_FOLLOW_MIN) hl_follow(usable);
        if (usable >= min) {
            hl_free_large(p, usable, caller);
            return;
        }
    }
    real_free(p);
}

HL_EXPORT void free(void *p) { hl_free_from(p, __builtin_return_address(0)); }

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
        hl_free_from(old, __builtin_return_address(0));
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
            hl_free_from(old, __builtin_return_address(0));
            return q;
        }
    }
    size_t req = 0;
    int kept = 0;
    if (usable >= hl_active_min && hl_in_scope(old)) { /* out of scope: untracked, never kept */
        struct hl_shard *s = hl_shard_of(old);
        hl_live_lock(s);
        struct hl_live_slot *e = hl_live_find(s, old);
        if (e != NULL && e->ticket != 0) kept = 1; /* realloc of a freed block a front holds */
        else if (e != NULL) req = e->req ? e->req : 1;
        if (e != NULL) hl_live_remove(s, e);
        hl_live_unlock(s);
        if (e == NULL) {
            hl_lock_take();
            kept = hl_unkeep(old); /* realloc of a freed block the shared cache holds */
            hl_lock_give();
        }
    }
    if (HL_UNLIKELY(kept)) {
        /* the program freed old and then reallocs it: the free the cache held back reaches
         * the real allocator first, then the realloc, as without the layer (never two owners) */
        hl_real.free(old);
    }
    void *q = real_realloc(old, n);
    if (q == NULL) {
        if (req) hl_live_track(old, req); /* failed: old stays the program's, asked for before */
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
#define HL_CLASS_BYTES (HCP_TOKENS * HCP_TOKENS)
#define HL_MAX_SITE_ENTRIES (HL_SITES * HL_CLASSES)
#define HL_FALLBACK "; the guided policy uses the online counter"

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
        ssize_t got = pread(fd, buf, want, (off_t)(32 + from + done));
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
    unsigned char head[32], buf[4096];
    ssize_t a = pread(fd, head, sizeof head, 0);
    const char *why = NULL;
    uint32_t version = 0, model = 0, tokens = 0, bytes = 0;
    uint64_t sum = 0, got = 0xcbf29ce484222325ull;
    struct hl_site_load l = {0};
    if (a != (ssize_t)sizeof head) {
        why = "is shorter than its 32-byte header" HL_FALLBACK;
        goto out;
    }
    if (memcmp(head, HL_TABLE_MAGIC, 8) != 0) {
        why = "is not a heapcast layer table (magic)" HL_FALLBACK;
        goto out;
    }
    memcpy(&version, head + 8, 4);
    memcpy(&model, head + 12, 4);
    memcpy(&tokens, head + 16, 4);
    memcpy(&bytes, head + 20, 4);
    memcpy(&sum, head + 24, 8);
    if (version != 2u && version != 3u) {
        why = "has another format version (this layer reads 2 and 3)" HL_FALLBACK;
        goto out;
    }
    size_t sites = bytes >= HL_CLASS_BYTES ? bytes - HL_CLASS_BYTES : 0;
    if (tokens != HCP_TOKENS || bytes < HL_CLASS_BYTES || (version == 2u && sites != 0) ||
        sites % 4 != 0 || sites / 4 > HL_MAX_SITE_ENTRIES) {
        why = version == 3u ? "has another shape (64 tokens, 4096 payload bytes and 4 per site entry expected)" HL_FALLBACK
                            : "has another shape (64 tokens, 4096 payload bytes expected)" HL_FALLBACK;
        goto out;
    }
    l.cmin = hcp_class(hl_set.min / 2);
    size_t n = hl_read_payload(fd, 0, HL_CLASS_BYTES, &got, buf, sizeof buf, hl_take_classes, NULL);
    uint64_t after_classes = got;
    n += hl_read_payload(fd, HL_CLASS_BYTES, sites, &got, buf, sizeof buf, hl_take_sites, &l);
    if (n != bytes || pread(fd, buf, 1, (off_t)(32 + bytes)) != 0) {
        why = "has a payload of the wrong length (truncated or extended)" HL_FALLBACK;
        goto out;
    }
    if (got != sum) {
        why = "is corrupt (payload checksum)" HL_FALLBACK;
        goto out;
    }
    if (l.disorder) {
        why = "is corrupt (site entries out of order)" HL_FALLBACK;
        goto out;
    }
    if (model == 0) {
        why = "names no model version" HL_FALLBACK;
        goto out;
    }
    if (hl_set.model && model != hl_set.model) {
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
            if (again != sum || fill.asked != l.asked) {
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

/* ------------------------------------------------------------------------------------------- */
/* Start, fork, exit                                                                              */

/* fork: every lock held across it, in the one order (hl_follow_lock, hl_lock, the shards), so
 * that the child finds none held by a thread it does not have; see Threads. */
static void hl_fork_prepare(void) {
    pthread_mutex_lock(&hl_follow_lock); /* never taken while the others are held: first */
    hl_lock_take();
    for (int i = 0; i < HL_SHARDS; i++) hl_spin_lock(&hl_shards[i].lock);
}
static void hl_fork_parent(void) {
    for (int i = HL_SHARDS - 1; i >= 0; i--) hl_spin_unlock(&hl_shards[i].lock);
    hl_lock_give();
    pthread_mutex_unlock(&hl_follow_lock);
}
static void hl_fork_child(void) {
    /* the other threads are gone: their hint slots are free again (their fronts' blocks stay
     * out of reach, at most one each) */
    __atomic_store_n(&hl_hints_used, hl_hint_slot >= 0 ? (uint64_t)1 << hl_hint_slot : 0,
                     __ATOMIC_RELAXED);
    for (int i = 0; i < HL_HINTS; i++)
        if (i != hl_hint_slot) hl_hints[i].p = NULL;
    /* and their stripes, whose counts stay (the child's stats count the parent's calls too) */
    __atomic_store_n(&hl_stripes_owned,
                     hl_my_stripe_slot >= 0 ? (uint64_t)1 << hl_my_stripe_slot : 0,
                     __ATOMIC_RELAXED);
    hl_fork_parent();
}

__attribute__((constructor)) static void hl_init(void) {
    hl_shards_init();
    hl_resolve();
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) hl_page = (size_t)page;
    struct hl_settings st = hl_set;
    if (!hl_read_settings(&st)) {
        hl_set.policy = HL_OFF;
        return; /* pass-through (said on stderr) */
    }
    hl_set = st;
    hl_proven = hl_set.proof == 0;
    void *lm = dlsym(RTLD_NEXT, "__libc_malloc");
    hl_glibc_next = lm != NULL && lm == (void *)hl_real.malloc;
    if (hl_set.policy == HL_GUIDED && hl_set.table[0]) {
        ssize_t n = readlink("/proc/self/exe", hl_exe, sizeof hl_exe - 1); /* as the tracer */
        hl_exe_len = n > 0 ? (size_t)n : 0;
        const char *why = hl_load_table(hl_set.table);
        if (why) {
            hl_stats.table_refused = 1;
            hl_say("table file ", hl_set.table, " refused: it ", why);
        } else {
            hl_use_table = 1;
        }
    }
    /* every policy: the key's destructor gives a thread's counter stripe back (hl_stripe_claim) */
    hl_key_ok = pthread_key_create(&hl_key, hl_thread_exit) == 0;
    if (hl_set.policy == HL_GUIDED || hl_set.policy == HL_SEED001) hl_sharded = 1;
    pthread_atfork(hl_fork_prepare, hl_fork_parent, hl_fork_child);
    if (hl_set.policy != HL_OFF && hl_set.follow && !hl_threshold_fixed())
        hl_follow_at = HL_FOLLOW_MIN;
    if (hl_set.policy != HL_OFF && hl_real.malloc_usable_size && hl_real.free)
        __atomic_store_n(&hl_active_min, hl_set.min, __ATOMIC_RELEASE);
}

__attribute__((destructor)) static void hl_fini(void) {
    if (!hl_set.stats[0]) return;
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    hl_lock_take();
#define F(key, v) p = hl_num(hl_cat(p, end, key "="), end, (uint64_t)(v)), p = hl_cat(p, end, " ")
    F("pid", getpid());
    F("policy", hl_set.policy);
    F("table", hl_use_table);
    uint64_t front_hits = 0, front_kept = 0, sited = 0;
    for (int i = 0; i < HL_SHARDS; i++) {
        hl_spin_lock(&hl_shards[i].lock);
        front_hits += hl_shards[i].hits;
        front_kept += hl_shards[i].kept;
        sited += hl_shards[i].sited;
        hl_spin_unlock(&hl_shards[i].lock);
    }
    F("hits", hl_stats.hits + front_hits);
    F("misses", HL_STRIPED(misses));
    F("kept", hl_stats.kept + front_kept);
    F("bytes_kept_peak", hl_stats.bytes_kept_peak);
    F("bytes_kept_at_exit", hl_bytes_kept);
    F("given_back", hl_stats.given_back);
    F("bytes_given_back", hl_stats.bytes_given_back);
    F("bytes_advised", hl_stats.bytes_advised);
    F("decayed", hl_stats.decayed);
    F("passed", HL_STRIPED(misses) + HL_STRIPED(heap) + HL_STRIPED(outgrown) +
                    HL_STRIPED(declined) + HL_STRIPED(unproven));
    F("double_frees", hl_stats.double_frees);
    /* frees the layer left to the next allocator by its rules: outgrown blocks, glibc's heap */
    F("outgrown", HL_STRIPED(outgrown));
    F("heap", HL_STRIPED(heap));
    /* frees of blocks >= min it did not hand out: made before it started, asked for below min,
     * or not the allocator's at all (a foreign pointer) */
    F("untracked", hl_stats.untracked);
    /* blocks given back to keep live + kept within the live blocks' peak (hl_bound), and that
     * peak in bytes */
    F("bounded", HL_STRIPED(bounded));
    F("live_peak", hl_stats.live_peak);
    F("table_refused", hl_stats.table_refused);
    F("table_sites", sited);
    /* the proof (hl_ghost_hit): 1 once the layer keeps blocks; the reuses it saw of blocks
     * passed on before (`proof`, or a count more where threads raced the first keeps), and the
     * frees it passed on meanwhile */
    F("proof", hl_set.proof);
    F("proven", __atomic_load_n(&hl_proven, __ATOMIC_RELAXED));
    F("proof_hits", hl_proof_hits);
    F("unproven", HL_STRIPED(unproven));
    /* regret=1: misses a block the prediction passed on would have served, and the frees kept
     * on those regrets against the thread's counter */
    F("regret", hl_set.regret);
    F("regret_hits", hl_regret_hits);
    F("regret_keeps", __atomic_load_n(&hl_regret_keeps, __ATOMIC_RELAXED));
    F("mmap_threshold", __atomic_load_n(&hl_follow_at, __ATOMIC_RELAXED)); /* 0: not followed */
    F("program_mmap_threshold", __atomic_load_n(&hl_program_threshold, __ATOMIC_RELAXED));
    /* threads that counted their calls on the one shared stripe, atomically (hl_stripe_claim):
     * those beyond HL_STRIPES alive at once */
    F("threads_sharing_counters", __atomic_load_n(&hl_stripe_sharers, __ATOMIC_RELAXED));
#undef F
    hl_lock_give();
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
