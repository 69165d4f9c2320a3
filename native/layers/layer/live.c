/* Part of layers/layer.c (one translation unit; never compiled alone).
 * The live set: which large blocks the layer handed out (only those are ever kept), and which
 * kept blocks wait in a thread's front.
 *
 * Live set: the large blocks handed out (key: address, value: requested size and, guided with a
 * table of contexts, the allocation's context key) and the blocks
 * kept in a thread's front (ticket != 0), in HL_SHARDS shards by address, each under its own
 * lock: threads freeing and taking different blocks rarely meet. Open addressing with linear
 * probing, load <= 1/2, backward-shift deletion; grown by mmap (never malloc). If a shard cannot
 * grow, the layer stops keeping blocks (hl_active_min = SIZE_MAX). */
struct hl_live_slot {
    uintptr_t p;
    size_t req, usable;
    uint64_t ticket; /* 0: the program's; else in the front of the thread that holds this ticket */
    uint64_t ctx;    /* its allocation's context (HL_CTX_HAS | key, predict.c); 0: none asked */
};

#define HL_SHARDS 16
#define HL_SHARD_START 128
struct hl_shard {
    struct hl_spin lock;
    struct hl_live_slot *t;
    size_t cap, n;
    uint64_t hits, kept; /* the fronts' (the shared cache's are in hl_stats) */
    uint64_t sited;      /* frees a table's call-site entry answered (counted under the lock) */
    uint64_t contexted;  /* frees a table's context entry answered (format 4; under the lock) */
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

/* Fronts on (pools, guided): each shard has its own lock, taken after hl_lock where both are
 * held. Off (largest, whose rule needs hl_lock at every free anyway): hl_lock covers the live
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

/* Add p as the program's (under s->lock), allocated in context ctx (0: none asked); 0 if the
 * shard cannot grow. */
static int hl_live_add(struct hl_shard *s, void *p, size_t req, size_t usable, uint64_t ctx) {
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
    s->t[i] = (struct hl_live_slot){(uintptr_t)p, req, usable, 0, ctx};
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
