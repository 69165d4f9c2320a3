/* Part of layers/place.c (one translation unit; never compiled alone).
 * The site table: the online counter's memory. The site is the hook's return address, hashed into
 * a direct-mapped table of HP_NSITES entries: one word (site << 1 | long), the one field read on
 * the allocation path (decide.c), and the counts of its sampled blocks (sample.c) that died young
 * or outlived the horizon. A site is long once >= 2 of its samples and >= `pct`% of them outlived
 * the horizon (counts halved past 256, so that a site can change its mind); a site whose verdict
 * has fallen from long back to short `falls` times stays short (aside); a site never seen is
 * short. */

/* hp_site_word[e]: site << 1 | long; 0: empty. The one word the hot path reads, in an array of
 * its own so that the hooks index it by a scaled load (decide.c, hooks.c); hp_sites[e], its
 * counts. */
struct hp_site {
    uint16_t nshort, nlong;  /* sampled blocks that died young, that outlived the horizon */
    uint16_t falls;          /* times its verdict fell from long back to short (hp_learn) */
};
static uintptr_t hp_site_word[HP_NSITES] __attribute__((aligned(64)));
static struct hp_site hp_sites[HP_NSITES] __attribute__((aligned(64)));

static inline unsigned hp_site_index(uintptr_t site) {
    return (unsigned)((site * UINT64_C(0x9E3779B97F4A7C15)) >> 52) & (HP_NSITES - 1);
}

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
    uintptr_t w = __atomic_load_n(&hp_site_word[e], __ATOMIC_RELAXED);
    if (w == 0) return;
    uintptr_t lng = nl >= 2 && (uint64_t)nl * 100 >= (uint64_t)hp_set.pct * (ns + nl);
    uint16_t falls = __atomic_load_n(&t->falls, __ATOMIC_RELAXED);
    if ((w & 1) && !lng && falls < UINT16_MAX)
        __atomic_store_n(&t->falls, ++falls, __ATOMIC_RELAXED);
    if (hp_aside(falls)) lng = 0; /* its verdict proved unstable */
    if (lng) hp_long_site(w >> 1);
    __atomic_store_n(&hp_site_word[e], (w & ~(uintptr_t)1) | lng, __ATOMIC_RELAXED);
}
