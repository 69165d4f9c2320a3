/*
 * heapcast's policy core: the allocator layer's decisions as a plain state machine, for one
 * process's cache and the view of one thread at a time. No hooks, no locks, no clock, no
 * allocation of its own: the caller owns every struct, passes the time, and gives back to the
 * next allocator the blocks a call lists in its `struct hpc_out` (outside its own locks).
 *
 * Two callers run these same functions:
 *  - the layer (native/layers/layer.c), inside programs: it holds one struct hpc_cache (under
 *    its hl_lock) and a struct hpc_history per thread, and calls the decisions below from its
 *    request and free paths with its locks held as each says; the threads' fronts, the live set
 *    and the counters taken outside the lock are its own machinery (tickets, shards, stripes);
 *  - the what-if replay (native/policy/replay.c, built as native/build/libheapcast_policy.so,
 *    tasks/whatif/policy_core.py), over a traced run's events, one call per batch.
 * Both include core.c into their own translation unit (as layer.c includes its parts, layer/),
 * so the compiler inlines the decisions where they are called.
 *
 * The state:
 *  - struct hpc_settings: the layer's options that decide (HL_OPTIONS in layers/layer.c);
 *  - struct hpc_cache: one process's shared cache (kept blocks), the live large blocks' bytes
 *    and their peak (the bound), the remembered blocks passed on (the proof and the regret), and
 *    the counters of the layer's stats line;
 *  - struct hpc_thread: one thread's front (the block it kept last), its reservation under the
 *    cap, the outgrown rule's history, and its predictor (guided: predictor.h's counter, memory
 *    the caller gives).
 * Two levels of functions:
 *  - the decisions, on the shared cache or one thread's history, each to be called with the
 *    layer's hl_lock held where it touches struct hpc_cache (hpc_take_shared, hpc_keep_shared,
 *    hpc_enter_shared, hpc_reserve, hpc_bound_shared, hpc_decay, hpc_ghost_add, hpc_ghost_hit),
 *    or lock-free (hpc_fits, hpc_serves, hpc_expired, hpc_outgrown, hpc_wanted,
 *    hpc_keep_at_free, hpc_predict_reuse, hpc_hist_alloc);
 *  - the whole calls, composed of them as the layer's paths compose them (alloc.c, free.c,
 *    fronts.c), for the replay, where one thread runs at a time: on request (n >= min)
 *    hpc_learn_alloc, then hpc_take (the front, then the shared cache), another thread's front
 *    (hpc_front_take), then hpc_hit or hpc_miss, and after a miss hpc_track (the bound runs
 *    there); on free of a tracked block hpc_free (kept in the front or the shared cache, or
 *    passed on, and why), of an untracked one hpc_free_untracked; a realloc the cache does not
 *    serve: hpc_untrack; a thread's exit: hpc_thread_exit.
 * Fields read by the layer without its lock (nkept, nghost, proven, regret[]) are written with
 * relaxed atomic stores (plain stores on x86; the replay pays nothing).
 * Blocks are named by `p`: an address in the layer; any number in a replay whose low bits are
 * the traced address's (the alignment test reads `p & mask`).
 */
#ifndef HEAPCAST_POLICY_CORE_H
#define HEAPCAST_POLICY_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "../layers/predictor.h"

#define HPC_MAX_KEPT 512 /* kept blocks at most (layer.c HL_MAX_KEPT) */
#define HPC_OUT_MAX 8    /* blocks given back by one call at most (cache.c HL_OUT_MAX) */
#define HPC_GHOSTS 8     /* blocks passed on, remembered (policy.c HL_GHOSTS) */
#define HPC_REGRET 4     /* frees kept on one regret (policy.c HL_REGRET) */
#define HPC_CLASSES 32

enum hpc_policy { HPC_OFF, HPC_LARGEST, HPC_POOLS, HPC_GUIDED };

struct hpc_settings {
    int32_t policy;   /* enum hpc_policy */
    int32_t n;        /* largest: blocks kept at most */
    uint64_t min;     /* blocks of at least this many usable bytes are considered */
    uint64_t cap;     /* bytes kept at most (fronts' reservations included) */
    uint64_t decay_ns; /* pools, guided: a block idle longer goes back */
    int32_t topk, horizon; /* guided: hcp_soon's question */
    int32_t peak;     /* the bound's headroom in %; -1: no bound */
    int32_t proof;    /* reuses of blocks passed on seen before anything is kept */
    int32_t regret;   /* guided: the process's regrets overrule the thread's counter */
    int32_t fronts;   /* pools, guided with madv != 0: a thread keeps its last block apart */
    const uint8_t *class_table; /* guided: a table's class scores [64][64] (format 2), or NULL */
};

struct hpc_block {
    uintptr_t p;
    uint64_t usable;
    uint64_t stamp; /* larger = kept more recently */
    uint64_t since; /* ns when kept (decay) */
    int32_t advised; /* the layer's: its pages are madvise(MADV_FREE)d (no decision reads it) */
};

struct hpc_ghost {
    uintptr_t p;
    uint64_t usable;
    uint32_t cls; /* the freed block's request's size class */
};

/* The layer's stats line (init.c hl_fini), the same names. */
struct hpc_stats {
    uint64_t hits, misses, kept, bytes_kept_peak, given_back, bytes_given_back, decayed;
    uint64_t outgrown, heap, declined, unproven, untracked, bounded, live_peak;
    uint64_t proof_hits, regret_hits, regret_keeps;
};

struct hpc_cache {
    struct hpc_block kept[HPC_MAX_KEPT];
    int32_t nkept;
    int32_t nghost;
    uint64_t stamp, bytes_kept;
    uint64_t front_bytes; /* the threads' reservations, counted against the cap */
    uint64_t live, fronted; /* usable bytes of tracked blocks: the program's, in fronts */
    struct hpc_ghost ghost[HPC_GHOSTS]; /* oldest first */
    int32_t proven;
    int32_t regret[HPC_CLASSES];
    struct hpc_stats stats;
};

/* A thread's history for the outgrown rule: its last request >= min, and the blocks its last
 * two such requests got (0: none). */
struct hpc_history {
    uint64_t last_req;
    uintptr_t last_p, prev_p;
};

struct hpc_thread {
    struct hpc_block front; /* p == 0: empty */
    uint64_t reserved;      /* the largest block its front held: its share of front_bytes */
    struct hpc_history hist;
    struct hcp_counter *counter; /* guided: the thread's counter (zeroed memory), or NULL */
};

/* Blocks that go back to the next allocator, listed by the call that decided so. */
struct hpc_out {
    int n;
    uintptr_t p[HPC_OUT_MAX + 1];
};

/* What became of a free (hpc_free's answer). */
enum hpc_fate {
    HPC_FREE_KEPT = 1,     /* in the thread's front or the shared cache */
    HPC_FREE_UNPROVEN = 2, /* passed on before the proof (remembered) */
    HPC_FREE_OUTGROWN = 3, /* passed on: the thread has just outgrown it */
    HPC_FREE_DECLINED = 4, /* passed on: the policy, largest's rule or the cap */
    HPC_FREE_UNTRACKED = 5, /* not a block the layer handed out */
    HPC_FREE_HEAP = 6      /* out of scope (glibc's heap) */
};

#endif
