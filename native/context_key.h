/* The calling context's key inside a program, as the dataset computes it from a traced stack
 * (tasks/dataset/contexts.py stack_contexts): the first `depth` frames of an allocating call
 * (frame 0: the hook's caller, as the tracer records it, FORMAT.md "Stacks"), each frame's key
 * (site_key.h hc_frame_key: crc32(module path) << 32 xor offset, the raw address in no module)
 * folded innermost first:
 *     h = 0x9E3779B97F4A7C15; per frame h = (h ^ key) * 0xFF51AFD7ED558CCD; h ^= h >> 32;
 *     the key: h >> 1 (63 bits)
 * A stack shorter than `depth` (the walk ended: the outermost frame, a frame without CFI, a
 * frame the checks refuse) is its whole self, as in the dataset. Shared by the layers (the
 * placement layer's sites, layers/place.c); the walk is the tracer's own unwinder
 * (heapcast_unwind.c: a frame's rule from the module's .eh_frame, cached; hc_step), included
 * here, so a context the dataset names is the context the layer computes.
 *
 * Amortised per thread, as the tracer amortises its stacks: the thread's last walk (each frame's
 * ip, sp, rbp, how it was stepped to, and the hash of the frames up to it) is kept in
 * initial-exec TLS. The next call checks it innermost first: frame 0 the same (ip and sp; rbp
 * too where a step read it before reloading it), then for each next frame the words the last
 * step read (the return address at CFA - 8, the saved rbp) unchanged; from the first frame that
 * differs the walk steps afresh, from its unchanged callee, onto that callee's hash. A loop that
 * allocates from one place pays the checks alone (one load a frame); a wrapper called from two
 * places steps only the frames from where its callers part.
 *
 * Safety (an allocator's standard): threads: the TLS walk and the lock-free caches (the rules',
 * the frame keys') only; signals: a handler that interrupts a walk and allocates on the same
 * thread finds the TLS walk busy and walks on its own stack, reusing nothing; fork: no lock to
 * hold; start-up: hc_ctx_start (the rule cache's mmap, the program's name) runs from the layer's
 * start, and hc_ctx_ready stays 0 where it failed: the layer then keys on the return address.
 * A module unloaded: hc_ctx_forget (from the layer's dlclose hook) drops every cached rule and
 * frame key, and the TLS walks by their generation. No malloc anywhere; the stack is read only
 * where the unwinder's checks allow (heapcast_unwind.c, Safety).
 *
 * Use: hc_ctx_start() once; then, in a hook, hc_ctx_of(__builtin_frame_address(0), depth) with
 * 1 <= depth <= HC_CTX_MAX (the hook keeps its frame pointer: -fno-omit-frame-pointer), or
 * hc_ctx_at(ip0, sp0, bp0, depth) with frame 0 found otherwise (the cache layer, whose hooks
 * keep no frame on their pass-through path, steps up to it: layers/layer/predict.c).
 */
#ifndef HEAPCAST_CONTEXT_KEY_H
#define HEAPCAST_CONTEXT_KEY_H

#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "site_key.h"

#ifndef HC_LIKELY
#define HC_LIKELY(x) __builtin_expect(!!(x), 1)
#define HC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HC_NOINLINE __attribute__((noinline, cold))
#endif

#include "heapcast_unwind.c"

#define HC_CTX_MAX 16u       /* the deepest context a layer keys on */
#define HC_CTX_NONE 0xFFu    /* bp_step: no step read frame 0's rbp */
#define HC_CTX_SEED 0x9E3779B97F4A7C15ull

/* A thread's last walk, innermost first (frame p at index p). */
struct hc_ctx_walk {
    uint32_t n;       /* frames walked: depth, or fewer where the walk ended */
    uint32_t gen;     /* hc_uw_generation when walked */
    uint8_t depth;    /* the depth it was walked for */
    uint8_t norig;    /* frames 0..norig-1 hold frame 0's rbp (no step reloaded it) */
    uint8_t bp_step;  /* the first step (from frame k) that read frame 0's rbp; HC_CTX_NONE */
    uint8_t busy;     /* a walk of this thread is under way (a signal handler's sees it) */
    uint8_t how[HC_CTX_MAX]; /* how frame p was stepped to: 0, k (rbp at CFA - 8k), signal */
    uint64_t ip[HC_CTX_MAX], sp[HC_CTX_MAX], bp[HC_CTX_MAX];
    uint64_t h[HC_CTX_MAX]; /* the fold of frames 0..p */
};
static __thread struct hc_ctx_walk hc_ctx_tls __attribute__((tls_model("initial-exec")));
static int hc_ctx_ready; /* hc_ctx_start succeeded */

/* Once, from the layer's start: the program's name (frame keys) and the unwinder's rule cache. */
static int hc_ctx_start(void) {
    if (!__atomic_load_n(&hc_ctx_ready, __ATOMIC_ACQUIRE)) {
        hc_site_init();
        hc_uw_start();
        __atomic_store_n(&hc_ctx_ready, hc_uw_cache != NULL, __ATOMIC_RELEASE);
    }
    return hc_ctx_ready;
}

/* A module was unloaded (the layer's dlclose hook): its addresses may now hold other code. */
static void hc_ctx_forget(void) {
    hc_frame_forget();
    if (__atomic_load_n(&hc_ctx_ready, __ATOMIC_ACQUIRE)) hc_uw_forget();
}

static inline uint64_t hc_ctx_fold(uint64_t h, uint64_t key) {
    h = (h ^ key) * 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 32);
}

/* Frames p.. (p >= 1) of w stepped afresh from frame p - 1, hashed onto its prefix; w holds the
 * new walk after. Returns the key. */
static __attribute__((noinline)) uint64_t hc_ctx_extend(struct hc_ctx_walk *w, unsigned p,
                                                        unsigned depth) {
    int orig = p - 1 < w->norig;
    uint64_t ip = w->ip[p - 1], sp = w->sp[p - 1], bp = orig ? w->bp[0] : w->bp[p - 1];
    int exact = w->how[p - 1] == HC_STEP_SIGNAL; /* an interrupted instruction, not a return */
    unsigned norig = orig ? p : w->norig;
    if (w->bp_step != HC_CTX_NONE && w->bp_step >= p - 1) w->bp_step = HC_CTX_NONE;
    uint64_t h = w->h[p - 1];
    unsigned k = p;
    for (; k < depth; k++) {
        uint8_t how = 0, used_bp = 0;
        int stepped = hc_step(&ip, &sp, &bp, &exact, &how, &used_bp);
        if (used_bp && orig && w->bp_step == HC_CTX_NONE) w->bp_step = (uint8_t)(k - 1);
        if (!stepped || ip == 0) break; /* the walk ends: a context shorter than depth */
        if (how) orig = 0;
        else if (orig) norig = k + 1;
        w->ip[k] = ip, w->sp[k] = sp, w->bp[k] = bp, w->how[k] = how;
        h = hc_ctx_fold(h, hc_frame_key((uintptr_t)ip));
        w->h[k] = h;
    }
    w->n = k;
    w->norig = (uint8_t)norig;
    return h >> 1;
}

/* A walk from the hook's caller (ip0, sp0, bp0), nothing reused. */
static uint64_t hc_ctx_first(struct hc_ctx_walk *w, uint64_t ip0, uint64_t sp0, uint64_t bp0,
                             unsigned depth) {
    w->depth = (uint8_t)depth;
    w->gen = __atomic_load_n(&hc_uw_generation, __ATOMIC_RELAXED);
    w->ip[0] = ip0, w->sp[0] = sp0, w->bp[0] = bp0, w->how[0] = 0;
    w->norig = 1;
    w->bp_step = HC_CTX_NONE;
    w->h[0] = hc_ctx_fold(HC_CTX_SEED, hc_frame_key((uintptr_t)ip0));
    w->n = 1;
    return depth > 1 ? hc_ctx_extend(w, 1, depth) : w->h[0] >> 1;
}

/* A signal handler's call while its thread's walk is under way: a walk of its own. */
static __attribute__((noinline)) uint64_t hc_ctx_alone(uint64_t ip0, uint64_t sp0, uint64_t bp0,
                                                       unsigned depth) {
    struct hc_ctx_walk w;
    return hc_ctx_first(&w, ip0, sp0, bp0, depth);
}

#ifdef HC_CTX_CHECK
/* Tests (`make placecheck`): every key is computed again by a walk that reuses nothing, and a
 * difference counted; the counts are said on stderr at exit. */
static unsigned long hc_ctx_all, hc_ctx_differed;
int snprintf(char *, size_t, const char *, ...);
int atexit(void (*)(void));
static void hc_ctx_check_say(void) {
    char line[128];
    int n = snprintf(line, sizeof line, "heapcast context check: %lu keys, %lu differed\n",
                     hc_ctx_all, hc_ctx_differed);
    if (n > 0) (void)!write(2, line, (size_t)n);
}
static void hc_ctx_check(uint64_t ip0, uint64_t sp0, uint64_t bp0, unsigned depth,
                         uint64_t key) {
    static int registered;
    if (!__atomic_exchange_n(&registered, 1, __ATOMIC_RELAXED)) atexit(hc_ctx_check_say);
    struct hc_ctx_walk w;
    uint64_t fresh = hc_ctx_first(&w, ip0, sp0, bp0, depth);
    __atomic_fetch_add(&hc_ctx_all, 1, __ATOMIC_RELAXED);
    if (fresh != key) __atomic_fetch_add(&hc_ctx_differed, 1, __ATOMIC_RELAXED);
}
#endif

/* The context key of depth `depth` whose frame 0 is (ip0, sp0, bp0): the hook's caller's return
 * address, its stack pointer after the return, its rbp (hc_ctx_of: from the hook's frame; the
 * cache layer's hl_ctx_from: stepped up from its own frame to the hook's caller). */
static inline uint64_t hc_ctx_at(uint64_t ip0, uint64_t sp0, uint64_t bp0, unsigned depth) {
    struct hc_ctx_walk *w = &hc_ctx_tls;
    if (HC_UNLIKELY(w->busy)) return hc_ctx_alone(ip0, sp0, bp0, depth);
    w->busy = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    uint64_t key;
    if (HC_LIKELY(w->n && w->ip[0] == ip0 && w->sp[0] == sp0 && w->depth == depth &&
                  (w->bp[0] == bp0 || w->bp_step == HC_CTX_NONE) &&
                  w->gen == __atomic_load_n(&hc_uw_generation, __ATOMIC_RELAXED))) {
        w->bp[0] = bp0; /* where it differs, no step read it: the frames holding it take this one */
        unsigned p = 1;
        for (; p < w->n; p++) { /* the words the last walk's step to frame p read */
            uint8_t how = w->how[p];
            const uint64_t *cfa = (const uint64_t *)(uintptr_t)w->sp[p];
            if (how == HC_STEP_SIGNAL || cfa[-1] != w->ip[p] || (how && cfa[-(int)how] != w->bp[p]))
                break;
        }
        key = p == w->n ? w->h[p - 1] >> 1 : hc_ctx_extend(w, p, depth);
    } else {
        key = hc_ctx_first(w, ip0, sp0, bp0, depth);
    }
#ifdef HC_CTX_CHECK
    hc_ctx_check(ip0, sp0, bp0, depth, key);
#endif
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    w->busy = 0;
    return key;
}

/* The context key of depth `depth` of the call into the hook whose frame pointer is `fp`. */
static inline uint64_t hc_ctx_of(const void *fp, unsigned depth) {
    const uint64_t *f = fp;
    return hc_ctx_at(f[1], (uint64_t)(uintptr_t)(f + 2), f[0], depth);
}

#endif
