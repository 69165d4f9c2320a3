/*
 * heapcast's allocator layer: LD_PRELOAD over the system allocator (or whatever allocator comes
 * next), keeping freed large blocks and handing them out again, with the decision what to keep
 * and what to give back taken by a policy, optionally guided by a predictor computed in the
 * process as it runs. Build: `make -C native layer` -> native/build/libheapcast_layer.so.
 * Run: `HEAPCAST_LAYER=policy=guided,stats=1 LD_PRELOAD=.../libheapcast_layer.so prog args`.
 *
 * Why: glibc serves blocks >= its mmap threshold (128 KiB) with a fresh mmap and unmaps them on
 * free, so each large temporary is faulted in (and zeroed by the kernel) again. A kept block is
 * reused with its pages resident.
 *
 * Policies (one layer, configurations of it; `min`, `cap`, `madv` apply to all; `madv`: the
 * pages of a block kept idle for 100 ms are madvise(MADV_FREE)d, so the kernel may take them
 * back under memory pressure; not at once: in a tight loop the syscall and its TLB flush would
 * cost far more than glibc's own reuse of the block):
 *  - largest (default): the n (4) largest recently freed blocks: a freed block is kept if fewer
 *    than n are, or if it is at least as large as the smallest kept one, which is given back.
 *  - pools: size-class pools with timed decay: every freed block is kept; a block
 *    idle for more than `decay` ms is given back (checked at each of the layer's large-block
 *    calls: no timer thread, so a process that stops allocating keeps at most `cap` bytes).
 *  - guided: as pools, but a freed block of class c is kept only when the thread's
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
 * got: grown by malloc, copy and free; `outgrown`). Both keep the cache from holding memory the
 * program would not have held under glibc (hl_in_scope, hpc_outgrown).
 * And a bound (`peak`, default 4%): at a miss that maps new memory, kept blocks go back until
 * the large blocks live plus those kept (fronts included) are within the program's own peak of
 * live large blocks plus 4%, which is what glibc, unmapping each at its free, holds at most
 * (hl_bound). `bounded` in the stats counts those given back.
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
 *  - largest: one lock over the kept blocks and the live set, as its rule (the n largest in the
 *    process) needs the whole cache at every free; with many threads on few cores that lock is
 *    its cost (native/README.md, Measured).
 *  - pools, guided: the block a thread kept last waits in the thread's own front (TLS), and
 *    the thread's next request that it fits takes it back under one of 16 live-set shards'
 *    locks (by address), never the shared cache's. Its live-set slot carries the front's
 *    ticket: a second free by any thread finds it there (double free, as above), and the
 *    front, finding its ticket gone, forgets the block without touching it. An older front
 *    block moves to the shared cache (hl_lock, then a shard's: the one order), under the same
 *    rules as any kept block. A front counts against the cap through the thread's reservation
 *    (the largest block its front held); its block is not advised, and decays at the thread's
 *    next large call; at the thread's exit (pthread key destructor) it joins the shared cache.
 *    A thread that finds nothing in the shared cache takes a fitting block from another
 *    thread's front (hl_steal: the fronts' hints, then the shard and the ticket decide), so an
 *    idle thread holds nothing the others need. The order of reuse across threads differs from
 *    one shared cache's (the simulator's one cache is exact for one thread).
 * The predictor is per thread (initial-exec TLS pointer to an mmapped counter, unmapped by the
 * same destructor). fork: pthread_atfork holds every lock across fork; the child keeps its copy
 * of the shared cache and of the forking thread's front (the other threads' fronts stay out of
 * reach there: at most one block each, never handed out).
 * Start-up: while dlsym looks up the next allocator, ../bootstrap_pool.h serves allocations;
 * every entry point checks for a function not yet looked up (pool, or ENOMEM for a realloc of a
 * block the pool did not make: ../real.h). Calls before the constructor pass through.
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
 * file without entries, or format 2: the class's score). Format 4 adds (allocation context,
 * class) entries, asked first: the block's allocation's context (../context_key.h), computed
 * where a block the policy may keep is handed out and kept in its live-set slot (predict.c). A file it cannot trust is refused with
 * one line on stderr, and the online counter is used.
 *
 * Not async-signal-safe (neither is glibc's malloc).
 *
 * The parts (layer/, one concern each) are compiled as this one translation unit, as mimalloc's
 * src/static.c does, so that the compiler sees every call on the malloc/free paths and inlines
 * as it would in one file; they are never compiled alone. Each part may use what the parts
 * before it define (the order below); the few calls to later parts are declared where made.
 *   layer/options.c   HEAPCAST_LAYER parsed (HL_OPTIONS, below), the settings, the one output path
 *   layer/locks.c     the spin locks (a shard's, and hl_lock over the shared cache), slot claims
 *   layer/stats.c     the counters: under hl_lock, and per-thread stripes for the hot ones
 *   layer/live.c      the live set: the large blocks handed out, in shards by address
 *   layer/cache.c     the shared cache (the policy core's struct hpc_cache under hl_lock), the
 *                     clock, the real free of the blocks given back
 *   layer/predict.c   guided's predictor in the process: the thread's counter, call sites,
 *                     allocation contexts, the table's scores
 *   layer/policy.c    where the layer asks the policy core (../policy/core.c, the decisions
 *                     the what-if replay runs too), and what it decides from what only a process
 *                     sees: scope (glibc's chunk word, its trimmed heap), the pages' advice
 *   layer/fronts.c    per thread: registration, the front, its hint, stealing from others
 *   layer/alloc.c     the request path: a kept block taken (hl_take), a new one tracked
 *   layer/follow.c    glibc's dynamic mmap threshold, followed; the mallopt hook
 *   layer/free.c      the free path (hl_free_large in named steps, hl_free_from)
 *   layer/hooks.c     the exported entry points (malloc, free, calloc, realloc, aligned forms)
 *   layer/table.c     the table file loader (../TABLE.md)
 *   layer/init.c      start (the constructor), fork, exit (the stats line)
 * Measured costs and the history behind the rules: ../README.md (Measured, History).
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
#include "../say.h"
#include "../options.h"
#include "../site_key.h"
#include "../context_key.h"
#include "../table_head.h"
#include "predictor.h"

#define HL_EXPORT __attribute__((visibility("default")))
#define HL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HL_LIKELY(x) __builtin_expect(!!(x), 1)
#define HL_MAX_N 64     /* largest's n at most */

/* The options, listed once (HEAPCAST_LAYER=name=value,...; parsed by layer/options.c, and
 * tasks/allocators/config.py's LAYER_OPTIONS is checked against this table). X(name, default,
 * doc) */
#define HL_OPTIONS(X)                                                                             \
    X(policy, "largest", "largest | pools | guided | off")                                        \
    X(min, "128K", "blocks of at least this many usable bytes are considered (K, M, G suffixes)") \
    X(cap, "1G", "at most this many bytes kept; beyond, the oldest (largest: smallest) go back")  \
    X(scope, "mapped", "mapped: keep only blocks glibc would give back to the kernel | all")       \
    X(n, "4", "largest: blocks kept at most (0..64)")                                             \
    X(madv, "100", "MADV_FREE a kept block's pages once idle this many ms (0: at once; off)")     \
    X(decay, "1000", "pools, guided: a block idle this many ms is given back")                    \
    X(topk, "2", "guided: keep class c when it is among the k most likely calls ...")             \
    X(horizon, "4", "guided: ... at one of the next h calls (the counter rolled forward)")        \
    X(predictor, "online", "guided: online (the thread's counter) | table:FILE (TABLE.md)")       \
    X(model, "0", "table: the model version the file must come from (0: any)")                    \
    X(follow, "1", "1: raise glibc's mmap threshold as glibc would on the frees it keeps; 0: no") \
    X(peak, "4", "kept blocks never lift live + kept above the live blocks' peak + this % (off)") \
    X(proof, "2", "keep nothing until N requests could have reused a block passed on (0: at once)") \
    X(regret, "0", "guided: 1: keep a class the process asked again for soon after passing one on") \
    X(stats, "0", "0 | 1 (one line on stderr at exit) | a file path (one line appended)")

enum hl_policy { HL_OFF, HL_LARGEST, HL_POOLS, HL_GUIDED };
static const char *const hl_policy_names[] = {"off", "largest", "pools", "guided"};
/* The policies' former names, still accepted (policy=seed002 is policy=largest): the one
 * table of them in C (docs/layer.md). */
static const struct {
    const char *old;
    enum hl_policy policy;
} hl_renamed_policies[] = {{"seed002", HL_LARGEST}, {"seed001", HL_POOLS}};

/* The next allocator's functions (../real.h: hc_real, HC_REAL) */
#include "../real.h"

/* The policies' decisions: the policy core, shared with the what-if replay */
#include "../policy/core.c"

/* clang-format off */
#include "layer/options.c"
#include "layer/locks.c"
#include "layer/stats.c"
#include "layer/live.c"
#include "layer/cache.c"
#include "layer/predict.c"
#include "layer/policy.c"
#include "layer/fronts.c"
#include "layer/alloc.c"
#include "layer/follow.c"
#include "layer/free.c"
#include "layer/hooks.c"
#include "layer/table.c"
#include "layer/init.c"
/* clang-format on */
