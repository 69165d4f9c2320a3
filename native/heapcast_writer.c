/* Part of heapcast.c (one translation unit; never compiled alone): the writer's core, what the
 * hooks call. The per-thread buffers (hc_emit, the data path: one bounds check, five stores, one
 * release store; its slow paths register a thread's buffer, flush a full one, retire it at
 * thread exit), start (hc_init, on the first hooked call once libc has an environment, or the
 * constructor), exit (hc_finish: atexit, the destructor, before exec and _exit), fork
 * (pthread_atfork), and the guard every hook enters and leaves by (hc_enter, hc_leave). */

/* ------------------------------------------------------------------------------------------- */
/* Buffers                                                                                       */

/* Writes what `b` holds beyond `flushed`. The owner (buffer full) rewinds the buffer; any other
 * thread (exit, exec) only advances `flushed`, because the owner may be appending right now. */
static void hc_flush_buffer(struct hc_buffer *b, int owner) {
    pthread_mutex_lock(&b->lock);
    if (!b->retired) {
        size_t pos = __atomic_load_n(&b->pos, __ATOMIC_ACQUIRE);
        if (pos > b->flushed) hc_write(b->data + b->flushed, pos - b->flushed);
        if (owner) {
            __atomic_store_n(&b->pos, 0, __ATOMIC_RELAXED);
            b->flushed = 0;
        } else {
            b->flushed = pos;
        }
    }
    pthread_mutex_unlock(&b->lock);
}

/* Flushes every live buffer; called at exit, before exec and from _exit. Guard must be set. */
static void hc_flush_all(void) {
    if (!__atomic_load_n(&hc_tracing, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&hc_registry_lock);
    for (struct hc_buffer *b = hc_registry; b; b = b->next) hc_flush_buffer(b, 0);
    hc_flush_buffer(&hc_orphan, 1); /* orphan appends happen under its lock: rewinding is safe */
    pthread_mutex_unlock(&hc_registry_lock);
}

static inline uint64_t hc_pack(uint64_t size, uint64_t op, uint64_t thread_bits) {
    if (HC_UNLIKELY(size > HC_SIZE_MAX)) size = HC_SIZE_MAX;
    return size | (op << HC_OP_SHIFT) | thread_bits;
}

static inline void hc_fill(unsigned char *at, uint64_t op, uint64_t addr, uint64_t arg, uint64_t size,
                           uint64_t thread_bits, uint64_t caller, uint64_t stack) {
    uint64_t *r = (uint64_t *)at;
    r[0] = hc_now();
    r[1] = addr;
    r[2] = arg;
    r[3] = hc_pack(size, op, thread_bits);
    if (hc_flags & HC_FLAG_CALLER) r[4] = caller;
    if (hc_flags & HC_FLAG_STACKS) r[5] = stack;
}

static void hc_emit_slow(struct hc_tls *t, uint64_t op, uint64_t addr, uint64_t arg, uint64_t size,
                         uint64_t caller, uint64_t stack);

/* The data path: one bounds check, six stores, one release store (a plain mov on x86). */
static inline __attribute__((always_inline)) void hc_emit(struct hc_tls *t, uint64_t op, uint64_t addr,
                                                          uint64_t arg, uint64_t size, uint64_t caller,
                                                          uint64_t stack) {
    struct hc_buffer *b = t->buf;
    size_t pos = b->pos;
    if (HC_UNLIKELY(pos + hc_record_size > b->cap)) {
        hc_emit_slow(t, op, addr, arg, size, caller, stack);
        return;
    }
    hc_fill(b->data + pos, op, addr, arg, size, t->thread_bits, caller, stack);
    __atomic_store_n(&b->pos, pos + hc_record_size, __ATOMIC_RELEASE);
}

static size_t hc_walk_bytes(void);

/* First call of a thread: a buffer (and with stacks its stack cache, in the same mapping), a
 * number, a registry entry, THREAD_START. */
static struct hc_buffer *hc_register_thread(struct hc_tls *t) {
    size_t cache = hc_frames ? HC_STACK_CACHE * sizeof(struct hc_stack_slot) : 0;
    size_t walk = hc_frames ? (hc_walk_bytes() + 4095) / 4096 * 4096 : 0;
    size_t bytes = HC_BUFFER_BYTES + 4096 + cache + walk;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    struct hc_buffer *b = m;
    b->pos = 0;
    b->cap = HC_BUFFER_BYTES;
    b->flushed = 0;
    b->retired = 0;
    pthread_mutex_init(&b->lock, NULL);
    b->map_bytes = bytes;
    b->data = (unsigned char *)m + 4096 + cache + walk;
    b->stack_cache = cache ? (struct hc_stack_slot *)((unsigned char *)m + 4096) : NULL;
    b->walk = walk ? (struct hc_walk *)((unsigned char *)m + 4096 + cache) : NULL; /* zeroed: n 0 */

    uint32_t num = __atomic_fetch_add(&hc_next_thread, 1, __ATOMIC_RELAXED);
    if (num > HC_THREAD_MAX) num = HC_THREAD_MAX;
    t->thread_bits = (uint64_t)num << HC_THREAD_SHIFT;

    pthread_mutex_lock(&hc_registry_lock);
    b->prev = NULL;
    b->next = hc_registry;
    if (hc_registry) hc_registry->prev = b;
    hc_registry = b;
    pthread_mutex_unlock(&hc_registry_lock);

    t->buf = b;
    if (hc_key_ok) pthread_setspecific(hc_key, b); /* the destructor flushes and retires it */
    hc_fill(b->data, HC_OP_THREAD_START, 0, (uint64_t)syscall(SYS_gettid), 0, t->thread_bits, 0, 0);
    __atomic_store_n(&b->pos, hc_record_size, __ATOMIC_RELEASE);
    return b;
}

static HC_NOINLINE void hc_emit_slow(struct hc_tls *t, uint64_t op, uint64_t addr, uint64_t arg,
                                     uint64_t size, uint64_t caller, uint64_t stack) {
    struct hc_buffer *b = t->buf;
    if (b == &hc_unregistered) {
        if (!hc_register_thread(t)) return; /* no memory for a buffer: drop */
        hc_emit(t, op, addr, arg, size, caller, stack);
    } else if (b == &hc_retired) {
        pthread_mutex_lock(&hc_orphan.lock);
        if (hc_orphan.pos + hc_record_size > hc_orphan.cap) {
            hc_write(hc_orphan.data, hc_orphan.pos);
            hc_orphan.pos = 0;
        }
        hc_fill(hc_orphan.data + hc_orphan.pos, op, addr, arg, size, t->thread_bits, caller, stack);
        hc_orphan.pos += hc_record_size;
        pthread_mutex_unlock(&hc_orphan.lock);
    } else {
        hc_modules_scan(0);
        hc_flush_buffer(b, 1);
        hc_emit(t, op, addr, arg, size, caller, stack);
    }
}

/* pthread key destructor: the thread is exiting. Flush its buffer, take it out of the registry,
 * unmap it; later calls of this thread (other TLS destructors, libc's cleanup) use hc_orphan. */
static void hc_thread_exit(void *arg) {
    struct hc_tls *t = &hc_tls;
    struct hc_buffer *b = arg;
    if (!b || b != t->buf) return;
    t->guard++;
    HC_SIGNAL_FENCE();
    hc_modules_scan(0);
    pthread_mutex_lock(&hc_registry_lock);
    hc_flush_buffer(b, 1);
    pthread_mutex_lock(&b->lock);
    b->retired = 1;
    pthread_mutex_unlock(&b->lock);
    if (b->prev) b->prev->next = b->next;
    else hc_registry = b->next;
    if (b->next) b->next->prev = b->prev;
    t->buf = &hc_retired;
    pthread_mutex_unlock(&hc_registry_lock);
    munmap(b, b->map_bytes);
    HC_SIGNAL_FENCE();
    t->guard--;
}

/* ------------------------------------------------------------------------------------------- */
/* Start, exit, fork                                                                             */

static void hc_finish(void) {
    struct hc_tls *t = &hc_tls;
    t->guard++;
    HC_SIGNAL_FENCE();
    hc_modules_scan(1);
    hc_flush_all();
    hc_refine_clock();
    HC_SIGNAL_FENCE();
    t->guard--;
}

static void hc_atexit(void) { hc_finish(); }

static void hc_fork_prepare(void) {
    hc_tls.guard++;
    HC_SIGNAL_FENCE();
    pthread_mutex_lock(&hc_trie_lock); /* first: a trie insert may flush (file lock) */
    pthread_mutex_lock(&hc_module_lock);
    pthread_mutex_lock(&hc_registry_lock);
    pthread_mutex_lock(&hc_orphan.lock);
    pthread_mutex_lock(&hc_file_lock);
}

static void hc_fork_parent(void) {
    pthread_mutex_unlock(&hc_file_lock);
    pthread_mutex_unlock(&hc_orphan.lock);
    pthread_mutex_unlock(&hc_registry_lock);
    pthread_mutex_unlock(&hc_module_lock);
    pthread_mutex_unlock(&hc_trie_lock);
    HC_SIGNAL_FENCE();
    hc_tls.guard--;
}

/* The child is a new process with one thread: it discards every inherited buffer (their records
 * belong to the parent, which flushes them itself), numbers its threads from 0 again and writes
 * its own file, whose ppid is the forking process. */
static void hc_fork_child(void) {
    pthread_mutex_init(&hc_trie_lock, NULL);
    pthread_mutex_init(&hc_module_lock, NULL);
    pthread_mutex_init(&hc_registry_lock, NULL);
    pthread_mutex_init(&hc_orphan.lock, NULL);
    pthread_mutex_init(&hc_file_lock, NULL);
    struct hc_buffer *b = hc_registry;
    while (b) {
        struct hc_buffer *next = b->next;
        munmap(b, b->map_bytes);
        b = next;
    }
    hc_registry = NULL;
    hc_orphan.pos = 0;
    hc_orphan.flushed = 0;
    hc_next_thread = 0;
    hc_tls.buf = &hc_unregistered;
    hc_tls.thread_bits = 0;
    if (hc_key_ok) pthread_setspecific(hc_key, NULL);
    hc_told = 0; /* a new process may say its own line */
    int was_tracing = __atomic_load_n(&hc_tracing, __ATOMIC_RELAXED);
    __atomic_store_n(&hc_tracing, 0, __ATOMIC_RELAXED);
    if (hc_fd >= 0) close(hc_fd); /* the parent's file: not ours to write */
    hc_fd = -1;
    if (was_tracing) {
        hc_clock_start(0);
        hc_fd = hc_open_trace();
        __atomic_store_n(&hc_tracing, hc_fd >= 0, __ATOMIC_RELEASE);
        /* the parent's module map and stack trie are this image's too */
        if (hc_mlog_len) hc_write(hc_mlog, hc_mlog_len);
        if (hc_frames) hc_stacks_replay();
    }
    HC_SIGNAL_FENCE();
    hc_tls.guard--;
}

/* Reads the environment and opens the trace. Called once, with the guard set. Returns 0 when it
 * is too early (libc not initialised yet: no environment); the caller retries on a later call. */
static int hc_init(void) {
    extern char **environ;
    if (!environ) return 0;
    if (!hc_real.malloc) hc_resolve();
    if (!hc_real.malloc) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0) hc_pagesize = (uint64_t)ps;

    /* the variables' values (options.h): HEAPCAST_CLOCK=monotonic, HEAPCAST_CALLER=1, the
     * directory HEAPCAST_OUT; any other value of the first two leaves their default */
    static const char *const clocks[] = {"tsc", "monotonic"}, *const flags[] = {"0", "1"};
#if defined(__x86_64__)
    int mono = hc_option_word(getenv("HEAPCAST_CLOCK"), clocks, 2) == 1;
    hc_clock = mono ? HC_CLOCK_MONOTONIC : HC_CLOCK_TSC;
#else
    (void)clocks;
    hc_clock = HC_CLOCK_MONOTONIC;
#endif
    if (hc_option_word(getenv("HEAPCAST_CALLER"), flags, 2) == 1) {
        hc_flags |= HC_FLAG_CALLER;
        hc_record_size = sizeof(struct hc_record_caller);
    }
    /* HEAPCAST_FRAMES=N (1..HC_FRAMES_MAX): call stacks, which carry the caller too; 0, unset
     * or anything else: none */
    uint64_t frames = 0;
    const char *fv = getenv("HEAPCAST_FRAMES");
    if (fv && hc_option_uint(fv, 0, HC_FRAMES_MAX, &frames) && frames > 0) {
        hc_uw_start();
        if (hc_uw_cache) {
            hc_frames = (unsigned)frames;
            hc_flags |= HC_FLAG_CALLER | HC_FLAG_STACKS;
            hc_record_size = sizeof(struct hc_record_stack);
        }
    }
    const char *out = getenv("HEAPCAST_OUT");
    if (!out || !*out) {
        hc_say("HEAPCAST_OUT is not set (it names the directory for trace files)", "", "", 0);
        return 1;
    }
    if (!hc_option_copy(hc_out_dir, sizeof hc_out_dir, out)) {
        hc_say("HEAPCAST_OUT is too long", "", "", 0);
        return 1;
    }

    hc_key_ok = pthread_key_create(&hc_key, hc_thread_exit) == 0;
    pthread_atfork(hc_fork_prepare, hc_fork_parent, hc_fork_child);
    atexit(hc_atexit); /* runs after the program's own atexit handlers (registered later) */

    hc_clock_start(1);
    hc_fd = hc_open_trace();
    __atomic_store_n(&hc_tracing, hc_fd >= 0, __ATOMIC_RELEASE);
    hc_modules_scan(1);
    return 1;
}

/* Entry when the fast check failed. Returns the thread state with the guard set when this call
 * is to be recorded, NULL when it passes through untraced. */
static HC_NOINLINE struct hc_tls *hc_enter_slow(struct hc_tls *t) {
    if (t->guard) return NULL;
    if (__atomic_load_n(&hc_state, __ATOMIC_ACQUIRE) == HC_UNINIT) {
        int expected = HC_UNINIT;
        /* Another thread initialising: pass through rather than wait (it may be waiting on the
         * loader lock we hold inside dlopen -> malloc). */
        if (!__atomic_compare_exchange_n(&hc_state, &expected, HC_INITING, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            return NULL;
        t->guard++;
        HC_SIGNAL_FENCE();
        int done = hc_init();
        HC_SIGNAL_FENCE();
        t->guard--;
        __atomic_store_n(&hc_state, done ? HC_READY : HC_UNINIT, __ATOMIC_RELEASE);
    }
    if (!__atomic_load_n(&hc_tracing, __ATOMIC_ACQUIRE)) return NULL;
    t->guard = 1;
    HC_SIGNAL_FENCE();
    return t;
}

static inline __attribute__((always_inline)) struct hc_tls *hc_enter(void) {
    struct hc_tls *t = &hc_tls;
    if (HC_LIKELY(!t->guard && __atomic_load_n(&hc_tracing, __ATOMIC_RELAXED))) {
        t->guard = 1;
        HC_SIGNAL_FENCE();
        return t;
    }
    return hc_enter_slow(t);
}

static inline __attribute__((always_inline)) void hc_leave(struct hc_tls *t) {
    HC_SIGNAL_FENCE();
    t->guard = 0;
}

__attribute__((constructor)) static void hc_constructor(void) {
    struct hc_tls *t = hc_enter(); /* initialises if no allocation did so yet */
    if (t) hc_leave(t);
}

__attribute__((destructor)) static void hc_destructor(void) { hc_finish(); }
