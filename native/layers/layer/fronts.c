/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Per thread: its registration (the guided counter, the key whose destructor runs at its exit,
 * a hint slot), its front (the block it kept last, outside the shared cache), the hints through
 * which other threads see a front, and what moves a front's block: back to the program, to the
 * shared cache, to another thread (hl_steal), or to the next allocator (decay, the bound). */

static __thread int hl_thread_state; /* 0 new, 1 being registered, 2 registered, 3 exited */

/* pools, guided: the block a thread kept last waits in the thread's own front, outside the
 * shared cache, and the thread's next request that it fits takes it back under its shard's lock
 * alone (the tight loop of one thread, and of many threads at once, never meets the others).
 * Its live-set slot carries the front's ticket, so a second free of it by any thread is seen
 * (a double free: the slot goes, both frees reach the real free) and the front, finding its
 * ticket gone, forgets the block without touching it. A front's block counts against the cap
 * through the thread's reservation (the largest front block it held, in the cache's front_bytes). */
struct hl_front {
    void *p;
    size_t usable;
    uint64_t ticket, since;
    size_t reserved; /* this thread's share of the cache's front_bytes */
};
static __thread struct hl_front hl_front;
static __thread uint64_t hl_ticket_next; /* thread id << 40 | sequence; 0: no id yet */
static uint32_t hl_thread_ids;

/* What the fronts hold, for the other threads: a thread that finds nothing in the shared cache
 * takes a fitting block from another thread's front (its shard's lock and the front's ticket
 * decide, as for a double free: the owner, finding its ticket gone, forgets the block). Without
 * it, a block waiting in an idle thread's front is lost to the others (a thread-per-connection
 * server kept more memory: ../../README.md, History). A hint is written by its thread only, under a
 * sequence count (odd while it changes), and read by the others without a lock; a thread gets
 * one of HL_HINTS slots when it registers (none left: no front for it). */
#define HL_HINTS 64
struct hl_hint {
    uint64_t seq;
    void *p;
    size_t usable;
    uint64_t ticket;
} __attribute__((aligned(64)));
static struct hl_hint hl_hints[HL_HINTS];
static uint64_t hl_hints_used; /* bit i: slot i belongs to a live thread */
static __thread int hl_hint_slot = -1;

static void hl_hint_write(void *p, size_t usable, uint64_t ticket) {
    struct hl_hint *h = &hl_hints[hl_hint_slot];
    uint64_t seq = h->seq;
    __atomic_store_n(&h->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h->p, p, __ATOMIC_RELAXED);
    __atomic_store_n(&h->usable, usable, __ATOMIC_RELAXED);
    __atomic_store_n(&h->ticket, ticket, __ATOMIC_RELAXED);
    __atomic_store_n(&h->seq, seq + 2, __ATOMIC_RELEASE);
}

/* The thread's front holds p now (NULL: nothing), and its hint says so. */
static inline void hl_front_set(void *p, size_t usable, uint64_t ticket, uint64_t since) {
    hl_front.p = p;
    hl_front.usable = usable;
    hl_front.ticket = ticket;
    hl_front.since = since;
    if (hl_hint_slot >= 0) hl_hint_write(p, usable, ticket);
}

static inline void hl_front_clear(void) { hl_front_set(NULL, 0, 0, 0); }

static void hl_hint_release(void) {
    if (hl_hint_slot < 0) return;
    hl_hint_write(NULL, 0, 0);
    __atomic_fetch_and(&hl_hints_used, ~((uint64_t)1 << hl_hint_slot), __ATOMIC_RELEASE);
    hl_hint_slot = -1;
}

static inline uint64_t hl_new_ticket(void) {
    if (HL_UNLIKELY(hl_ticket_next == 0))
        hl_ticket_next = ((uint64_t)__atomic_add_fetch(&hl_thread_ids, 1, __ATOMIC_RELAXED) << 40) | 1;
    return hl_ticket_next++;
}

static void hl_front_flush(void); /* below */

static void hl_thread_exit(void *v) {
    (void)v;
    hl_front_flush();
    hl_hint_release();
    hl_stripe_release();
    hl_thread_state = 3;
    struct hcp_counter *c = hl_counter;
    hl_counter = NULL;
    if (c) munmap(c, sizeof *c);
}

/* The thread's counter (guided), its key (whose destructor hands its front to the shared cache
 * at exit) and its hint slot. */
static void hl_thread_register(void) {
    if (hl_thread_state != 0) return; /* registered, exited, or being registered (re-entry) */
    hl_thread_state = 1;
    if (hl_set.policy == HL_GUIDED) {
        void *m = mmap(NULL, sizeof(struct hcp_counter), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) hl_counter = m;
    }
    /* non-NULL, so that the destructor runs; may calloc (keys >= 32): state 1 guards */
    if (hl_key_ok &&
        pthread_setspecific(hl_key, hl_counter ? (void *)hl_counter : (void *)&hl_front) == 0 &&
        hl_sharded)
        hl_hint_slot = hl_slot_claim(&hl_hints_used);
    hl_thread_state = 2;
}

/* The thread may keep a block in its front: a policy with pools and a destructor to empty it. */
static inline int hl_front_open(void) {
    if (hl_set.policy != HL_POOLS && hl_set.policy != HL_GUIDED) return 0;
    if (HL_UNLIKELY(hl_thread_state != 2)) hl_thread_register();
    return hl_thread_state == 2 && hl_hint_slot >= 0; /* a destructor and a hint slot */
}

/* The front f still holds its block (its ticket is in the live set): 1, and the block is the
 * program's again (req > 0) or out of the live set (req == 0); 0 if a second free took it. */
static int hl_front_claim(const struct hl_front *f, size_t req, uint64_t ctx) {
    struct hl_shard *s = hl_shard_of(f->p);
    hl_spin_lock(&s->lock);
    struct hl_live_slot *e = hl_live_find(s, f->p);
    int ours = e != NULL && e->ticket == f->ticket;
    if (ours && req) {
        hl_bytes_move(&s->fronted, &s->live, e->usable);
        e->ticket = 0;
        e->req = req;
        e->ctx = ctx; /* the new allocation's context (predict.c) */
        s->hits++;
    } else if (ours) {
        hl_live_remove(s, e);
    }
    hl_spin_unlock(&s->lock);
    return ours;
}

/* The front's block goes back to the next allocator (idle past `decay`, the thread exits, or
 * hl_bound; f may be another thread's front); 0 if a second free took it first. */
static int hl_front_give_back(const struct hl_front *f, int decayed) {
    if (!hl_front_claim(f, 0, 0)) return 0;
    hl_lock_take();
    hpc_count_given_back(&hl_cache, f->usable, decayed);
    hl_lock_give();
    hc_real.free(f->p);
    return 1;
}

/* f leaves its thread's front for the shared cache (a newer block takes its place), as any
 * kept block enters it: idle blocks decay, the oldest make room under the cap, or it goes back. */
static void hl_front_to_shared(const struct hl_front *f, uint64_t now) {
    struct hpc_out out = {0};
    hl_lock_take();
    if (hl_front_claim(f, 0, 0)) {
        struct hpc_block b = {(uintptr_t)f->p, f->usable, 0, f->since, 0};
        hpc_enter_shared(&hl_core, &hl_cache, &b, now, &out);
    }
    hl_lock_give();
    hl_release(&out);
}

/* The thread exits: its front's block joins the shared cache, where the next thread can take
 * it (given back instead, a thread-per-connection server kept more memory and missed reuses:
 * ../../README.md, History), and its reservation is freed. */
static void hl_front_flush(void) {
    struct hl_front f = hl_front;
    hl_front_clear();
    if (f.p) hl_front_to_shared(&f, hl_now());
    if (hl_front.reserved) {
        hl_lock_take();
        hl_cache.front_bytes -= hl_front.reserved;
        hl_lock_give();
        hl_front.reserved = 0;
    }
}

/* Room under the cap for this thread's front to hold `usable` bytes: its reservation grows to
 * that, the shared cache's oldest going back if needed (no lock held); 1 if reserved. */
static int hl_reserve(size_t usable) {
    struct hpc_out out = {0};
    uint64_t reserved = hl_front.reserved;
    hl_lock_take();
    int ok = hpc_reserve(&hl_core, &hl_cache, &reserved, usable, &out);
    hl_lock_give();
    hl_front.reserved = reserved;
    hl_release(&out);
    return ok;
}

/* Another thread's front as its hint says (read without a lock): 1 and *f if it names a block,
 * 0 if it names none or was torn (being written). Stale is possible: the block's shard and its
 * ticket decide (hl_front_claim). */
static int hl_hint_read(const struct hl_hint *h, struct hl_front *f) {
    uint64_t seq = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
    void *p = __atomic_load_n(&h->p, __ATOMIC_RELAXED);
    size_t usable = __atomic_load_n(&h->usable, __ATOMIC_RELAXED);
    uint64_t ticket = __atomic_load_n(&h->ticket, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if ((seq & 1) || __atomic_load_n(&h->seq, __ATOMIC_RELAXED) != seq || p == NULL) return 0;
    *f = (struct hl_front){.p = p, .usable = usable, .ticket = ticket};
    return 1;
}

/* The other live threads' hint slots, as a bit set. */
static inline uint64_t hl_other_hints(void) {
    uint64_t used = __atomic_load_n(&hl_hints_used, __ATOMIC_ACQUIRE);
    return hl_hint_slot >= 0 ? used & ~((uint64_t)1 << hl_hint_slot) : used;
}

/* Nothing fits in the shared cache: a fitting block from another thread's front, made live for
 * n bytes; NULL if none. */
static void *hl_steal(size_t n, uintptr_t mask, struct hl_ask *a) {
    for (uint64_t used = hl_other_hints(); used; used &= used - 1) {
        struct hl_front f;
        if (!hl_hint_read(&hl_hints[__builtin_ctzll(used)], &f)) continue;
        if (!hpc_serves((uintptr_t)f.p, f.usable, n, mask)) continue;
        if (hl_front_claim(&f, n, hl_ask_ctx(a))) return f.p; /* as its owner would take it back */
    }
    return NULL;
}

/* hl_bound, the shared cache emptied and still `over` bytes above the bound: the fronts' blocks
 * go back, this thread's first, then the others' (as a double free takes one: the ticket
 * leaves the live set, and the owner, finding it gone, forgets the block). Without this, every
 * thread's front held its last block on top of the peak. */
static size_t hl_bound_give_back(const struct hl_front *f, size_t over) {
    if (!hl_front_give_back(f, 0)) return over; /* a second free took it first */
    HL_COUNT(bounded);
    return over - (over < f->usable ? over : f->usable);
}

static void hl_bound_fronts(size_t over) {
    struct hl_front f = hl_front;
    if (f.p != NULL) {
        hl_front_clear();
        over = hl_bound_give_back(&f, over);
    }
    for (uint64_t used = hl_other_hints(); over > 0 && used; used &= used - 1)
        if (hl_hint_read(&hl_hints[__builtin_ctzll(used)], &f)) over = hl_bound_give_back(&f, over);
}

