/* Part of heapcast.c (one translation unit; never compiled alone): the hooks, the LD_PRELOAD
 * front end (heaptrack's heaptrack_preload.cpp beside its libheaptrack.cpp). They use the
 * writer through hc_enter / hc_emit / hc_leave and hc_finish (heapcast_writer.c), and
 * the real functions through real.h; they know nothing of files or buffers.
 *
 * Untraced paths: nested calls (guard set), tracing off, or before the real functions are known */

static void *hc_plain_malloc(size_t n) {
    void *(*f)(size_t) = HC_REAL(malloc);
    return f ? f(n) : hc_pool_alloc(n, 16);
}

static void *hc_plain_calloc(size_t m, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(calloc);
    if (f) return f(m, n);
    size_t total;
    if (__builtin_mul_overflow(m, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return hc_pool_alloc(total, 16);
}

static void *hc_plain_memalign(size_t align, size_t n) {
    void *(*f)(size_t, size_t) = HC_REAL(memalign);
    return f ? f(align, n) : hc_pool_alloc(n, align);
}

/* realloc of a bootstrap-pool block: copy it out (the pool block is never freed). */
static void *hc_pool_realloc(void *p, size_t n) {
    void *q = hc_plain_malloc(n);
    if (q && p) {
        size_t old = hc_pool_size(p);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

/* ------------------------------------------------------------------------------------------- */
/* Hooks. Each: guard check, real call, one record. The caller is __builtin_return_address(0),
 * stored only with HEAPCAST_CALLER=1. Time is taken after the call returns, except for free,
 * whose record is written before the block is released (so no other thread can get the same
 * address and record it first). */

#define HC_CALLER() ((uint64_t)(uintptr_t)__builtin_return_address(0))
/* the call stack (HEAPCAST_FRAMES), unwound from this hook's own frame */
#define HC_STACK(t) hc_stack_of((t), __builtin_frame_address(0))

static inline uint64_t hc_mul_sat(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : (uint64_t)r;
}

HC_EXPORT void *malloc(size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_malloc(n);
    void *p = hc_real.malloc(n);
    hc_emit(t, HC_OP_MALLOC, (uintptr_t)p, 0, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void free(void *p) {
    if (HC_UNLIKELY(p == NULL)) return;
    if (HC_UNLIKELY(hc_in_pool(p))) return; /* bootstrap block: never recorded, never freed */
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void (*f)(void *) = HC_REAL(free);
        if (f) f(p);
        return;
    }
    hc_emit(t, HC_OP_FREE, (uintptr_t)p, 0, 0, HC_CALLER(), 0);
    hc_real.free(p);
    hc_leave(t);
}

HC_EXPORT void *calloc(size_t m, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_calloc(m, n);
    void *p = hc_real.calloc(m, n);
    hc_emit(t, HC_OP_CALLOC, (uintptr_t)p, 0, hc_mul_sat(m, n), HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void *realloc(void *old, size_t n) {
    uint64_t caller = HC_CALLER();
    struct hc_tls *t;
    if (HC_UNLIKELY(hc_in_pool(old))) {
        /* Out of the bootstrap pool: the pool block was never recorded, so from the trace's
         * point of view this is a fresh allocation; it is recorded as malloc. */
        void *q = hc_pool_realloc(old, n);
        if ((t = hc_enter()) != NULL) {
            hc_emit(t, HC_OP_MALLOC, (uintptr_t)q, 0, n, caller, HC_STACK(t));
            hc_leave(t);
        }
        return q;
    }
    t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void *(*f)(void *, size_t) = HC_REAL(realloc);
        return f ? f(old, n) : hc_pool_realloc(old, n); /* no real realloc: old is NULL or pool */
    }
    void *p = hc_real.realloc(old, n);
    hc_emit(t, HC_OP_REALLOC, (uintptr_t)p, (uintptr_t)old, n, caller, HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void *reallocarray(void *old, size_t m, size_t n) {
    uint64_t caller = HC_CALLER();
    struct hc_tls *t;
    if (HC_UNLIKELY(hc_in_pool(old))) {
        size_t total;
        if (__builtin_mul_overflow(m, n, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        void *q = hc_pool_realloc(old, total);
        if ((t = hc_enter()) != NULL) {
            hc_emit(t, HC_OP_MALLOC, (uintptr_t)q, 0, total, caller, HC_STACK(t));
            hc_leave(t);
        }
        return q;
    }
    t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void *(*f)(void *, size_t, size_t) = HC_REAL(reallocarray);
        if (f) return f(old, m, n);
        size_t total;
        if (__builtin_mul_overflow(m, n, &total)) {
            errno = ENOMEM;
            return NULL;
        }
        return hc_pool_realloc(old, total);
    }
    void *p = hc_real.reallocarray(old, m, n);
    hc_emit(t, HC_OP_REALLOCARRAY, (uintptr_t)p, (uintptr_t)old, hc_mul_sat(m, n), caller, HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        int (*f)(void **, size_t, size_t) = HC_REAL(posix_memalign);
        if (f) return f(out, align, n);
        void *p = hc_pool_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    int rc = hc_real.posix_memalign(out, align, n);
    hc_emit(t, HC_OP_POSIX_MEMALIGN, rc == 0 ? (uintptr_t)*out : 0, align, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return rc;
}

HC_EXPORT void *aligned_alloc(size_t align, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void *(*f)(size_t, size_t) = HC_REAL(aligned_alloc);
        return f ? f(align, n) : hc_pool_alloc(n, align);
    }
    void *p = hc_real.aligned_alloc(align, n);
    hc_emit(t, HC_OP_ALIGNED_ALLOC, (uintptr_t)p, align, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void *memalign(size_t align, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_memalign(align, n);
    void *p = hc_real.memalign(align, n);
    hc_emit(t, HC_OP_MEMALIGN, (uintptr_t)p, align, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void *valloc(size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void *(*f)(size_t) = HC_REAL(valloc);
        return f ? f(n) : hc_pool_alloc(n, 4096);
    }
    void *p = hc_real.valloc(n);
    hc_emit(t, HC_OP_VALLOC, (uintptr_t)p, hc_pagesize, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

HC_EXPORT void *pvalloc(size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) {
        void *(*f)(size_t) = HC_REAL(pvalloc);
        return f ? f(n) : hc_pool_alloc((n + 4095) & ~(size_t)4095, 4096);
    }
    void *p = hc_real.pvalloc(n);
    hc_emit(t, HC_OP_PVALLOC, (uintptr_t)p, hc_pagesize, n, HC_CALLER(), HC_STACK(t));
    hc_leave(t);
    return p;
}

/* Not recorded, only passed through: a program linked against jemalloc (Debian's redis) calls
 * malloc_usable_size on blocks our malloc returned; it must reach the allocator that made them,
 * and must know the bootstrap pool's blocks. */
HC_EXPORT size_t malloc_usable_size(void *p) {
    if (p == NULL) return 0;
    if (HC_UNLIKELY(hc_in_pool(p))) return hc_pool_size(p);
    size_t (*f)(void *) = HC_REAL(malloc_usable_size);
    return f ? f(p) : 0;
}

/* ------------------------------------------------------------------------------------------- */
/* exec and _exit: flush every buffer first; exec replaces the image (destructors never run) and
 * the new image loads heapcast again and writes its own file. If exec fails, tracing goes on.
 * posix_spawn is not hooked: it execs in a child (clone + internal execve), the caller's image
 * and buffers stay, and the child image writes its own file like any exec'd program. */

static void hc_before_exec(void) {
    if (__atomic_load_n(&hc_state, __ATOMIC_ACQUIRE) != HC_READY) return;
    hc_finish();
}

HC_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    hc_before_exec();
    int (*f)(const char *, char *const[], char *const[]) = HC_REAL(execve);
    if (!f) return errno = ENOSYS, -1;
    return f(path, argv, envp);
}

HC_EXPORT int execv(const char *path, char *const argv[]) {
    hc_before_exec();
    int (*f)(const char *, char *const[]) = HC_REAL(execv);
    if (!f) return errno = ENOSYS, -1;
    return f(path, argv);
}

HC_EXPORT int execvp(const char *file, char *const argv[]) {
    hc_before_exec();
    int (*f)(const char *, char *const[]) = HC_REAL(execvp);
    if (!f) return errno = ENOSYS, -1;
    return f(file, argv);
}

HC_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    hc_before_exec();
    int (*f)(const char *, char *const[], char *const[]) = HC_REAL(execvpe);
    if (!f) return errno = ENOSYS, -1;
    return f(file, argv, envp);
}

HC_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    hc_before_exec();
    int (*f)(int, char *const[], char *const[]) = HC_REAL(fexecve);
    if (!f) return errno = ENOSYS, -1;
    return f(fd, argv, envp);
}

/* execl, execlp, execle: collect the variadic arguments on the stack (no allocation) and go
 * through the hooked vector forms. */
#define HC_COLLECT_ARGS(first, last, argv, envp_out)                                              \
    size_t argc_ = 1;                                                                             \
    va_list ap_;                                                                                  \
    va_start(ap_, first);                                                                         \
    while (va_arg(ap_, char *) != NULL) argc_++;                                                  \
    va_end(ap_);                                                                                  \
    char **argv = __builtin_alloca((argc_ + 1) * sizeof(char *));                                  \
    argv[0] = (char *)(first);                                                                    \
    va_start(ap_, first);                                                                         \
    for (size_t i_ = 1; i_ <= argc_; i_++) argv[i_] = va_arg(ap_, char *);                        \
    if (last) *(envp_out) = va_arg(ap_, char **);                                                 \
    va_end(ap_)

HC_EXPORT int execl(const char *path, const char *arg, ...) {
    char **envp_unused = NULL;
    HC_COLLECT_ARGS(arg, 0, argv, &envp_unused);
    (void)envp_unused;
    return execv(path, argv);
}

HC_EXPORT int execlp(const char *file, const char *arg, ...) {
    char **envp_unused = NULL;
    HC_COLLECT_ARGS(arg, 0, argv, &envp_unused);
    (void)envp_unused;
    return execvp(file, argv);
}

HC_EXPORT int execle(const char *path, const char *arg, ...) {
    char **envp = NULL;
    HC_COLLECT_ARGS(arg, 1, argv, &envp);
    return execve(path, argv, envp);
}

/* _exit skips atexit and destructors; forked children use it all the time. */
HC_EXPORT __attribute__((noreturn)) void _exit(int status) {
    hc_before_exec();
    void (*f)(int) = HC_REAL(_exit);
    if (f) f(status);
    for (;;) syscall(SYS_exit_group, status);
}

HC_EXPORT __attribute__((noreturn)) void _Exit(int status) {
    hc_before_exec();
    void (*f)(int) = HC_REAL(_Exit);
    if (f) f(status);
    for (;;) syscall(SYS_exit_group, status);
}
