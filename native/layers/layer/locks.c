/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Locks. Every lock of the layer is taken only for blocks >= `min` and never around a syscall
 * or a call to the real allocator.
 *
 * A shard's lock: a test-and-set word (0 free, 1 held) whose unlock is a plain release store,
 * as snmalloc's and rpmalloc's locks are. Its holds are one probe of a shard's table, and a kept
 * pair takes the lock twice: an unlock without an atomic read-modify-write matters (a futex
 * word, U. Drepper's "Futexes Are Tricky" mutex 2, needs one to give the lock back, so that a
 * sleeper is woken; ../../README.md, Measured).
 * A waiter spins a little, as glibc's adaptive mutex does, then yields its core: with more
 * threads than cores the holder may be the one waiting for a core, and spinning would keep it
 * waiting. */
struct hl_spin {
    int w;
};

static inline void hl_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int hl_spin_try(struct hl_spin *l) {
    int free_ = 0;
    return __atomic_compare_exchange_n(&l->w, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static __attribute__((noinline)) void hl_spin_wait(struct hl_spin *l) {
    for (unsigned i = 0;; i++) {
        if (i < 100) hl_relax();
        else sched_yield();
        if (__atomic_load_n(&l->w, __ATOMIC_RELAXED) == 0 && hl_spin_try(l)) return;
    }
}

/* A process that has never started a thread takes no shard lock: glibc says so in
 * __libc_single_threaded (2.32+; weak, so that an older glibc just takes the locks), false from
 * the first pthread_create on, and its own malloc skips its arena locks on the same word. Each
 * lock is an atomic read-modify-write, and a kept block's pair takes four (../../README.md,
 * Measured). A lock not taken leaves its word 0, which
 * the unlock's store leaves as it is (a lock taken before a fork is given back in the child
 * likewise). A program that makes threads with a bare clone() breaks glibc's own malloc in the
 * same way. */
extern char __libc_single_threaded __attribute__((weak));

static inline int hl_single_threaded(void) {
    return &__libc_single_threaded != NULL &&
           __atomic_load_n(&__libc_single_threaded, __ATOMIC_RELAXED);
}

static inline void hl_spin_lock(struct hl_spin *l) {
    if (hl_single_threaded()) return;
    if (HL_UNLIKELY(!hl_spin_try(l))) hl_spin_wait(l);
}

/* A lock not taken (one thread) is 0 already, and storing 0 again is harmless: no other thread
 * exists to hold it. */
static inline void hl_spin_unlock(struct hl_spin *l) { __atomic_store_n(&l->w, 0, __ATOMIC_RELEASE); }

/* hl_lock, the shared cache's (and largest's live set's): a lock of the same kind, skipped
 * likewise while the process has one thread (largest takes it at every large call). Not
 * glibc's adaptive mutex, whose lock and unlock are each a read-modify-write. Its holds are
 * longer than a shard's (the decay and make-room scans of up to HPC_MAX_KEPT blocks), which the
 * waiters' yield covers. On a cache line of its own: its waiters' reads and its holder's writes
 * meet no variable that every call reads (hc_real, the settings), wherever the parts put them. */
static struct {
    struct hl_spin l;
} __attribute__((aligned(64))) hl_lock;
static inline void hl_lock_take(void) { hl_spin_lock(&hl_lock.l); }
static inline void hl_lock_give(void) { hl_spin_unlock(&hl_lock.l); }

/* A free bit of *used, now set, or -1 (all set): a thread's counter stripe (stats.c) and hint
 * slot (fronts.c), each claimed from a 64-bit mask without a lock. */
static int hl_slot_claim(uint64_t *used) {
    uint64_t u = __atomic_load_n(used, __ATOMIC_RELAXED);
    while (u != ~(uint64_t)0) {
        int i = __builtin_ctzll(~u);
        if (__atomic_compare_exchange_n(used, &u, u | (uint64_t)1 << i, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return i;
    }
    return -1;
}
