/*
 * heapcast's placement layer: LD_PRELOAD in front of jemalloc, every allocation (small ones
 * included) placed by its site's predicted lifetime class (the site: the calling context of
 * `depth` frames, ../context_key.h, or the call site alone at depth 1): short in jemalloc's own
 * automatic arena and thread cache (the real malloc, untouched), long in one arena of its own,
 * so that blocks that outlive a burst do not pin the pages of blocks that die with it. The design,
 * its options and its measurements: docs/layer.md, "Placement"; the table file: ../TABLE.md.
 *
 *     make -C native place
 *     HEAPCAST_PLACE=stats=1 LD_PRELOAD="native/build/libheapcast_place.so \
 *         /usr/lib/x86_64-linux-gnu/libjemalloc.so.2" PROGRAM
 *
 * The allocator behind it is the next one in the lookup order (dlsym RTLD_NEXT, ../real.h); it
 * must offer jemalloc's arenas API (mallctl "arenas.create", mallocx, rallocx). Where it does not
 * (glibc, tcmalloc, mimalloc), one line on stderr and every call passes through; so too for an
 * option it cannot parse (HEAPCAST_PLACE=name=value,..., read once at start through HP_OPTIONS).
 * free, malloc_usable_size and realloc's in-place cases need no routing: jemalloc finds a block's
 * arena itself, so a foreign or double free reaches the allocator exactly as without the layer.
 *
 * Invariants the code relies on:
 *   - Start-up: dlsym's own calloc is served by ../bootstrap_pool.h; a call nested in the
 *     layer's start, or made by another thread meanwhile, passes through (no waiting).
 *   - Threads: no lock anywhere. The tables are lock-free (relaxed atomics, one compare-and-swap
 *     to claim or release a sample slot): a lost update only blurs a counter, never a block.
 *     The sampling countdown and the counter stripe are per thread (initial-exec TLS).
 *   - The short path (decide.c hp_short): malloc, calloc and each operator new test their call
 *     site's byte in the gate (hp_gate, keyed on the site's low 16 bits), take one off the
 *     thread's countdown and jump to the next function, asking the site table too where a site
 *     of those bits has been long; free and each delete jump through a pointer of their own:
 *     the next function itself until the counter learns (learn_mb resident), then a function
 *     that compares the block with its sample slot first. No frame, no call: anything else
 *     jumps to the hook's whole path, which decides as before.
 *   - Learning waits: in mode=predict the counter samples nothing and checks no free until the
 *     process has learn_mb resident (below min_mb's floor its verdicts could place nothing); the
 *     countdown then ticks the clock every HP_WAIT_TICK allocations (sample.c).
 *   - fork: no lock to hold across it; the child keeps its copy of the counters, and jemalloc
 *     handles its own locks.
 *   - Output (refusals, the stats line, the learn file): stack buffers and write(2), never
 *     malloc (../say.h).
 *
 * The parts (place/, one concern each) are compiled as this one translation unit, as the layer's
 * (layer.c) and mimalloc's src/static.c are, so that the hooks inline the decision as in one
 * file; they are never compiled alone. Each part may use what the parts before it define:
 *   place/options.c     HEAPCAST_PLACE parsed into hp_set (HP_OPTIONS, below); the one line hp_say
 *   place/site_here.c   the site of a call: its return address, or its calling context's key
 *   place/sites.c       the site table: one word per call site (site << 1 | long), its counts
 *   place/stats.c       the counters: a stripe per thread, and the process-wide ones
 *   place/sample.c      sampling: 1 in `sample` allocations watched until its free or the horizon
 *   place/life.c        the lifetime table (table=FILE, ../TABLE.md): loaded at start, asked first
 *   place/sites_file.c  the sites files: mode=sites reads one at start, learn= writes one at exit
 *   place/init.c        start (the options, the arenas API, the table), exit (the stats line)
 *   place/decide.c      the decision on the allocation path: the long arena, the floor, hp_long
 *   place/hooks.c       the exported entry points of the malloc family
 *   place/cxx.c         C++'s operator new and delete, every form
 *   place/watch.c       the counter begins to learn: free and every delete ask their sample slot
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../bootstrap_pool.h"
#include "../say.h"
#include "../options.h"
#include "../site_key.h"
/* the unwinder's rule cache at 2^16 words (512 KiB, the tracer's is 2 MiB): a layer stays in the
 * program for good, and its walks are shallow */
#define HC_UW_BITS 16u
#include "../context_key.h"
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
    X(learn_mb, "16", "the counter learns once this many MB are resident (0 or learn=: at once)") \
    X(depth, "1", "frames of the calling context a site is (1: the return address alone; 1..16)") \
    X(sites, "", "mode=sites: the file of long sites a run with learn=FILE wrote (its depth)")  \
    X(learn, "", "write the long sites at exit to FILE (native/TABLE.md, The sites file)")      \
    X(table, "", "predict: a lifetime table (TABLE.md); the counter where it has no key")         \
    X(model, "0", "table=: the model version the file must be written for (0: any)")             \
    X(stats, "0", "0 | 1 (one line on stderr at exit) | a file path (one line appended)")

/* The next allocator's functions (../real.h: hc_real, HC_REAL) */
#include "../real.h"

/* jemalloc 5's flags (include/jemalloc/jemalloc_macros.h.in; no -dev package is needed). */
#define HP_MALLOCX_LG_ALIGN(la) ((int)(la))
#define HP_MALLOCX_ZERO ((int)0x40)
#define HP_MALLOCX_TCACHE_NONE ((int)((-1 + 2) << 8))
#define HP_MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)

enum hp_mode { HP_OFF, HP_PREDICT, HP_SITES, HP_SIZE };
static const char *const hp_mode_names[] = {"off", "predict", "sites", "size"};
enum hp_state { HP_START, HP_STARTING, HP_ON, HP_ASIDE };

/* The settings (HP_OPTIONS, read by place/options.c) */
struct hp_settings {
    enum hp_mode mode;
    int sample, pct, falls;
    unsigned depth; /* the context's frames (context_key.h); 1: the return address alone */
    /* min_rss: min_mb in bytes; learn_rss: learn_mb in bytes, at most min_rss, 0 with learn= */
    uint64_t horizon, min_rss, learn_rss;
    size_t big;
    uint32_t model;
    char sites[512], learn[512], stats[512], table[512];
};
static struct hp_settings hp_set;

/* The tables' sizes (sites.c, sample.c) and the allocation clock's width. */
#define HP_NSITES 4096u
#define HP_NSAMPLES 4096u
#define HP_CLOCK_MASK ((UINT64_C(1) << 48) - 1)

/* jemalloc's own options, read by jemalloc at its start from this symbol (its weak malloc_conf,
 * which ours overrides; MALLOC_CONF in the environment overrides both). Why: a burst's short
 * blocks, placed apart from the long ones, empty whole slabs; their dirty extents coalesce into
 * one large extent, and jemalloc's default lg_extent_max_active_fit (6: a request never carves an
 * extent more than 64 times its size) makes the next burst map fresh memory beside it rather than
 * reuse it, until decay purges it (docs/layer.md, "jemalloc's options"). 10 lets slabs be cut
 * from it again. Harmless to allocators that are not jemalloc. */
HP_EXPORT const char *malloc_conf = "lg_extent_max_active_fit:10";

static int hp_state;    /* enum hp_state; HP_ON: the hot path routes */
static int hp_learning; /* HP_ON in mode=predict: the online counter answers */
/* 1 once the counter learns: samples taken, frees checked (sample.c hp_wait_tick: the process
 * reached learn_mb; at start where learn_mb is 0 or a learn file is asked). Set once, never
 * cleared (watch.c hp_watch_begin). */
static int hp_watching;
static int hp_watch_started; /* hp_watch_begin's once: set first, before the pointers change */
static int hp_by_size;  /* HP_ON in mode=size */
/* 1 once on (HP_ON) with neither mode=size nor a lifetime table: the hot path's first questions
 * answered at once (decide.c hp_long_plain). Set once, at the end of start, never cleared. */
static int hp_plain;
static int hp_off; /* the options read, mode=off: every call passes, the stats line says so */
static int hp_big; /* 1 once the counter's floor was reached, or there is none (decide.c) */
/* The depth of the context a site is (place/site_here.c): 0 or 1 the return address alone,
 * else the key of that many frames (../context_key.h). Set once the layer is on (start, or the
 * sites file's own depth at the constructor), read on every allocation. */
static unsigned hp_depth;
/* The hooks' short path's gate (decide.c hp_short): a byte per value of a call site's low 16
 * bits (the return address's low two bytes: one movzwl reads them off the stack); where the
 * caller's byte is 0 the short path answers without the site table. hp_gate points at
 * hp_gate_all (every byte 1) while the short path may not answer at all (hp_fast 0: the layer
 * not on, or a table, mode=size, or a context deeper than the call site), else at
 * hp_gate_long: 1 at the low 16 bits of every site ever marked long (sites.c hp_learn,
 * sites_file.c; never cleared). A 0 byte: no site with those low bits has been long, so the
 * table's answer would be "short". 65536 values rather than a 64-bit word's 64: a program's hot
 * sites rarely share a long site's value (cppcheck's 25 long sites set 17 of 64 bits, which 79%
 * of its `new`s shared; 25 of 65536 values, which 1.2% share, those of the long sites
 * themselves), for the same instruction count. hp_fast_update points it again whenever hp_plain
 * or hp_depth changes. */
#define HP_GATE_N 65536u
static const uint8_t hp_gate_all[HP_GATE_N] = {[0 ... HP_GATE_N - 1] = 1};
static uint8_t hp_gate_long[HP_GATE_N];
static const uint8_t *hp_gate = hp_gate_all;
static int hp_fast; /* hp_plain set and sites are call sites (hp_depth <= 1) */
static void hp_fast_update(void) {
    int fast = __atomic_load_n(&hp_plain, __ATOMIC_ACQUIRE) &&
               __atomic_load_n(&hp_depth, __ATOMIC_ACQUIRE) <= 1;
    __atomic_store_n(&hp_fast, fast, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hp_gate, fast ? hp_gate_long : hp_gate_all, __ATOMIC_SEQ_CST);
}
/* `site` is about to be marked long: its byte, before its word says so. */
static inline void hp_long_site(uintptr_t site) {
    uint8_t *g = &hp_gate_long[(uint16_t)site];
    if (!__atomic_load_n(g, __ATOMIC_SEQ_CST)) __atomic_store_n(g, 1, __ATOMIC_SEQ_CST);
}
/* What free jumps to (hooks.c), its whole body: hp_free_whole (the real free not yet known,
 * or the start-up pool's blocks to tell apart) until start finds the real free and the pool
 * unused (init.c hp_free_direct); then the real free itself while the counter waits to learn,
 * and hp_free_watch (the sample slot asked first) once it learns (watch.c). */
static void hp_free_whole(void *p);
static void hp_free_watch(void *p);
static void (*hp_free_now)(void *) = hp_free_whole;
static void hp_watch_begin(void);

/* The long arena (decide.c). hp_flags: the mallocx flags that reach it (MALLOCX_ARENA |
 * TCACHE_NONE); 0 until it exists. It is made at the first request predicted long, not at start,
 * and jemalloc's mallctl is first called then: its first call builds jemalloc's control and
 * statistics tables, and a created arena adds its metadata, which a program placing nothing long
 * would pay for nothing (docs/layer.md, "Placement"). */
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
 * and back again when the site's verdict turns (docs/layer.md, "Measured"). mode=size keeps its
 * own rule (`big`). */
static size_t hp_large_min = SIZE_MAX;
static void *(*hp_mallocx)(size_t, int);
static void *(*hp_rallocx)(void *, size_t, int);
static int (*hp_mallctl)(const char *, void *, size_t *, void *, size_t);

/* clang-format off */
#include "place/options.c"
#include "place/site_here.c"
#include "place/sites.c"
#include "place/stats.c"
#include "place/sample.c"
#include "place/life.c"
#include "place/sites_file.c"
#include "place/init.c"
#include "place/decide.c"
#include "place/hooks.c"
#include "place/cxx.c"
#include "place/watch.c"
/* clang-format on */
