/* Part of heapcast.c (one translation unit; never compiled alone): call stacks (HEAPCAST_FRAMES).
 *
 * hc_stack_of, called by the allocating hooks, unwinds (heapcast_unwind.c) and returns the
 * stack's id: a node of the process's stack trie (FORMAT.md, Stacks). Two levels:
 *   - per thread, a direct-mapped cache of 64-bit stack hashes -> id (HC_STACK_CACHE entries in
 *     the thread's buffer mapping): the data path, no lock. Two different stacks with the same
 *     64-bit hash would share an id: about n^2 / 2^65 for n distinct stacks (1e-8 at a million);
 *   - per process, the trie itself: (parent, address) -> node in an open-addressing table,
 *     under hc_trie_lock, taken only on a thread's cache miss. Each node made is written as a
 *     STACK_NODE record into the making thread's own buffer, before the record that uses it.
 * A fork child writes every node after its header (hc_stacks_replay), so its file is whole.
 * Memory: mmap only (never the allocator being traced); the node array grows with mremap, the
 * table doubles at half full. A failed mmap gives stack 0 (no stack), never a crash. */


static inline uint64_t hc_trie_slot(uint64_t parent, uint64_t addr, uint64_t cap) {
    uint64_t h = (parent * 0x9E3779B97F4A7C15ull) ^ (addr * 0xC2B2AE3D27D4EB4Full);
    return (h ^ (h >> 29)) & (cap - 1);
}

static int hc_trie_grow(void) {
    if (hc_node_count + 1 >= hc_node_cap) {
        uint64_t cap = hc_node_cap ? hc_node_cap * 2 : 16384;
        size_t old = hc_node_cap * sizeof(struct hc_node), now = cap * sizeof(struct hc_node);
        void *m = hc_nodes ? mremap(hc_nodes, old, now, MREMAP_MAYMOVE)
                           : mmap(NULL, now, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return -1;
        hc_nodes = m;
        hc_node_cap = cap;
    }
    if ((hc_node_count + 1) * 2 >= hc_trie_cap) {
        uint64_t cap = hc_trie_cap ? hc_trie_cap * 2 : 32768;
        uint32_t *t = mmap(NULL, cap * sizeof(uint32_t), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (t == MAP_FAILED) return -1;
        for (uint64_t id = 1; id <= hc_node_count; id++) {
            uint64_t s = hc_trie_slot(hc_nodes[id].parent, hc_nodes[id].addr, cap);
            while (t[s]) s = (s + 1) & (cap - 1);
            t[s] = (uint32_t)id;
        }
        if (hc_trie_index) munmap(hc_trie_index, hc_trie_cap * sizeof(uint32_t));
        hc_trie_index = t;
        hc_trie_cap = cap;
    }
    return 0;
}

/* The id of the stack outer[0..n) (outermost first), making the nodes it lacks. Guard set. */
static HC_NOINLINE uint64_t hc_trie_insert(struct hc_tls *t, const uint64_t *outer, unsigned n) {
    pthread_mutex_lock(&hc_trie_lock);
    uint64_t parent = 0;
    for (unsigned k = 0; k < n; k++) {
        uint64_t addr = outer[k], d = n - 1 - k;
        uint64_t id = 0;
        if (hc_trie_cap) {
            for (uint64_t s = hc_trie_slot(parent, addr, hc_trie_cap);; s = (s + 1) & (hc_trie_cap - 1)) {
                uint32_t k = hc_trie_index[s];
                if (!k) break;
                if (hc_nodes[k].parent == parent && hc_nodes[k].addr == addr) {
                    id = k;
                    break;
                }
            }
        }
        if (!id) {
            if (hc_node_count >= UINT32_MAX - 1 || hc_trie_grow() != 0) {
                parent = 0; /* out of memory: no stack for this call */
                break;
            }
            id = ++hc_node_count;
            hc_nodes[id] = (struct hc_node){parent, addr, n - d};
            uint64_t s = hc_trie_slot(parent, addr, hc_trie_cap);
            while (hc_trie_index[s]) s = (s + 1) & (hc_trie_cap - 1);
            hc_trie_index[s] = (uint32_t)id;
            hc_emit(t, HC_OP_STACK_NODE, id, parent, n - d, addr, 0);
        }
        parent = id;
    }
    pthread_mutex_unlock(&hc_trie_lock);
    return parent;
}

/* A thread's last walk, outermost frame first (index 0), kept in its buffer's mapping. The
 * next walk of the thread stops as soon as it reaches a frame whose state (ip, sp, rbp) equals
 * one of these, if every stack word the last walk read above that frame still holds what it
 * read (the return addresses, the saved rbp values): then the frames above are the same, as
 * are their hashes, and only the new inner frames are stepped. The reads being independent,
 * that check costs a fraction of stepping (a serial chain of loads). In a loop that allocates
 * from one place the walk is then the check alone. */
struct hc_walk {
    uint32_t n, gen;     /* frames; hc_uw_generation when walked */
    uint32_t truncated;  /* it ended because hc_frames were taken */
    uint64_t id;         /* its stack id */
    uint64_t ip[HC_FRAMES_MAX], sp[HC_FRAMES_MAX], bp[HC_FRAMES_MAX];
    uint64_t hash[HC_FRAMES_MAX]; /* hash of frames 0..p, folded from the outermost */
    uint8_t how[HC_FRAMES_MAX];   /* how frame p's caller (p - 1) was stepped to: 0 rbp kept,
                                   * k rbp read at CFA - 8k, HC_STEP_SIGNAL */
    uint8_t used_bp[HC_FRAMES_MAX]; /* the step from frame p read rbp (a CFA from rbp) */
    /* the walk in progress, innermost first */
    uint64_t new_ip[HC_FRAMES_MAX], new_sp[HC_FRAMES_MAX], new_bp[HC_FRAMES_MAX];
    uint8_t new_how[HC_FRAMES_MAX], new_used_bp[HC_FRAMES_MAX];
};

static size_t hc_walk_bytes(void) { return sizeof(struct hc_walk); }

static inline uint64_t hc_stack_mix(uint64_t h, uint64_t ip) {
    h = (h ^ ip) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

/* Whether the walk from frame q of the last walk outwards read q's rbp before replacing it
 * (code that keeps no frame pointer uses rbp for anything: its value then says nothing). */
static inline int hc_walk_needs_bp(const struct hc_walk *w, unsigned q) {
    for (unsigned p = q + 1; p-- > 0;) {
        if (w->used_bp[p]) return 1;
        if (w->how[p]) return 0; /* read from the stack (or a signal frame's registers) */
    }
    return 0;
}

/* The deepest frame v <= q of the last walk such that the stack above it is unchanged (see
 * struct hc_walk): every word the walk read from frame v outwards still holds what it read;
 * -1 when even the outermost step's words changed. Read outermost first, so that one scan a
 * walk serves every later candidate frame too. */
static inline int hc_walk_holds(const struct hc_walk *w, unsigned q) {
    for (unsigned p = 1; p <= q; p++) {
        uint8_t how = w->how[p];
        uint64_t csp = w->sp[p - 1];
        if (how == HC_STEP_SIGNAL) return (int)p - 1;
        if (*(const uint64_t *)(uintptr_t)(csp - 8) != w->ip[p - 1]) return (int)p - 1;
        if (how && *(const uint64_t *)(uintptr_t)(csp - 8 * (uint64_t)how) != w->bp[p - 1])
            return (int)p - 1;
    }
    return (int)q;
}

#ifdef HC_WALK_CHECK
/* Tests (tests/native): every walk that reused the last one is stepped again in full and
 * compared; a difference is counted and said at exit. */
static unsigned long hc_walk_all, hc_walk_checked, hc_walk_differed;
int snprintf(char *, size_t, const char *, ...);
static void hc_walk_check_say(void) {
    char line[160];
    int n = snprintf(line, sizeof line, "heapcast walk check: %lu walks, %lu reused, %lu differed; %lu rules computed "
                     "in %lu ticks\n",
                     hc_walk_all, hc_walk_checked, hc_walk_differed,
                     (unsigned long)hc_uw_misses, (unsigned long)hc_uw_miss_ticks);
    if (n > 0) (void)!write(2, line, (size_t)n);
}
static void hc_walk_check(const void *fp, const struct hc_walk *w, int q, unsigned j) {
    static int registered;
    if (!registered) registered = 1, atexit(hc_walk_check_say);
    __atomic_fetch_add(&hc_walk_all, 1, __ATOMIC_RELAXED);
    if (q < 0) return;
    uint64_t full[HC_FRAMES_MAX];
    const uint64_t *f = fp;
    uint64_t ip = f[1], sp = (uint64_t)(uintptr_t)(f + 2), bp = f[0];
    unsigned n = 0;
    int exact = 0;
    uint8_t how, used_bp;
    while (ip && n < hc_frames) {
        full[n++] = ip;
        if (n == hc_frames || !hc_step(&ip, &sp, &bp, &exact, &how, &used_bp)) break;
    }
    /* the reused walk: new frames innermost first, then the last walk's from q outwards */
    unsigned m = j + (unsigned)q + 1, bad = m != n;
    for (unsigned k = 0; !bad && k < n; k++)
        bad = full[k] != (k < j ? w->new_ip[k] : w->ip[q - (int)(k - j)]);
    __atomic_fetch_add(&hc_walk_checked, 1, __ATOMIC_RELAXED);
    if (bad) __atomic_fetch_add(&hc_walk_differed, 1, __ATOMIC_RELAXED);
}
#endif

/* The stack of the hook whose frame pointer is `fp` (frames as in FORMAT.md, Stacks). Guard set. */
static __attribute__((noinline)) uint64_t hc_stack_walk(struct hc_tls *t, const void *fp) {
    if (HC_UNLIKELY(t->buf == &hc_unregistered) && !hc_register_thread(t)) return 0;
    struct hc_walk *w = t->buf->walk;
    if (HC_UNLIKELY(!w)) return 0; /* a thread past its exit (its TLS destructors): no stack */
    const uint64_t *f = fp;
    uint64_t ip = f[1], sp = (uint64_t)(uintptr_t)(f + 2), bp = f[0];
    unsigned max = hc_frames, j = 0, p = 0, truncated = 0;
    int q = -1, exact = 0, trying = 0, held = -2; /* held: hc_walk_holds' answer, -2 not asked */
    if (w->n && w->gen == __atomic_load_n(&hc_uw_generation, __ATOMIC_RELAXED)) p = w->n, trying = 1;
    while (ip) {
        if (j == max) {
            truncated = 1;
            break;
        }
        if (trying) { /* the last walk's frame at this stack pointer, if any */
            while (p && w->sp[p - 1] < sp) p--;
            if (!p) trying = 0;
            else if (w->sp[p - 1] == sp && w->ip[p - 1] == ip && !exact &&
                     (w->bp[p - 1] == bp || !hc_walk_needs_bp(w, p - 1))) {
                unsigned at = p - 1;
                if (held == -2) held = hc_walk_holds(w, at); /* one scan a walk */
                if ((int)at <= held && (w->truncated ? j + at + 1 == max : j + at + 1 <= max)) {
                    q = (int)at;
                    break;
                }
                if (held < 0) trying = 0;
            }
        }
        w->new_ip[j] = ip;
        w->new_sp[j] = sp;
        w->new_bp[j] = bp;
        w->new_how[j] = 0;
        w->new_used_bp[j] = 0;
        j++;
        if (j == max) continue; /* the loop's head ends it (truncated only if there was more) */
        if (!hc_step(&ip, &sp, &bp, &exact, &w->new_how[j - 1], &w->new_used_bp[j - 1])) break;
    }
#ifdef HC_WALK_CHECK
    hc_walk_check(fp, w, q, j);
#endif
    if (q >= 0 && j == 0 && (unsigned)q + 1 == w->n) return w->id; /* the last walk's stack */
    unsigned base = q >= 0 ? (unsigned)q + 1 : 0, n = base + j;
    if (!n) return 0;
    uint64_t h = base ? w->hash[base - 1] : 0x9E3779B97F4A7C15ull;
    for (unsigned k = 0; k < j; k++) { /* the new frames, outermost first, after the kept ones */
        unsigned at = base + k, from = j - 1 - k;
        w->ip[at] = w->new_ip[from];
        w->sp[at] = w->new_sp[from];
        w->bp[at] = w->new_bp[from];
        w->how[at] = w->new_how[from];
        w->used_bp[at] = w->new_used_bp[from];
        h = hc_stack_mix(h, w->ip[at]);
        w->hash[at] = h;
    }
    if (q < 0) w->truncated = truncated;
    w->n = n;
    w->gen = __atomic_load_n(&hc_uw_generation, __ATOMIC_RELAXED);
    h ^= n;
    struct hc_stack_slot *e = &t->buf->stack_cache[(h ^ (h >> 29)) & (HC_STACK_CACHE - 1)];
    if (HC_LIKELY(e->hash == h && e->id)) return w->id = e->id;
    uint64_t id = hc_trie_insert(t, w->ip, n);
    e->hash = h;
    e->id = id;
    return w->id = id;
}

/* What the hooks call: 0 without stacks (one predictable branch). */
static inline __attribute__((always_inline)) uint64_t hc_stack_of(struct hc_tls *t, const void *fp) {
    return HC_UNLIKELY(hc_frames) ? hc_stack_walk(t, fp) : 0;
}

/* A fork child: every node its parent made, right after the header (and the module records).
 * Single-threaded here; the locks were taken across fork by the parent's prepare handler. */
static void hc_stacks_replay(void) {
    enum { CHUNK = 128 };
    uint64_t r[CHUNK * 6];
    unsigned k = 0;
    uint64_t now = hc_now();
    for (uint64_t id = 1; id <= hc_node_count; id++) {
        uint64_t *w = r + 6 * k;
        w[0] = now;
        w[1] = id;
        w[2] = hc_nodes[id].parent;
        w[3] = (uint64_t)hc_nodes[id].depth | ((uint64_t)HC_OP_STACK_NODE << HC_OP_SHIFT);
        w[4] = hc_nodes[id].addr;
        w[5] = 0;
        if (++k == CHUNK) {
            hc_write((const unsigned char *)r, sizeof r);
            k = 0;
        }
    }
    if (k) hc_write((const unsigned char *)r, k * 6 * sizeof(uint64_t));
}
