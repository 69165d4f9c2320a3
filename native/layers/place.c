/*
 * heapcast's placement layer (issue 45): every allocation, small ones included, placed by its
 * call site's predicted lifetime class in a separate jemalloc arena, so that blocks that outlive
 * a burst do not pin the pages of blocks that die with it (LLAMA, ASPLOS 2020).
 *
 *     make -C native place
 *     HEAPCAST_PLACE=stats=1 LD_PRELOAD="native/build/libheapcast_place.so \
 *         /usr/lib/x86_64-linux-gnu/libjemalloc.so.2" PROGRAM
 *
 * One translation unit, apart from the cache layer (layers/layer.c). The allocator behind it is
 * the next one in the lookup order (dlsym RTLD_NEXT, ../real.h); it must offer jemalloc's
 * arenas API (mallctl "arenas.create", mallocx, rallocx). Where it does not (glibc, tcmalloc,
 * mimalloc), one line on stderr and every call passes through.
 *
 * Classes: short (the allocator's own automatic arena and thread cache: the short path is the real
 * malloc, untouched) and long (one arena, made at the first request predicted long, reached by
 * mallocx with MALLOCX_ARENA and no thread cache). free, malloc_usable_size and realloc's in-place
 * cases need no routing: jemalloc finds a block's arena itself, so a foreign or double free
 * reaches the allocator exactly as without the layer. A request of jemalloc's large classes (16
 * KiB and up) is short whatever its site says, in every mode but size (hp_large_min says why).
 *
 * The prediction (mode=predict, the default): an online per-call-site survival counter, no
 * training. The site is the hook's return address, hashed into a direct-mapped table of
 * HP_NSITES entries: one word (site << 1 | long) read on the allocation path, and two counters
 * (sampled blocks that died young, that outlived the horizon). 1 in `sample` allocations of each
 * thread is recorded in a direct-mapped table of HP_NSAMPLES slots, ptr -> (site entry, the
 * process's allocation clock); the clock advances by `sample` at each sampled allocation, so it
 * counts the process's allocations to within a sample. A sampled block freed before `horizon`
 * later allocations counts short for its site; one still live past the horizon counts long, at
 * its free, when a later sample claims its slot, or when the sweep (HP_SWEEP slots in turn at
 * each sample) finds it. A site is long once it has >= 2 long samples
 * and they are >= `pct`% of its samples (halved past 256, so a site can change its mind). A site
 * whose verdict has fallen from long back to short `falls` times (default 1; 0: never) stays
 * short: its blocks' lifetimes straddle the horizon, and each turn to long places blocks that
 * mostly die young in the long arena, where their pages serve nothing else (the stats line's
 * sites_aside). A site never seen is short. Races: the tables are lock-free (relaxed atomics,
 * one compare-and-swap to claim or release a sample slot); a lost update only blurs a counter,
 * never a block.
 *
 * With a table (table=FILE, ../TABLE.md "The placement's lifetime table", distilled from the
 * registered network at registration): at each allocation the call site's key (../site_key.h,
 * the key the training data names: module and offset, hashed) and size class are looked up
 * first; where the table knows them its answer places the block, elsewhere the online counter
 * does (which learns on every site all the same). Loaded once at start; a file it cannot trust is
 * refused with one line naming it, and the counter answers everything. The stats line counts
 * table_answers and counter_answers.
 *
 * References, for measuring: mode=sites (the sites a first run learned, `learn=PATH` written at
 * its exit as "module offset" lines, `sites=PATH` read at start: long from the first call; the
 * optimistic bound, "placement by the lifetimes the same run recorded"), mode=size (no
 * prediction: requests of at least `big` bytes to the second arena), mode=off (loading alone).
 *
 * C++: operator new and delete in all their forms are interposed too (the end of this file):
 * jemalloc exports its own, which would otherwise serve a C++ program's objects past the layer.
 *
 * Safety: start-up (dlsym's own calloc: ../bootstrap_pool.h; a nested call while the layer
 * starts passes through), threads (no lock anywhere; per-thread sampling countdown and counter
 * stripe, initial-exec TLS), fork (no lock to hold across it: the child keeps its copy of the
 * counters; jemalloc handles its own locks), realloc (a long site's realloc asks rallocx for the
 * long arena; jemalloc grows in place where it can, else moves the block there; otherwise the
 * real realloc), the aligned family (a valid alignment goes to mallocx with MALLOCX_ALIGN; an
 * invalid one to the real function, for its own error), pvalloc as memalign of whole pages.
 *
 * Options: HEAPCAST_PLACE=name=value,... read once at start through HP_OPTIONS; a value it
 * cannot parse: one line on stderr, and the layer passes every call through.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../bootstrap_pool.h"
#include "../site_key.h"
#include "../table_head.h"

#define HP_EXPORT __attribute__((visibility("default")))
#define HP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HP_LIKELY(x) __builtin_expect(!!(x), 1)

/* X(name, default, doc) */
#define HP_OPTIONS(X)                                                                             \
    X(mode, "predict", "predict | sites (sites=FILE) | size (by size alone) | off")               \
    X(sample, "64", "1 in N allocations of a thread is recorded (1..65536)")                      \
    X(horizon, "262144", "a sampled block alive after this many allocations counts long")        \
    X(pct, "50", "a site is long once >= this % of its (>= 2) samples outlived the horizon")     \
    X(falls, "1", "a site whose verdict fell from long to short this many times stays short")    \
    X(big, "1024", "mode=size: requests of at least this many bytes go to the second arena")     \
    X(min_mb, "16", "the counter places long only past this many MB resident (0: no floor)")     \
    X(sites, "", "mode=sites: the file of long sites a run with learn=FILE wrote")               \
    X(learn, "", "write the long sites at exit to FILE (module offset lines)")                    \
    X(table, "", "predict: a lifetime table (TABLE.md); the counter where it has no key")         \
    X(model, "0", "table=: the model version the file must be written for (0: any)")             \
    X(stats, "0", "0 | 1 (one line on stderr at exit) | a file path (one line appended)")

/* The next allocator's functions (../real.h); malloc last. */
#define HC_REAL_FUNCS(X)                                                                          \
    X(free, void, (void *))                                                                       \
    X(malloc_usable_size, size_t, (void *))                                                       \
    X(realloc, void *, (void *, size_t))                                                          \
    X(posix_memalign, int, (void **, size_t, size_t))                                             \
    X(aligned_alloc, void *, (size_t, size_t))                                                    \
    X(memalign, void *, (size_t, size_t))                                                         \
    X(valloc, void *, (size_t))                                                                   \
    X(calloc, void *, (size_t, size_t))                                                           \
    X(malloc, void *, (size_t))
#include "../real.h"

/* jemalloc 5's flags (include/jemalloc/jemalloc_macros.h.in; no -dev package is needed). */
#define HP_MALLOCX_LG_ALIGN(la) ((int)(la))
#define HP_MALLOCX_ZERO ((int)0x40)
#define HP_MALLOCX_TCACHE_NONE ((int)((-1 + 2) << 8))
#define HP_MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)

enum hp_mode { HP_OFF, HP_PREDICT, HP_SITES, HP_SIZE };
enum hp_state { HP_START, HP_STARTING, HP_ON, HP_ASIDE };

static struct {
    enum hp_mode mode;
    int sample, pct, falls;
    uint64_t horizon, min_rss; /* min_rss: min_mb in bytes */
    size_t big;
    uint32_t model;
    char sites[512], learn[512], stats[512], table[512];
} hp_set;

/* jemalloc's own options, read by jemalloc at its start from this symbol (its weak malloc_conf,
 * which ours overrides; MALLOC_CONF in the environment overrides both). Why: a burst's short
 * blocks, placed apart from the long ones, empty whole slabs; their dirty extents coalesce into
 * one large extent, and jemalloc's default lg_extent_max_active_fit (6: a request never carves
 * an extent more than 64 times its size) makes the next burst map fresh memory beside it rather
 * than reuse it, until decay (10 s) purges it: on benchmarks/programs/burstkv.c the bound's
 * footprint grew by a burst's size at every burst (41 -> 260 MB over 8 bursts with decay off).
 * 10 lets slabs be cut from it again. Harmless to allocators that are not jemalloc. */
HP_EXPORT const char *malloc_conf = "lg_extent_max_active_fit:10";

static int hp_state; /* enum hp_state; HP_ON: the hot path routes */
static int hp_learning; /* HP_ON in mode=predict: samples taken, frees checked */
static int hp_by_size;  /* HP_ON in mode=size */
/* mallocx flags of the long arena (MALLOCX_ARENA | TCACHE_NONE); 0 until the arena exists. The
 * arena is made at the first request predicted long, not at start, and jemalloc's mallctl is
 * first called then: its first call builds jemalloc's control and statistics tables (about
 * 150 KiB resident) and a created arena's metadata adds about 90 KiB, which a program placing
 * nothing long would pay for nothing (6% of a 4 MB program's peak RSS: bc in the catalog). */
static int hp_flags;
/* enum hp_arena: who makes the long arena; one thread does, the others place short meanwhile */
static int hp_arena;
enum hp_arena { HP_ARENA_NONE, HP_ARENA_MAKING, HP_ARENA_READY, HP_ARENA_FAILED };
/* The smallest of jemalloc's large size classes: 16 KiB with 4 KiB pages. At start four pages
 * (jemalloc's SC_LARGE_MINCLASS, its page shifted by SC_LG_NGROUP 2), so that a request of a large
 * class never makes the long arena; once the arena is made, jemalloc's own answer
 * (arenas.lextent.0.size), kept where it does not say. A request of at least this is never placed
 * long, whatever its site: a large block is an extent of its own and pins no neighbour's page, so
 * the long arena buys nothing for it, and a wrong prediction costs whole extents: the blocks an
 * automatic arena frees stay dirty there (jemalloc's decay) while the long arena maps fresh ones,
 * and back again when the site's verdict turns (the catalog's kv_service: values of 64-512 KiB
 * from a site that turns long and back; docs/layer.md "Measured"). mode=size keeps its own rule
 * (`big`). */
static size_t hp_large_min = SIZE_MAX;
static void *(*hp_mallocx)(size_t, int);
static void *(*hp_rallocx)(void *, size_t, int);
static int (*hp_mallctl)(const char *, void *, size_t *, void *, size_t);

/* ---- output: stack buffers and write(2), never malloc ---- */
static void hp_write(int fd, const char *s, size_t len) {
    int saved = errno;
    while (len > 0) {
        ssize_t w = write(fd, s, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        s += w, len -= (size_t)w;
    }
    errno = saved;
}

static void hp_say(const char *what) {
    char line[768];
    int n = snprintf(line, sizeof line, "heapcast place: %s\n", what);
    if (n > 0) hp_write(2, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
}

/* ---- the site table ---- */
#define HP_NSITES 4096u
#define HP_NSAMPLES 4096u
#define HP_CLOCK_MASK ((UINT64_C(1) << 48) - 1)

struct hp_site {
    uintptr_t word;          /* site << 1 | long; 0: empty. The one field the hot path reads. */
    uint16_t nshort, nlong;  /* sampled blocks that died young, that outlived the horizon */
    uint16_t falls;          /* times its verdict fell from long back to short (hp_learn) */
};
static struct hp_site hp_sites[HP_NSITES] __attribute__((aligned(64)));

struct hp_sample {
    uintptr_t ptr; /* 0: free slot */
    uint64_t val;  /* HP_PLACED_LONG | site entry << 48 | the clock at its allocation */
};
#define HP_PLACED_LONG (UINT64_C(1) << 63) /* the sampled block went to the long arena */
static struct hp_sample hp_samples[HP_NSAMPLES] __attribute__((aligned(64)));
static uint64_t hp_clock __attribute__((aligned(64)));

static inline unsigned hp_site_index(uintptr_t site) {
    return (unsigned)((site * UINT64_C(0x9E3779B97F4A7C15)) >> 52) & (HP_NSITES - 1);
}
static inline unsigned hp_sample_index(uintptr_t p) {
    return (unsigned)((p * UINT64_C(0x9E3779B97F4A7C15)) >> 52) & (HP_NSAMPLES - 1);
}

/* ---- counters: a stripe per thread (64; threads beyond share one, approximately) ---- */
struct hp_stripe {
    uint64_t long_allocs, sampled, dropped;
    uint64_t held_small; /* called long by the counter, placed short: the process under min_mb */
    uint64_t table_answers, counter_answers; /* with a table: who answered each allocation */
} __attribute__((aligned(64)));
static struct hp_stripe hp_stripes[65];
static unsigned hp_next_stripe;
static __thread struct hp_stripe *hp_tls_stripe __attribute__((tls_model("initial-exec")));
static __thread int hp_tls_countdown __attribute__((tls_model("initial-exec")));
static uint64_t hp_evicted_long, hp_freed_short, hp_freed_long;
/* sampled blocks the layer placed long that died within the horizon (a wrong placement) or
 * outlived it (a right one): the stats line's long_young and long_old */
static uint64_t hp_long_young, hp_long_old;

static inline struct hp_stripe *hp_stripe(void) {
    struct hp_stripe *s = hp_tls_stripe;
    if (HP_UNLIKELY(s == NULL)) {
        unsigned i = __atomic_fetch_add(&hp_next_stripe, 1, __ATOMIC_RELAXED);
        s = hp_tls_stripe = &hp_stripes[i < 64 ? i : 64];
    }
    return s;
}
#define HP_COUNT(s, field) __atomic_store_n(&(s)->field, (s)->field + 1, __ATOMIC_RELAXED)

/* A site whose verdict has fallen from long back to short `falls` times stays short (aside). */
static inline int hp_aside(uint16_t falls) { return hp_set.falls && falls >= hp_set.falls; }

/* One sampled block's verdict for its site entry; the class recomputed. */
static void hp_learn(unsigned e, int outlived) {
    struct hp_site *t = &hp_sites[e];
    uint32_t ns = __atomic_load_n(&t->nshort, __ATOMIC_RELAXED);
    uint32_t nl = __atomic_load_n(&t->nlong, __ATOMIC_RELAXED);
    if (outlived) nl++;
    else ns++;
    if (ns + nl > 256) ns /= 2, nl /= 2;
    __atomic_store_n(&t->nshort, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&t->nlong, nl, __ATOMIC_RELAXED);
    uintptr_t w = __atomic_load_n(&t->word, __ATOMIC_RELAXED);
    if (w == 0) return;
    uintptr_t lng = nl >= 2 && (uint64_t)nl * 100 >= (uint64_t)hp_set.pct * (ns + nl);
    uint16_t falls = __atomic_load_n(&t->falls, __ATOMIC_RELAXED);
    if ((w & 1) && !lng && falls < UINT16_MAX)
        __atomic_store_n(&t->falls, ++falls, __ATOMIC_RELAXED);
    if (hp_aside(falls)) lng = 0; /* its verdict proved unstable */
    __atomic_store_n(&t->word, (w & ~(uintptr_t)1) | lng, __ATOMIC_RELAXED);
}

/* A sampled block's verdict (`v` its slot's value): its site learns it, and it counts as a right
 * or a wrong long placement if it was placed long. */
static void hp_verdict(uint64_t v, int outlived) {
    if (v & HP_PLACED_LONG)
        __atomic_fetch_add(outlived ? &hp_long_old : &hp_long_young, 1, __ATOMIC_RELAXED);
    hp_learn((unsigned)((v >> 48) & (HP_NSITES - 1)), outlived);
}

static void hp_sweep(uint64_t now);

/* A sampled allocation: claim the site's entry if another site holds it, record p (and whether
 * it went to the long arena: placed_long). */
static __attribute__((noinline)) void hp_sample(void *p, uintptr_t site, int placed_long) {
    if (!hp_learning) {
        hp_tls_countdown = INT32_MAX; /* mode=sites, size: nothing to learn */
        return;
    }
    hp_tls_countdown = hp_set.sample;
    if (p == NULL) return;
    struct hp_stripe *s = hp_stripe();
    HP_COUNT(s, sampled);
    unsigned e = hp_site_index(site);
    uintptr_t w = __atomic_load_n(&hp_sites[e].word, __ATOMIC_RELAXED);
    if ((w >> 1) != site) { /* new here: this site takes the entry, counts afresh */
        __atomic_store_n(&hp_sites[e].nshort, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_sites[e].nlong, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_sites[e].falls, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hp_sites[e].word, site << 1, __ATOMIC_RELAXED);
    }
    uint64_t now = __atomic_add_fetch(&hp_clock, (uint64_t)hp_set.sample, __ATOMIC_RELAXED);
    hp_sweep(now);
    struct hp_sample *slot = &hp_samples[hp_sample_index((uintptr_t)p)];
    uintptr_t old = __atomic_load_n(&slot->ptr, __ATOMIC_ACQUIRE);
    if (old != 0) {
        uint64_t v = __atomic_load_n(&slot->val, __ATOMIC_RELAXED);
        if (((now - v) & HP_CLOCK_MASK) < hp_set.horizon) {
            HP_COUNT(s, dropped); /* the slot's block is young still: keep watching it */
            return;
        }
        if (!__atomic_compare_exchange_n(&slot->ptr, &old, (uintptr_t)p, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            return;
        __atomic_fetch_add(&hp_evicted_long, 1, __ATOMIC_RELAXED);
        hp_verdict(v, 1); /* outlived the horizon: its site's long count */
    } else if (!__atomic_compare_exchange_n(&slot->ptr, &old, (uintptr_t)p, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
        return;
    }
    uint64_t mark = placed_long ? HP_PLACED_LONG : 0;
    __atomic_store_n(&slot->val, mark | ((uint64_t)e << 48) | (now & HP_CLOCK_MASK),
                     __ATOMIC_RELEASE);
}

/* At each sample, HP_SWEEP more slots in turn: a block live past the horizon gets its verdict
 * (long) and frees its slot within HP_NSAMPLES / HP_SWEEP samples of passing it, rather than
 * when a new sample happens to land on its slot (on average another horizon later). */
#define HP_SWEEP 4u
static unsigned hp_sweep_cursor;

static void hp_sweep(uint64_t now) {
    unsigned c = __atomic_fetch_add(&hp_sweep_cursor, HP_SWEEP, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < HP_SWEEP; i++) {
        struct hp_sample *slot = &hp_samples[(c + i) & (HP_NSAMPLES - 1)];
        uintptr_t k = __atomic_load_n(&slot->ptr, __ATOMIC_ACQUIRE);
        if (k == 0) continue;
        uint64_t v = __atomic_load_n(&slot->val, __ATOMIC_ACQUIRE);
        if (((now - v) & HP_CLOCK_MASK) < hp_set.horizon) continue;
        if (!__atomic_compare_exchange_n(&slot->ptr, &k, 0, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        __atomic_fetch_add(&hp_evicted_long, 1, __ATOMIC_RELAXED);
        hp_verdict(v, 1);
    }
}

/* At a free: if p is a sampled block, its verdict. Then the caller frees it. */
static inline void hp_free_sampled(void *p) {
    struct hp_sample *slot = &hp_samples[hp_sample_index((uintptr_t)p)];
    uintptr_t k = __atomic_load_n(&slot->ptr, __ATOMIC_RELAXED);
    if (HP_LIKELY(k != (uintptr_t)p) || p == NULL) return;
    uint64_t v = __atomic_load_n(&slot->val, __ATOMIC_ACQUIRE);
    if (!__atomic_compare_exchange_n(&slot->ptr, &k, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    uint64_t now = __atomic_load_n(&hp_clock, __ATOMIC_RELAXED);
    int outlived = ((now - v) & HP_CLOCK_MASK) >= hp_set.horizon;
    __atomic_fetch_add(outlived ? &hp_freed_long : &hp_freed_short, 1, __ATOMIC_RELAXED);
    hp_verdict(v, outlived);
}

/* ---- the lifetime table (table=FILE; the format: ../TABLE.md, "The placement's lifetime
 * table") ----
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
static int hp_off; /* the options read, mode=off: every call passes, the stats line says so */
static int hp_big; /* 1 once the counter's floor was reached, or there is none (hp_reached_floor) */
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

/* ---- start ---- */
static int hp_parse_u64(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end) return 0;
    *out = x;
    return 1;
}

/* HEAPCAST_PLACE parsed into hp_set; 0 (with one line on stderr) on anything it cannot parse. */
static int hp_parse_options(void) {
    uint64_t sample = 64, horizon = 262144, pct = 50, big = 1024, falls = 1, min_mb = 16;
    hp_set.mode = HP_PREDICT;
    const char *env = getenv("HEAPCAST_PLACE");
    char buf[2048];
    if (env == NULL) env = "";
    if (strlen(env) >= sizeof buf) {
        hp_say("HEAPCAST_PLACE is too long; passing every call through");
        return 0;
    }
    strcpy(buf, env);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        int ok = eq != NULL;
        if (ok) {
            *eq = 0;
            const char *k = item, *v = eq + 1;
            if (!strcmp(k, "mode")) {
                if (!strcmp(v, "predict")) hp_set.mode = HP_PREDICT;
                else if (!strcmp(v, "sites")) hp_set.mode = HP_SITES;
                else if (!strcmp(v, "size")) hp_set.mode = HP_SIZE;
                else if (!strcmp(v, "off")) hp_set.mode = HP_OFF;
                else ok = 0;
            } else if (!strcmp(k, "sample")) {
                ok = hp_parse_u64(v, &sample) && sample >= 1 && sample <= 65536;
            } else if (!strcmp(k, "horizon")) {
                ok = hp_parse_u64(v, &horizon) && horizon >= 1 && horizon < HP_CLOCK_MASK / 2;
            } else if (!strcmp(k, "pct")) {
                ok = hp_parse_u64(v, &pct) && pct <= 100;
            } else if (!strcmp(k, "falls")) {
                ok = hp_parse_u64(v, &falls) && falls <= UINT16_MAX;
            } else if (!strcmp(k, "big")) {
                ok = hp_parse_u64(v, &big);
            } else if (!strcmp(k, "min_mb")) {
                ok = hp_parse_u64(v, &min_mb) && min_mb <= (1u << 20);
            } else if (!strcmp(k, "model")) {
                uint64_t m;
                ok = hp_parse_u64(v, &m) && m <= UINT32_MAX;
                if (ok) hp_set.model = (uint32_t)m;
            } else if (!strcmp(k, "sites") || !strcmp(k, "learn") || !strcmp(k, "stats") ||
                       !strcmp(k, "table")) {
                char *dst = !strcmp(k, "sites")   ? hp_set.sites
                            : !strcmp(k, "learn") ? hp_set.learn
                            : !strcmp(k, "table") ? hp_set.table
                                                  : hp_set.stats;
                ok = strlen(v) < sizeof hp_set.sites;
                if (ok) strcpy(dst, v);
            } else {
                ok = 0;
            }
            if (!ok) *eq = '=';
        }
        if (!ok) {
            char line[600];
#define HP_NAME_(name, def, doc) " " #name
            snprintf(line, sizeof line,
                     "cannot parse HEAPCAST_PLACE item '%.200s' (options:" HP_OPTIONS(HP_NAME_)
                     "); passing every call through",
                     item);
#undef HP_NAME_
            hp_say(line);
            return 0;
        }
    }
    if (hp_set.mode == HP_SITES && hp_set.sites[0] == 0) {
        hp_say("mode=sites needs sites=FILE; passing every call through");
        return 0;
    }
    if (hp_set.table[0] && hp_set.mode != HP_PREDICT) {
        hp_say("table=FILE needs mode=predict (the counter answers where the table does not); "
               "passing every call through");
        return 0;
    }
    hp_set.sample = (int)sample, hp_set.horizon = horizon, hp_set.pct = (int)pct;
    hp_set.falls = (int)falls;
    hp_set.big = (size_t)big;
    hp_set.min_rss = min_mb << 20;
    return 1;
}

/* Once, from the first hook call that finds the real functions: the options, the arenas API,
 * the long arena. A call nested in it (dlsym's calloc, jemalloc's own start) passes through;
 * so do calls from other threads meanwhile (no waiting, no lock: safe across fork too). */
static __attribute__((noinline)) void hp_start(void) {
    int expect = HP_START;
    if (!__atomic_compare_exchange_n(&hp_state, &expect, HP_STARTING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    int next = HP_ASIDE;
    int parsed = hp_parse_options();
    hp_off = parsed && hp_set.mode == HP_OFF;
    if (parsed && !hp_off) {
        hp_mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_NEXT,
                                                                                   "mallctl");
        hp_mallocx = (void *(*)(size_t, int))dlsym(RTLD_NEXT, "mallocx");
        hp_rallocx = (void *(*)(void *, size_t, int))dlsym(RTLD_NEXT, "rallocx");
        if (!hp_mallctl || !hp_mallocx || !hp_rallocx) {
            hp_say("the next allocator has no arenas API (mallctl, mallocx: jemalloc's); "
                   "passing every call through");
        } else {
            hp_large_min = (size_t)sysconf(_SC_PAGESIZE) << 2;
            hp_learning = hp_set.mode == HP_PREDICT;
            hp_big = hp_set.min_rss == 0; /* no floor */
            if (hp_set.table[0]) {
                hc_site_init(); /* the program's name, as the tracer records it */
                const char *why = hp_load_life(hp_set.table);
                if (why) {
                    char line[700];
                    snprintf(line, sizeof line, "table file %.500s refused: it %s", hp_set.table,
                             why);
                    hp_say(line);
                    hp_life_refused = 1;
                } else {
                    hp_life_on = 1;
                }
            }
            hp_by_size = hp_set.mode == HP_SIZE;
            next = HP_ON;
        }
    }
    __atomic_store_n(&hp_state, next, __ATOMIC_RELEASE);
}

/* ---- the sites files (mode=sites, learn=): "module offset" lines; "-" is the program ---- */
struct hp_find {
    uintptr_t addr;        /* in: an address (learn) */
    const char *name;      /* in: a module name (sites); out: the module holding addr */
    uintptr_t base;        /* out */
    int found;
};

static int hp_find_module(struct dl_phdr_info *info, size_t size, void *arg) {
    struct hp_find *f = arg;
    const char *name = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "-";
    if (f->name != NULL && f->addr == 0) {
        if (strcmp(name, f->name) != 0) return 0;
        f->base = info->dlpi_addr, f->found = 1;
        return 1;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (f->addr >= lo && f->addr < lo + ph->p_memsz) {
            f->name = name, f->base = info->dlpi_addr, f->found = 1;
            return 1;
        }
    }
    return 0;
}

/* At start (the library's constructor: dl_iterate_phdr takes the loader's lock, which a first
 * malloc inside dlopen may hold): the long sites, frozen (no learning in mode=sites). */
static void hp_read_sites(void) {
    static char text[1 << 16];
    int fd = open(hp_set.sites, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        hp_say("cannot open the sites file; every site is short");
        return;
    }
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return;
    text[n] = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sp = strrchr(line, ' ');
        if (sp == NULL) continue;
        *sp = 0;
        struct hp_find f = {.name = line};
        dl_iterate_phdr(hp_find_module, &f);
        if (!f.found) continue;
        uintptr_t site = f.base + (uintptr_t)strtoull(sp + 1, NULL, 16);
        hp_sites[hp_site_index(site)].word = site << 1 | 1;
    }
}

static void hp_write_sites(void) {
    int fd = open(hp_set.learn, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        hp_say("cannot write the learn file");
        return;
    }
    for (unsigned e = 0; e < HP_NSITES; e++) {
        uintptr_t w = hp_sites[e].word;
        if (!(w & 1)) continue;
        struct hp_find f = {.addr = w >> 1};
        dl_iterate_phdr(hp_find_module, &f);
        if (!f.found) continue;
        char line[600];
        int len = snprintf(line, sizeof line, "%.500s %lx\n", f.name,
                           (unsigned long)((w >> 1) - f.base));
        if (len > 0 && len < (int)sizeof line) hp_write(fd, line, (size_t)len);
    }
    close(fd);
}

__attribute__((constructor)) static void hp_constructor(void) {
    if (HC_REAL(malloc) == NULL) return;
    hp_start();
    if (__atomic_load_n(&hp_state, __ATOMIC_ACQUIRE) == HP_ON && hp_set.mode == HP_SITES)
        hp_read_sites();
}

static void hp_write_stats(void);

__attribute__((destructor)) static void hp_destructor(void) {
    if (__atomic_load_n(&hp_state, __ATOMIC_ACQUIRE) != HP_ON) {
        if (hp_off) hp_write_stats(); /* mode=off: its line says so, every count 0 */
        return;
    }
    /* blocks still live past the horizon count long (a block never freed is long-lived) */
    uint64_t now = __atomic_load_n(&hp_clock, __ATOMIC_RELAXED);
    if (hp_set.mode == HP_PREDICT) {
        for (unsigned i = 0; i < HP_NSAMPLES; i++) {
            struct hp_sample *slot = &hp_samples[i];
            uintptr_t k = __atomic_load_n(&slot->ptr, __ATOMIC_ACQUIRE);
            if (k == 0) continue;
            uint64_t v = __atomic_load_n(&slot->val, __ATOMIC_ACQUIRE);
            if (((now - v) & HP_CLOCK_MASK) >= hp_set.horizon) hp_verdict(v, 1);
        }
    }
    if (hp_set.learn[0]) hp_write_sites();
    hp_write_stats();
}

/* The stats line (stats=1: stderr; a path: appended), once, at exit. */
static void hp_write_stats(void) {
    if (!hp_set.stats[0] || !strcmp(hp_set.stats, "0")) return;
    struct hp_stripe t = {0};
    for (int i = 0; i < 65; i++) {
        t.long_allocs += hp_stripes[i].long_allocs;
        t.sampled += hp_stripes[i].sampled, t.dropped += hp_stripes[i].dropped;
        t.held_small += hp_stripes[i].held_small;
        t.table_answers += hp_stripes[i].table_answers;
        t.counter_answers += hp_stripes[i].counter_answers;
    }
    unsigned long sites_long = 0, sites_seen = 0, sites_aside = 0;
    for (unsigned e = 0; e < HP_NSITES; e++) {
        sites_seen += hp_sites[e].word != 0;
        sites_long += hp_sites[e].word & 1;
        sites_aside += hp_sites[e].word && hp_aside(hp_sites[e].falls);
    }
    static const char *const names[] = {"off", "predict", "sites", "size"};
    char line[700];
    int n = snprintf(line, sizeof line,
                     "heapcast place: pid=%d mode=%s long=%llu sampled=%llu "
                     "dropped=%llu freed_short=%llu freed_long=%llu evicted_long=%llu "
                     "sites_seen=%lu sites_long=%lu sites_aside=%lu table=%d table_refused=%d "
                     "table_answers=%llu counter_answers=%llu long_young=%llu long_old=%llu "
                     "held_small=%llu\n",
                     (int)getpid(), names[hp_set.mode],
                     (unsigned long long)t.long_allocs, (unsigned long long)t.sampled,
                     (unsigned long long)t.dropped, (unsigned long long)hp_freed_short,
                     (unsigned long long)hp_freed_long, (unsigned long long)hp_evicted_long,
                     sites_seen, sites_long, sites_aside, hp_life_on, hp_life_refused,
                     (unsigned long long)t.table_answers, (unsigned long long)t.counter_answers,
                     (unsigned long long)hp_long_young, (unsigned long long)hp_long_old,
                     (unsigned long long)t.held_small);
    if (n <= 0 || n >= (int)sizeof line) return;
    if (!strcmp(hp_set.stats, "1")) {
        hp_write(2, line, (size_t)n);
        return;
    }
    int fd = open(hp_set.stats, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) hp_write(fd, line, (size_t)n), close(fd);
}

/* ---- the decision on the allocation path ---- */

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

/* Make the long arena (once, by the first thread to ask; jemalloc's arenas.create); 1 once it
 * exists. While another thread makes it, or where jemalloc refused (said once), 0: the request
 * is placed short, as it would be without the layer (so too, for good, in a child forked while
 * another thread was making it). */
static __attribute__((noinline)) int hp_make_arena(void) {
    int expect = HP_ARENA_NONE;
    if (!__atomic_compare_exchange_n(&hp_arena, &expect, HP_ARENA_MAKING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return expect == HP_ARENA_READY;
    size_t large = 0, large_len = sizeof large;
    if (hp_mallctl("arenas.lextent.0.size", &large, &large_len, NULL, 0) == 0 && large)
        __atomic_store_n(&hp_large_min, large, __ATOMIC_RELAXED);
    unsigned arena = 0;
    size_t len = sizeof arena;
    if (hp_mallctl("arenas.create", &arena, &len, NULL, 0) != 0) {
        hp_say("mallctl arenas.create failed; placing every request short");
        __atomic_store_n(&hp_arena, HP_ARENA_FAILED, __ATOMIC_RELEASE);
        return 0;
    }
    __atomic_store_n(&hp_flags, HP_MALLOCX_ARENA(arena) | HP_MALLOCX_TCACHE_NONE,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&hp_arena, HP_ARENA_READY, __ATOMIC_RELEASE);
    return 1;
}

/* 1 once the long arena exists (made now if it was not). */
static inline int hp_arena_ready(void) {
    return HP_LIKELY(__atomic_load_n(&hp_flags, __ATOMIC_ACQUIRE) != 0) || hp_make_arena();
}

/* The counter's floor (min_mb): its verdicts place long only once the process has had min_mb
 * resident. Below it, the long arena's fixed cost (jemalloc's control tables, the arena's
 * metadata, a slab per size class it serves: 250 KiB and more) is a few percent of the
 * program, while all it can save is a share of a heap that small: on the catalog, bc (4 MB)
 * paid +6% of peak RSS, nasm (6 MB) +3%, for nothing. The table and the sites file place from
 * the first call: what they know was learnt elsewhere. hp_big: 1 once the floor was reached
 * (for good); the resident set is read from /proc/self/statm by one thread at a time, at most
 * once per 65536 allocations of the clock. */
static uint64_t hp_rss_read_at = (uint64_t)-1; /* the clock at the last read; -1: never */

static __attribute__((noinline)) int hp_reached_floor(void) {
    uint64_t now = __atomic_load_n(&hp_clock, __ATOMIC_RELAXED);
    uint64_t then = __atomic_load_n(&hp_rss_read_at, __ATOMIC_RELAXED);
    if (then != (uint64_t)-1 && now - then < 65536) return 0;
    if (!__atomic_compare_exchange_n(&hp_rss_read_at, &then, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return 0; /* another thread reads it */
    int saved = errno, big = 0;
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[128];
        ssize_t got = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (got > 0) {
            buf[got] = 0;
            char *p = strchr(buf, ' '); /* size, then resident, in pages */
            uint64_t pages = p ? strtoull(p + 1, NULL, 10) : 0;
            big = pages * (uint64_t)sysconf(_SC_PAGESIZE) >= hp_set.min_rss;
        }
    }
    errno = saved;
    if (big) __atomic_store_n(&hp_big, 1, __ATOMIC_RELAXED);
    return big;
}

/* This request's prediction: 0 short, HP_BY_COUNTER long by the online counter's verdict,
 * HP_KNOWN long by the table, the sites file or size alone. Three loads on the path of every
 * allocation without a table: the mode flag, the large-size limit and the site's table word
 * (with one: the lifetime table first). */
enum { HP_BY_COUNTER = 1, HP_KNOWN = 2 };
static inline int hp_predicted_long(size_t n, uintptr_t site) {
    if (HP_UNLIKELY(hp_by_size)) return n >= hp_set.big ? HP_KNOWN : 0;
    if (HP_UNLIKELY(n >= __atomic_load_n(&hp_large_min, __ATOMIC_RELAXED)))
        return 0; /* a large block pins no neighbour */
    if (HP_UNLIKELY(hp_life_on)) {
        int said = hp_life_long(n, site);
        if (said >= 0) return said ? HP_KNOWN : 0;
    }
    uintptr_t w = __atomic_load_n(&hp_sites[hp_site_index(site)].word, __ATOMIC_RELAXED);
    if (HP_LIKELY((w >> 1) != site || !(w & 1))) return 0;
    return hp_learning ? HP_BY_COUNTER : HP_KNOWN;
}

/* 1: this request goes to the long arena: predicted long (by the counter, once the process is
 * past its floor), the arena there to take it, and (the limit known once the arena is made) not
 * of a large class, but in mode size. */
static inline int hp_long(size_t n, uintptr_t site) {
    int why = hp_predicted_long(n, site);
    if (HP_LIKELY(!why)) return 0;
    if (why == HP_BY_COUNTER && HP_UNLIKELY(!__atomic_load_n(&hp_big, __ATOMIC_RELAXED)) &&
        !hp_reached_floor()) {
        HP_COUNT(hp_stripe(), held_small);
        return 0;
    }
    return hp_arena_ready() &&
           (hp_by_size || n < __atomic_load_n(&hp_large_min, __ATOMIC_RELAXED));
}

/* 1 in `sample` allocations of the thread (the caller then calls hp_sample, which resets the
 * countdown; outside mode=predict it parks it at INT_MAX) */
static inline int hp_sampling(void) { return HP_UNLIKELY(--hp_tls_countdown <= 0); }

static inline int hp_on(void) {
    int st = __atomic_load_n(&hp_state, __ATOMIC_ACQUIRE);
    if (HP_LIKELY(st == HP_ON)) return 1;
    if (st == HP_START) hp_start();
    return __atomic_load_n(&hp_state, __ATOMIC_ACQUIRE) == HP_ON;
}

static __attribute__((noinline)) void *hp_long_alloc(size_t n, int flags) {
    HP_COUNT(hp_stripe(), long_allocs);
    void *p = hp_mallocx(n ? n : 1, hp_flags | flags); /* mallocx(0) is undefined */
    if (p == NULL) errno = ENOMEM;
    return p;
}

/* malloc and calloc share it: zero: MALLOCX_ZERO on the long path, calloc on the short one. */
static inline void *hp_alloc(size_t n, int zero, uintptr_t site) {
    void *p;
    int lng = hp_long(n, site);
    if (HP_UNLIKELY(lng)) p = hp_long_alloc(n, zero ? HP_MALLOCX_ZERO : 0);
    else p = zero ? hc_real.calloc(1, n) : hc_real.malloc(n);
    if (hp_sampling()) hp_sample(p, site, lng);
    return p;
}

static int hp_pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* The aligned family: a long site with a valid alignment to mallocx, else fn() (the real
 * function, which also answers an invalid alignment as it would without the layer). */
static void *hp_aligned(size_t align, size_t n, uintptr_t site, int *handled) {
    *handled = 0;
    if (!hp_on() || !hp_pow2(align)) return NULL;
    if (!hp_long(n, site)) {
        if (hp_sampling()) hp_tls_countdown = 1; /* sample the next one instead */
        return NULL;
    }
    *handled = 1;
    void *p = hp_long_alloc(n, HP_MALLOCX_LG_ALIGN(__builtin_ctzll(align)));
    if (hp_sampling()) hp_sample(p, site, 1);
    return p;
}

/* ---- the hooks ---- */
#define HP_SITE ((uintptr_t)__builtin_return_address(0))

HP_EXPORT void *malloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(malloc);
    if (HP_UNLIKELY(!f)) return hc_pool_alloc(n, 16);
    if (HP_UNLIKELY(!hp_on())) return f(n);
    return hp_alloc(n, 0, HP_SITE);
}

HP_EXPORT void free(void *p) {
    if (HP_UNLIKELY(hc_in_pool(p))) return; /* the start-up pool's blocks are never reused */
    void (*f)(void *) = HC_REAL(free);
    if (HP_UNLIKELY(!f)) return; /* start-up: no real free yet, and p is not the pool's: leak */
    if (hp_learning) hp_free_sampled(p);
    f(p);
}

HP_EXPORT void *calloc(size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    void *(*f)(size_t, size_t) = HC_REAL(calloc);
    if (HP_UNLIKELY(!f)) return hc_pool_alloc(total, 16);
    if (HP_UNLIKELY(!hp_on())) return f(m, n);
    return hp_alloc(total, 1, HP_SITE);
}

HP_EXPORT void *realloc(void *old, size_t n) {
    uintptr_t site = HP_SITE;
    if (old == NULL) {
        void *(*f)(size_t) = HC_REAL(malloc);
        if (HP_UNLIKELY(!f)) return hc_pool_alloc(n, 16);
        if (HP_UNLIKELY(!hp_on())) return f(n);
        return hp_alloc(n, 0, site);
    }
    if (HP_UNLIKELY(hc_in_pool(old))) {
        void *q = malloc(n ? n : 1);
        if (q) {
            size_t o = hc_pool_size(old);
            memcpy(q, old, o < n ? o : n);
        }
        return q;
    }
    void *(*real_realloc)(void *, size_t) = HC_REAL(realloc);
    if (HP_UNLIKELY(!real_realloc)) {
        errno = ENOMEM; /* start-up, a block not the pool's: a failed realloc keeps it */
        return NULL;
    }
    if (HP_UNLIKELY(!hp_on()) || n == 0) {
        if (n == 0 && hp_learning) hp_free_sampled(old);
        return real_realloc(old, n);
    }
    /* the old block's sample (if any) ends here: its life as this block is over */
    if (hp_learning) hp_free_sampled(old);
    void *q;
    int lng = hp_long(n, site);
    if (lng) {
        HP_COUNT(hp_stripe(), long_allocs);
        q = hp_rallocx(old, n, hp_flags); /* in place where it can, else moved to the arena */
        if (q == NULL) errno = ENOMEM;
    } else {
        q = real_realloc(old, n);
    }
    if (hp_sampling()) hp_sample(q, site, lng);
    return q;
}

HP_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(old, total);
}

HP_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    int (*f)(void **, size_t, size_t) = HC_REAL(posix_memalign);
    if (HP_UNLIKELY(!f)) {
        if (!hp_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
        void *p = hc_pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    if (align % sizeof(void *) != 0) return f(out, align, n);
    int handled, saved = errno;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    if (!handled) return f(out, align, n);
    if (p == NULL) return errno = saved, ENOMEM;
    *out = p;
    return 0;
}

HP_EXPORT void *aligned_alloc(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(aligned_alloc);
    if (HP_UNLIKELY(!f)) return hp_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    int handled;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    return handled ? p : f(align, n);
}

HP_EXPORT void *memalign(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (HP_UNLIKELY(!f)) return hp_pow2(align) ? hc_pool_alloc(n, align) : NULL;
    int handled;
    void *p = hp_aligned(align, n, HP_SITE, &handled);
    return handled ? p : f(align, n);
}

HP_EXPORT void *valloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(valloc);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (HP_UNLIKELY(!f)) return hc_pool_alloc(n, page);
    int handled;
    void *p = hp_aligned(page, n, HP_SITE, &handled);
    return handled ? p : f(n);
}

/* obsolete: valloc of n rounded up to whole pages (one page for 0), as glibc's. Never the next
 * allocator's own pvalloc: jemalloc 5.3 exports none, so dlsym finds glibc's, whose block
 * jemalloc's free then takes for its own (tests/native/programs/allforms.c crashes under jemalloc
 * alone); memalign is in both. */
HP_EXPORT void *pvalloc(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = n == 0 ? page : (n + page - 1) & ~(page - 1);
    if (rounded < n) {
        errno = ENOMEM;
        return NULL;
    }
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    if (HP_UNLIKELY(!f)) return hc_pool_alloc(rounded, page);
    int handled;
    void *p = hp_aligned(page, rounded, HP_SITE, &handled);
    return handled ? p : f(page, rounded);
}

HP_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (hc_in_pool(p)) return hc_pool_size(p);
    size_t (*f)(void *) = HC_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}

/* ---- C++'s operator new and delete ----
 * jemalloc exports its own (they call mallocx and sdallocx, never malloc): without these a C++
 * program's new would reach jemalloc past the layer, never placed, never sampled. Each new here
 * asks the site's class like malloc; a long site goes to the long arena, and a failure there to
 * the next operator new, which throws (or returns NULL, nothrow) as without the layer. Each
 * delete ends the block's sample, then calls the next delete of the same signature. The next
 * functions are looked up on first use (dlsym RTLD_NEXT: jemalloc's, else libstdc++'s, which
 * call malloc and free, our hooks, again: harmless). std::align_val_t is a size_t in the ABI, a
 * nothrow_t& a pointer. */
#define HP_NEXT(fn, name)                                                                         \
    ({                                                                                            \
        __typeof__(fn) f_ = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);                               \
        if (HP_UNLIKELY(f_ == NULL)) {                                                            \
            f_ = (__typeof__(fn))dlsym(RTLD_NEXT, name);                                          \
            __atomic_store_n(&fn, f_, __ATOMIC_RELEASE);                                          \
        }                                                                                         \
        f_;                                                                                       \
    })

/* X(mangled name, parameter list, argument list, the alignment argument or 0) */
#define HP_NEWS(X)                                                                                \
    X(_Znwm, (size_t n), (n), 0)                                                                  \
    X(_Znam, (size_t n), (n), 0)                                                                  \
    X(_ZnwmRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), 0)                                \
    X(_ZnamRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), 0)                                \
    X(_ZnwmSt11align_val_t, (size_t n, size_t al), (n, al), al)                                   \
    X(_ZnamSt11align_val_t, (size_t n, size_t al), (n, al), al)                                   \
    X(_ZnwmSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), al) \
    X(_ZnamSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), al)

#define HP_DELETES(X)                                                                             \
    X(_ZdlPv, (void *p), (p))                                                                     \
    X(_ZdaPv, (void *p), (p))                                                                     \
    X(_ZdlPvm, (void *p, size_t n), (p, n))                                                       \
    X(_ZdaPvm, (void *p, size_t n), (p, n))                                                       \
    X(_ZdlPvRKSt9nothrow_t, (void *p, const void *nt), (p, nt))                                   \
    X(_ZdaPvRKSt9nothrow_t, (void *p, const void *nt), (p, nt))                                   \
    X(_ZdlPvSt11align_val_t, (void *p, size_t al), (p, al))                                       \
    X(_ZdaPvSt11align_val_t, (void *p, size_t al), (p, al))                                       \
    X(_ZdlPvmSt11align_val_t, (void *p, size_t n, size_t al), (p, n, al))                         \
    X(_ZdaPvmSt11align_val_t, (void *p, size_t n, size_t al), (p, n, al))                         \
    X(_ZdlPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const void *nt), (p, al, nt))     \
    X(_ZdaPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const void *nt), (p, al, nt))

#define HP_NEW_(name, params, args, align)                                                        \
    HP_EXPORT void *name params;                                                                  \
    void *name params {                                                                           \
        static void *(*next) params;                                                              \
        uintptr_t site = HP_SITE;                                                                 \
        int on = hp_on();                                                                         \
        void *p = NULL;                                                                           \
        int lng = on && hp_long(n, site);                                                         \
        if (HP_UNLIKELY(lng))                                                                     \
            p = hp_long_alloc(n, (align) ? HP_MALLOCX_LG_ALIGN(__builtin_ctzll(align)) : 0);     \
        if (p == NULL) {                                                                          \
            lng = 0; /* not in the long arena: jemalloc's own new serves it */                    \
            void *(*f) params = HP_NEXT(next, #name);                                             \
            p = f ? f args : malloc(n);                                                           \
        }                                                                                         \
        if (on && hp_sampling()) hp_sample(p, site, lng);                                         \
        return p;                                                                                 \
    }
HP_NEWS(HP_NEW_)

#define HP_DELETE_(name, params, args)                                                            \
    HP_EXPORT void name params;                                                                   \
    void name params {                                                                            \
        static void (*next) params;                                                               \
        if (hp_learning) hp_free_sampled(p);                                                      \
        void (*f) params = HP_NEXT(next, #name);                                                  \
        if (f) f args;                                                                            \
        else free(p);                                                                             \
    }
HP_DELETES(HP_DELETE_)
