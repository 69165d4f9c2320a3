/* Part of layers/layer.c (one translation unit; never compiled alone).
 * glibc's dynamic mmap threshold, followed by the layer (follow=1), and the mallopt hook.
 *
 * glibc serves blocks of M_MMAP_THRESHOLD bytes and more (128 KiB at start) with a fresh mmap, and
 * at the free of a larger mmapped block raises the threshold to that block's size (at most 32 MiB;
 * the trim threshold to twice that): a program that frees large blocks soon gets them from its
 * heap, pages already there. The cache keeps those frees from glibc, so its threshold stayed at 128
 * KiB and every block the cache could not serve was a fresh mmap, faulted in page by page, and a
 * program that reuses large blocks ran slower under the layer than under glibc alone
 * (../../README.md, History). So the layer applies glibc's rule itself at every free of a block
 * of 128 KiB or more it sees, kept or not: with mallopt from the first kept block that raises the
 * threshold on (once the layer has set it, glibc stops following on its own), recorded alone
 * before that, where glibc saw the free and raised it itself (hl_follow). A block larger than the threshold was mmapped when it was made, as
 * the threshold only grows. Not when the threshold is fixed: by the user (MALLOC_MMAP_THRESHOLD_,
 * MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or their GLIBC_TUNABLES, which turn
 * glibc's own following off), by the program (mallopt, interposed below) or by follow=0. Over
 * another allocator, mallopt is its (a no-op in tcmalloc) or glibc's unused one. */
#define HL_FOLLOW_MIN ((size_t)128 * 1024)                    /* DEFAULT_MMAP_THRESHOLD_MIN */
#define HL_FOLLOW_MAX ((size_t)4 * 1024 * 1024 * sizeof(long)) /* DEFAULT_MMAP_THRESHOLD_MAX */
static size_t hl_follow_at; /* glibc's threshold as the layer set it; 0: not followed */
/* 1 once the layer has called mallopt (glibc's own following then off for good) */
static int hl_follow_set;
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
 * (usable + the 16-byte header). kept: the layer keeps the block (glibc never saw its free).
 * Until the layer's first mallopt, glibc follows on its own, and its threshold is hl_follow_at:
 * every raise so far was its own, at a free it saw (a kept block no larger than the threshold
 * raises nothing; one larger calls mallopt). So a free glibc saw is only recorded: glibc applied
 * the same rule itself, and mallopt's cost is spared (glibc's mallopt consolidates its fastbins
 * first: 9.6 M instructions at hunspell's start-up, studies/layer_zero_hit). The first kept free
 * that raises the threshold calls mallopt, and from then on every raise does (glibc's own
 * following is off). */
static void hl_follow(size_t usable, int kept) {
    size_t chunk = usable + 2 * sizeof(size_t);
    size_t at = __atomic_load_n(&hl_follow_at, __ATOMIC_RELAXED);
    if (HL_LIKELY(at == 0 || chunk <= at || chunk > HL_FOLLOW_MAX)) return;
    pthread_mutex_lock(&hl_follow_lock);
    if (hl_follow_at != 0 && chunk > hl_follow_at && hc_real.mallopt) {
        __atomic_store_n(&hl_follow_at, chunk, __ATOMIC_RELAXED);
        if (kept || hl_follow_set) {
            hl_follow_set = 1;
            hc_real.mallopt(M_MMAP_THRESHOLD, (int)chunk);
            hc_real.mallopt(M_TRIM_THRESHOLD, (int)(2 * chunk));
        }
    }
    pthread_mutex_unlock(&hl_follow_lock);
}

/* the mmap threshold the program fixed itself (0: none), for the stats: TensorFlow's generator
 * dataset fixes it at 128 KiB, and every block glibc serves from there up is a fresh mapping */
static int hl_program_threshold;

/* The program sets a threshold of its own: glibc stops following, and so does the layer. */
HL_EXPORT int mallopt(int param, int value) {
    int (*f)(int, int) = HC_REAL(mallopt);
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
