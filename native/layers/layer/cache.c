/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The shared cache: the kept blocks outside the threads' fronts, under hl_lock, and the plain
 * bookkeeping on them (drop, release, unkeep, advise one block). Which block to keep, to serve
 * or to give back is decided in policy.c. */

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

/* The layer's clock: a kept block's `since` (decay, madv). The coarse clock (no syscall, a few
 * ms of resolution): the rules' thresholds are tens of ms and more. */
static inline uint64_t hl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Kept block i goes back (its pointer is the caller's to release); decayed: idle past `decay`. */
static void hl_drop(int i, int decayed) {
    hl_bytes_kept -= hl_kept[i].usable;
    hl_stats.given_back++;
    hl_stats.bytes_given_back += hl_kept[i].usable;
    hl_stats.decayed += (uint64_t)decayed;
    hl_kept[i] = hl_kept[--hl_nkept];
}

/* Blocks taken out of the cache under hl_lock, freed once the lock is given back
 * (hl_release): the real allocator is never called under a lock of the layer. */
#define HL_OUT_MAX 8
struct hl_out {
    int n;
    void *p[HL_OUT_MAX + 1]; /* loops stop at HL_OUT_MAX: the spare is for the block at hand */
};

static void hl_release(struct hl_out *out) {
    void (*f)(void *) = hc_real.free;
    for (int i = 0; i < out->n; i++) f(out->p[i]);
}

/* The stats' bytes_kept_peak (under hl_lock). */
static inline void hl_note_peak(void) {
    if (hl_bytes_kept + hl_front_bytes > hl_stats.bytes_kept_peak)
        hl_stats.bytes_kept_peak = hl_bytes_kept + hl_front_bytes;
}

/* A kept block's pages may go back to the kernel under memory pressure (MADV_FREE). */
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
