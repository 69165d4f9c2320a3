/*
 * heapcast tracer: an LD_PRELOAD library that records every malloc-family call of a process
 * into a raw trace file (format: native/FORMAT.md, mirrored in heapcast_format.h).
 *
 * The tracer is deliberately dumb: it writes one fixed-size record per call and knows nothing of
 * pairing, sizes of freed blocks or symbols. All interpretation happens offline.
 *
 * Data path (per call, no lock, no syscall):
 *   hook -> thread-local guard -> real allocator -> append one record to this thread's buffer.
 * Slow paths (rare): first call of a thread (register a buffer, THREAD_START), full buffer (one
 * write()), thread exit (pthread key destructor), fork, exec, exit.
 * With HEAPCAST_CALLER=1 the slow paths also keep the module map in the trace (hc_modules_scan:
 * at start, then whenever the loader's load/unload counters moved, checked at each buffer flush,
 * thread exit, exec and exit); the data path only stores the return address.
 *
 * Invariants the code relies on:
 *   - Only the owning thread appends to its buffer and only it moves `pos` (release store after
 *     the record's bytes are written). Other threads (exit/exec flush) only read `pos` and move
 *     `flushed`, under the buffer's lock, so a record is written to the file exactly once.
 *   - Every lock the tracer takes is taken with the thread's guard set. A signal handler that
 *     interrupts the tracer on the same thread therefore sees the guard and calls the real
 *     allocator untraced: it never waits on a lock its own thread holds (no deadlock), at the
 *     cost of not recording allocations made by a handler that interrupted a hook.
 *   - The tracer never calls the hooked functions itself; with the guard set, anything libc
 *     allocates on our behalf (dlsym, pthread_setspecific, atexit) passes through untraced.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bootstrap_pool.h"
#include "module_range.h"
#include "heapcast_format.h"

#define HC_EXPORT __attribute__((visibility("default")))
#define HC_LIKELY(x) __builtin_expect(!!(x), 1)
#define HC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HC_NOINLINE __attribute__((noinline, cold))
#define HC_SIGNAL_FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

/* Per-thread buffer: 256 KiB = 8192 records of 32 bytes (6553 of 40). Big enough that a flush
 * (one write() of 256 KiB, ~50-100 us) costs well under 1 ns per record; small enough that a
 * process with hundreds of threads stays in tens of MiB. */
#define HC_BUFFER_BYTES (256u * 1024u)
/* Records of threads whose buffer is already retired (frees made by other TLS destructors and by
 * libc after our key destructor ran) go to one shared buffer under a lock: rare by construction. */
#define HC_ORPHAN_BYTES (64u * 1024u)
/* TSC calibration window at start; refined over the whole run at exit (see hc_refine_clock). */
#define HC_CALIBRATE_NS 500000ull

/* ------------------------------------------------------------------------------------------- */
/* The hooked allocator functions, listed once. X(name, return type, parameter list)            */

#define HC_ALLOC_FUNCS(X)                                                                         \
    X(malloc, void *, (size_t))                                                                  \
    X(calloc, void *, (size_t, size_t))                                                          \
    X(realloc, void *, (void *, size_t))                                                         \
    X(reallocarray, void *, (void *, size_t, size_t))                                            \
    X(free, void, (void *))                                                                      \
    X(posix_memalign, int, (void **, size_t, size_t))                                            \
    X(aligned_alloc, void *, (size_t, size_t))                                                   \
    X(memalign, void *, (size_t, size_t))                                                        \
    X(valloc, void *, (size_t))                                                                  \
    X(pvalloc, void *, (size_t))                                                                 \
    X(malloc_usable_size, size_t, (void *))

/* Functions that replace the process image or end it: we flush before calling the real one. */
#define HC_EXIT_FUNCS(X)                                                                          \
    X(execve, int, (const char *, char *const[], char *const[]))                                 \
    X(execv, int, (const char *, char *const[]))                                                 \
    X(execvp, int, (const char *, char *const[]))                                                \
    X(execvpe, int, (const char *, char *const[], char *const[]))                                \
    X(fexecve, int, (int, char *const[], char *const[]))                                         \
    X(_exit, void, (int))                                                                        \
    X(_Exit, void, (int))

struct hc_real {
#define X(name, ret, params) ret(*name) params;
    HC_ALLOC_FUNCS(X)
    HC_EXIT_FUNCS(X)
#undef X
};
static struct hc_real hc_real;

/* ------------------------------------------------------------------------------------------- */
/* Per-thread state                                                                              */

struct hc_buffer {
    size_t pos;     /* bytes appended; written only by the owner (release), reset under lock */
    size_t cap;     /* data capacity; 0 for the two sentinels below (forces the slow path) */
    size_t flushed; /* bytes already written to the file; under lock */
    int retired;    /* under lock: no more writes from this buffer */
    pthread_mutex_t lock;
    struct hc_buffer *prev, *next; /* registry, under hc_registry_lock */
    size_t map_bytes;              /* mmap length, 0 for static buffers */
    unsigned char *data;
};

/* Sentinels: a thread that has not allocated yet points at hc_unregistered, a thread whose key
 * destructor already ran points at hc_retired. Both have cap 0, so the single bounds check of the
 * data path routes them to the slow path without an extra branch. */
static struct hc_buffer hc_unregistered = {.cap = 0};
static struct hc_buffer hc_retired = {.cap = 0};

struct hc_tls {
    int guard;            /* nonzero while inside the tracer: nested calls pass through */
    struct hc_buffer *buf; /* this thread's buffer or a sentinel */
    uint64_t thread_bits; /* thread number << 48, ready to OR into `packed` */
};

/* initial-exec TLS model, on purpose:
 *   - Why: the default (global-dynamic) model for a shared library reaches TLS through
 *     __tls_get_addr, which may allocate the thread's TLS block lazily with malloc -> our malloc
 *     -> __tls_get_addr -> ... infinite recursion before the guard can even be read. initial-exec
 *     is a fixed offset from the thread pointer: no call, no allocation, and 1-2 ns faster.
 *   - Risk: initial-exec TLS must live in the static TLS area reserved at program start. That
 *     is always fine for LD_PRELOAD (the library is loaded before the area is sized), but a
 *     dlopen() of libheapcast.so can fail with "cannot allocate memory in static TLS block".
 *   - Escape hatch: load it with LD_PRELOAD (the only supported way), or reserve surplus with
 *     GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096. */
static __thread struct hc_tls hc_tls __attribute__((tls_model("initial-exec"))) = {
    .guard = 0, .buf = &hc_unregistered, .thread_bits = 0};

/* ------------------------------------------------------------------------------------------- */
/* Process-wide state                                                                            */

enum { HC_UNINIT = 0, HC_INITING = 1, HC_READY = 2 };
static int hc_state = HC_UNINIT;
static int hc_tracing; /* 1 while records are written; read relaxed on every call */
static int hc_fd = -1; /* O_APPEND trace file */
static dev_t hc_fd_dev;
static ino_t hc_fd_ino;
static uint32_t hc_record_size = sizeof(struct hc_record);
static uint32_t hc_flags;
static uint32_t hc_clock = HC_CLOCK_MONOTONIC;
static uint64_t hc_start_ticks;
static uint64_t hc_start_mono_ns;
static double hc_ns_per_tick = 1.0;
static uint64_t hc_pagesize = 4096;
static char hc_out_dir[PATH_MAX];
static char hc_path[PATH_MAX];
static pthread_key_t hc_key;
static int hc_key_ok;
static int hc_told; /* the one stderr line of this process was printed */

static pthread_mutex_t hc_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t hc_file_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hc_buffer *hc_registry; /* live thread buffers */
static uint32_t hc_next_thread;       /* next thread number, atomic */

static unsigned char hc_orphan_data[HC_ORPHAN_BYTES] __attribute__((aligned(64)));
static struct hc_buffer hc_orphan = {
    .cap = HC_ORPHAN_BYTES, .lock = PTHREAD_MUTEX_INITIALIZER, .data = hc_orphan_data};

/* Bootstrap pool (dlsym calls calloc while the real functions are looked up): bootstrap_pool.h */

/* ------------------------------------------------------------------------------------------- */
/* Looking up the real functions                                                                 */

static void hc_resolve(void) {
    static int resolving;
    if (__atomic_exchange_n(&resolving, 1, __ATOMIC_ACQUIRE)) return; /* nested: caller uses pool */
    struct hc_real r;
#define X(name, ret, params) r.name = (ret(*) params)dlsym(RTLD_NEXT, #name);
    HC_ALLOC_FUNCS(X)
    HC_EXIT_FUNCS(X)
#undef X
    /* Publish the allocator entry points last, so whoever sees malloc also sees free. */
#define X(name, ret, params) __atomic_store_n(&hc_real.name, r.name, __ATOMIC_RELEASE);
    HC_EXIT_FUNCS(X)
#undef X
    __atomic_store_n(&hc_real.malloc_usable_size, r.malloc_usable_size, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.free, r.free, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.realloc, r.realloc, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.reallocarray, r.reallocarray, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.posix_memalign, r.posix_memalign, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.aligned_alloc, r.aligned_alloc, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.memalign, r.memalign, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.valloc, r.valloc, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.pvalloc, r.pvalloc, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.calloc, r.calloc, __ATOMIC_RELEASE);
    __atomic_store_n(&hc_real.malloc, r.malloc, __ATOMIC_RELEASE);
    __atomic_store_n(&resolving, 0, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------------------------------- */
/* Clocks.
 * TSC: on x86-64 the record clock is rdtsc (~7 ns, no syscall, no vDSO page walk). This assumes an
 * invariant TSC (constant rate, synchronised across cores, ticking in all power states; cpuid
 * flags constant_tsc + nonstop_tsc, which every x86-64 server of the last decade and the VMs here
 * have). Without it, per-thread order still holds but cross-thread times drift; set
 * HEAPCAST_CLOCK=monotonic to record CLOCK_MONOTONIC ns instead (clock=1). */

static inline uint64_t hc_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t hc_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t hc_now(void) {
#if defined(__x86_64__)
    if (HC_LIKELY(hc_clock == HC_CLOCK_TSC)) return __rdtsc();
#endif
    return hc_mono_ns();
}

/* A (ticks, monotonic ns) pair read as close together as possible: monotonic between two TSC
 * reads, the TSC taken as their midpoint, retried when the pair was interrupted. */
static void hc_clock_pair(uint64_t *ticks, uint64_t *mono) {
#if defined(__x86_64__)
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = __rdtsc(), m = hc_mono_ns(), b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *ticks = a + (b - a) / 2;
            *mono = m;
        }
    }
#else
    *ticks = *mono = hc_mono_ns();
#endif
}

/* Start of a trace: anchor pair, and for TSC a short busy calibration window. The estimate is
 * refined over the whole run at exit (hc_refine_clock rewrites ns_per_tick in the header), so a
 * process that runs long gets a precise rate, and one killed with SIGKILL keeps the estimate. */
static void hc_clock_start(int calibrate) {
    hc_clock_pair(&hc_start_ticks, &hc_start_mono_ns);
    if (hc_clock != HC_CLOCK_TSC) {
        hc_start_ticks = hc_start_mono_ns;
        hc_ns_per_tick = 1.0;
        return;
    }
    if (!calibrate) return; /* fork child: keeps the parent's rate */
    uint64_t t1, m1;
    do hc_clock_pair(&t1, &m1);
    while (m1 - hc_start_mono_ns < HC_CALIBRATE_NS);
    hc_ns_per_tick = t1 > hc_start_ticks ? (double)(m1 - hc_start_mono_ns) / (double)(t1 - hc_start_ticks) : 1.0;
}

/* ------------------------------------------------------------------------------------------- */
/* Messages: at most one line on stderr per process, prefixed "heapcast: ". Never stdout. */

static void hc_say(const char *a, const char *b, const char *c, int err) {
    if (__atomic_exchange_n(&hc_told, 1, __ATOMIC_RELAXED)) return;
    char line[PATH_MAX + 256];
    size_t n = 0;
    const char *parts[5] = {"heapcast: ", a, b, c, err ? ": " : NULL};
    for (int i = 0; i < 5; i++) {
        for (const char *s = parts[i]; s && *s && n < sizeof line - 128; s++) line[n++] = *s;
    }
    if (err) {
        const char *e = strerrordesc_np(err);
        for (const char *s = e ? e : "error"; *s && n < sizeof line - 2; s++) line[n++] = *s;
    }
    const char *tail = "; the program runs untraced\n";
    for (const char *s = tail; *s && n < sizeof line; s++) line[n++] = *s;
    ssize_t w = write(2, line, n);
    (void)w;
}

/* ------------------------------------------------------------------------------------------- */
/* The trace file                                                                                */

static char *hc_put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n) *p++ = tmp[--n];
    return p;
}

static int hc_remember_fd(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    hc_fd_dev = st.st_dev;
    hc_fd_ino = st.st_ino;
    return 0;
}

/* Opens $HEAPCAST_OUT/<pid>-<start_realtime_ns>[-k].hct and writes the header. Returns the fd or -1
 * (after saying why). Called with the guard set, at start and in a fork child. */
static int hc_open_trace(void) {
    uint64_t rt = hc_realtime_ns();
    uint32_t pid = (uint32_t)getpid();
    size_t dl = strlen(hc_out_dir);
    if (dl + 64 >= sizeof hc_path) {
        hc_say("HEAPCAST_OUT is too long: ", hc_out_dir, "", 0);
        return -1;
    }
    int fd = -1;
    for (unsigned k = 0; k < 1000; k++) {
        char *p = hc_path;
        memcpy(p, hc_out_dir, dl);
        p += dl;
        if (dl && p[-1] != '/') *p++ = '/';
        p = hc_put_u64(p, pid);
        *p++ = '-';
        p = hc_put_u64(p, rt);
        if (k) {
            *p++ = '-';
            p = hc_put_u64(p, k);
        }
        memcpy(p, ".hct", 5);
        fd = open(hc_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        hc_say("cannot create a trace file in HEAPCAST_OUT=", hc_out_dir, "", errno);
        return -1;
    }
    /* Keep the descriptor away from the low numbers programs dup2() onto. */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 200);
    if (high >= 0) {
        close(fd);
        fd = high;
    }

    /* Header: fixed 80 bytes + /proc/self/cmdline, zero-padded to a multiple of 8. */
    union {
        struct hc_header h;
        unsigned char bytes[sizeof(struct hc_header) + HC_CMDLINE_MAX + 8];
    } buf;
    memset(&buf, 0, sizeof buf);
    uint32_t cmd_len = 0;
    int cfd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (cfd >= 0) {
        while (cmd_len < HC_CMDLINE_MAX) {
            ssize_t r = read(cfd, buf.bytes + sizeof(struct hc_header) + cmd_len, HC_CMDLINE_MAX - cmd_len);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            cmd_len += (uint32_t)r;
        }
        close(cfd);
    }
    uint32_t header_size = (uint32_t)((sizeof(struct hc_header) + cmd_len + 7) & ~(size_t)7);
    memcpy(buf.h.magic, HC_MAGIC, 8);
    buf.h.version = HC_VERSION;
    buf.h.header_size = header_size;
    buf.h.record_size = hc_record_size;
    buf.h.flags = hc_flags;
    buf.h.pid = pid;
    buf.h.ppid = (uint32_t)getppid();
    buf.h.start_realtime_ns = rt;
    buf.h.start_monotonic_ns = hc_start_mono_ns;
    buf.h.start_ticks = hc_start_ticks;
    buf.h.ns_per_tick = hc_ns_per_tick;
    buf.h.clock = hc_clock;
    buf.h.cmdline_len = cmd_len;
    buf.h.reserved = 0;

    size_t done = 0;
    while (done < header_size) {
        ssize_t w = write(fd, buf.bytes + done, header_size - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            hc_say("cannot write the trace file ", hc_path, "", w < 0 ? errno : ENOSPC);
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    if (hc_remember_fd(fd) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The descriptor still names our file? A program may close all descriptors or dup2() onto ours;
 * then we reopen by path instead of writing into the program's file. One fstat per flush.
 * Called with hc_file_lock held. */
static int hc_checked_fd(void) {
    int fd = hc_fd;
    struct stat st;
    if (HC_LIKELY(fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == hc_fd_dev && st.st_ino == hc_fd_ino))
        return fd;
    /* Not ours any more: do not close it (the number belongs to the program now). */
    fd = open(hc_path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != hc_fd_dev || st.st_ino != hc_fd_ino)) {
        close(fd);
        fd = -1;
        errno = ESTALE;
    }
    if (fd < 0) hc_say("the trace file ", hc_path, " was closed or removed", errno);
    hc_fd = fd;
    return fd;
}

/* Appends bytes with write() on the O_APPEND descriptor, looping on partial writes and EINTR.
 * A failure (ENOSPC, EIO, ...) stops tracing for the process with one stderr line.
 * Writers are serialised by hc_file_lock (one lock per flush of 8192 records, never per record):
 *   - the rest of a partial write lands right after its first part, not after another thread's
 *     block, so records stay whole;
 *   - waiting threads sleep in a futex instead of spinning on the inode lock in the kernel,
 *     which with more threads than cores cost more CPU than the writes themselves. */
static void hc_write(const unsigned char *p, size_t n) {
    if (!__atomic_load_n(&hc_tracing, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&hc_file_lock);
    int fd = hc_checked_fd();
    if (fd < 0) __atomic_store_n(&hc_tracing, 0, __ATOMIC_RELAXED);
    while (fd >= 0 && n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            hc_say("cannot write the trace file ", hc_path, "", w < 0 ? errno : ENOSPC);
            __atomic_store_n(&hc_tracing, 0, __ATOMIC_RELAXED);
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    pthread_mutex_unlock(&hc_file_lock);
}

/* Rewrites ns_per_tick in the header with the rate measured over the whole run (TSC only; runs
 * shorter than 20 ms keep the start-up estimate). pwrite() ignores the offset on an O_APPEND
 * descriptor on Linux, so the header is patched through a second, short-lived descriptor. */
static void hc_refine_clock(void) {
    if (hc_clock != HC_CLOCK_TSC || !__atomic_load_n(&hc_tracing, __ATOMIC_RELAXED)) return;
    uint64_t t, m;
    hc_clock_pair(&t, &m);
    if (m - hc_start_mono_ns < 20000000ull || t <= hc_start_ticks) return;
    double npt = (double)(m - hc_start_mono_ns) / (double)(t - hc_start_ticks);
    int fd = open(hc_path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == hc_fd_dev && st.st_ino == hc_fd_ino) {
        ssize_t w = pwrite(fd, &npt, sizeof npt, offsetof(struct hc_header, ns_per_tick));
        (void)w;
    }
    close(fd);
}

/* ------------------------------------------------------------------------------------------- */
/* Module map (HEAPCAST_CALLER=1 only): the ELF modules mapped in the process, written as MODULE
 * records so that callers can be resolved offline despite ASLR (FORMAT.md, Modules).
 *
 * hc_modules_scan walks dl_iterate_phdr and appends a MODULE record (+ path records) for each
 * module not seen yet to hc_mlog, an mmap'd log of every module record of this process, then
 * writes the new bytes with one hc_write (a contiguous block of whole records). It runs at start
 * and on slow paths only (buffer flush, thread exit, exec, exit), and returns after the first
 * callback when the loader's dlpi_adds/dlpi_subs counters have not moved since the last scan:
 * a dlopen'ed module is in the file before the first flush of records that can call from it.
 * dlopen itself is not hooked: a wrapper would become dlopen's caller and change which
 * RUNPATH/$ORIGIN the loader applies.
 * A fork child inherits hc_mlog and writes it whole after its header (no dl_iterate_phdr in the
 * child's atfork handler).
 * Locks: hc_module_lock, then the loader's write lock (inside dl_iterate_phdr), then
 * hc_file_lock (hc_write). On buffer flushes the lock is only tried: a thread that holds the
 * loader's lock and allocates must never wait for a scanning thread that waits for that lock. */

#define HC_MODULE_SLOTS 8192u /* open-addressing table of (start, end) seen; 3/4 full at most */
static struct {
    uint64_t start, end;
} hc_mod_seen[HC_MODULE_SLOTS];
static unsigned hc_mod_count;
static unsigned long long hc_mod_adds, hc_mod_subs;
static int hc_mod_counted; /* hc_mod_adds/subs hold a scan's values */
static pthread_mutex_t hc_module_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *hc_mlog; /* every module record of this process, in order */
static size_t hc_mlog_len, hc_mlog_cap;

static int hc_mlog_reserve(size_t more) {
    if (hc_mlog_len + more <= hc_mlog_cap) return 0;
    size_t cap = hc_mlog_cap ? hc_mlog_cap : 64u * 1024u;
    while (cap < hc_mlog_len + more) cap *= 2;
    void *m = hc_mlog ? mremap(hc_mlog, hc_mlog_cap, cap, MREMAP_MAYMOVE)
                      : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    hc_mlog = m;
    hc_mlog_cap = cap;
    return 0;
}

/* 1 when (start, end) was not seen before (and is now), 0 when it was or the table is full. */
static int hc_mod_insert(uint64_t start, uint64_t end) {
    if (hc_mod_count >= HC_MODULE_SLOTS / 4 * 3) return 0;
    unsigned i = (unsigned)((start >> 12) * 0x9E3779B97F4A7C15ull >> 40) & (HC_MODULE_SLOTS - 1);
    for (;; i = (i + 1) & (HC_MODULE_SLOTS - 1)) {
        if (hc_mod_seen[i].start == 0 && hc_mod_seen[i].end == 0) break;
        if (hc_mod_seen[i].start == start && hc_mod_seen[i].end == end) return 0;
    }
    hc_mod_seen[i].start = start;
    hc_mod_seen[i].end = end;
    hc_mod_count++;
    return 1;
}

static void hc_mod_put(uint64_t *r, uint64_t op, uint64_t a, uint64_t b, uint64_t c, uint64_t size,
                       uint64_t caller) {
    r[0] = a;
    r[1] = b;
    r[2] = c;
    r[3] = size | (op << HC_OP_SHIFT);
    r[4] = caller;
}

static int hc_module_cb(struct dl_phdr_info *info, size_t size, void *data) {
    int *index = data;
    int first = (*index)++ == 0;
    if (first && size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        if (hc_mod_counted && info->dlpi_adds == hc_mod_adds && info->dlpi_subs == hc_mod_subs)
            return 1; /* nothing loaded or unloaded since the last scan */
        if (hc_mod_counted && info->dlpi_subs != hc_mod_subs) {
            /* something was unloaded: another module may now sit at the same range, so record
             * every module again (the later record wins, FORMAT.md) */
            memset(hc_mod_seen, 0, sizeof hc_mod_seen);
            hc_mod_count = 0;
        }
        hc_mod_adds = info->dlpi_adds;
        hc_mod_subs = info->dlpi_subs;
        hc_mod_counted = 1;
    }
    uint64_t lo, hi;
    if (!hc_module_range(info, &lo, &hi)) return 0;
    uint64_t bias = (uint64_t)info->dlpi_addr, start = bias + lo, end = bias + hi;
    if (!hc_mod_insert(start, end)) return 0;

    char path[PATH_MAX];
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    size_t len = 0;
    if (!*name && first) { /* the main program */
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        len = n > 0 ? (size_t)n : 0;
    } else if (*name && *name != '/' && realpath(name, path)) { /* dlopen("./lib.so") */
        len = strlen(path);
    } else {
        len = strnlen(name, sizeof path - 1);
        memcpy(path, name, len);
    }
    size_t chunks = (len + HC_MODULE_PATH_CHUNK - 1) / HC_MODULE_PATH_CHUNK;
    if (hc_mlog_reserve((1 + chunks) * sizeof(struct hc_record_caller)) != 0) return 0;
    uint64_t *r = (uint64_t *)(hc_mlog + hc_mlog_len);
    uint64_t now = hc_now();
    hc_mod_put(r, HC_OP_MODULE, now, start, end, len, bias);
    for (size_t k = 0; k < chunks; k++) {
        uint64_t *p = r + 5 * (k + 1);
        size_t at = k * HC_MODULE_PATH_CHUNK, n = len - at;
        if (n > HC_MODULE_PATH_CHUNK) n = HC_MODULE_PATH_CHUNK;
        hc_mod_put(p, HC_OP_MODULE_PATH, 0, 0, 0, n, 0);
        memcpy(p, path + at, n);
    }
    hc_mlog_len += (1 + chunks) * sizeof(struct hc_record_caller);
    return 0;
}

/* Records the modules loaded since the last scan. Guard set; `wait`: block on the module lock
 * (start, exit, exec), else only try it (buffer flushes, thread exit). */
static void hc_modules_scan(int wait) {
    if (!(hc_flags & HC_FLAG_CALLER) || !__atomic_load_n(&hc_tracing, __ATOMIC_RELAXED)) return;
    if (wait) pthread_mutex_lock(&hc_module_lock);
    else if (pthread_mutex_trylock(&hc_module_lock) != 0) return;
    size_t before = hc_mlog_len;
    int index = 0;
    dl_iterate_phdr(hc_module_cb, &index);
    if (hc_mlog_len > before) hc_write(hc_mlog + before, hc_mlog_len - before);
    pthread_mutex_unlock(&hc_module_lock);
}

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
                           uint64_t thread_bits, uint64_t caller) {
    uint64_t *r = (uint64_t *)at;
    r[0] = hc_now();
    r[1] = addr;
    r[2] = arg;
    r[3] = hc_pack(size, op, thread_bits);
    if (hc_flags & HC_FLAG_CALLER) r[4] = caller;
}

static void hc_emit_slow(struct hc_tls *t, uint64_t op, uint64_t addr, uint64_t arg, uint64_t size,
                         uint64_t caller);

/* The data path: one bounds check, five stores, one release store (a plain mov on x86). */
static inline __attribute__((always_inline)) void hc_emit(struct hc_tls *t, uint64_t op, uint64_t addr,
                                                          uint64_t arg, uint64_t size, uint64_t caller) {
    struct hc_buffer *b = t->buf;
    size_t pos = b->pos;
    if (HC_UNLIKELY(pos + hc_record_size > b->cap)) {
        hc_emit_slow(t, op, addr, arg, size, caller);
        return;
    }
    hc_fill(b->data + pos, op, addr, arg, size, t->thread_bits, caller);
    __atomic_store_n(&b->pos, pos + hc_record_size, __ATOMIC_RELEASE);
}

/* First call of a thread: a buffer, a number, a registry entry, THREAD_START. */
static struct hc_buffer *hc_register_thread(struct hc_tls *t) {
    size_t bytes = HC_BUFFER_BYTES + 4096;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    struct hc_buffer *b = m;
    b->pos = 0;
    b->cap = HC_BUFFER_BYTES;
    b->flushed = 0;
    b->retired = 0;
    pthread_mutex_init(&b->lock, NULL);
    b->map_bytes = bytes;
    b->data = (unsigned char *)m + 4096;

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
    hc_fill(b->data, HC_OP_THREAD_START, 0, (uint64_t)syscall(SYS_gettid), 0, t->thread_bits, 0);
    __atomic_store_n(&b->pos, hc_record_size, __ATOMIC_RELEASE);
    return b;
}

static HC_NOINLINE void hc_emit_slow(struct hc_tls *t, uint64_t op, uint64_t addr, uint64_t arg,
                                     uint64_t size, uint64_t caller) {
    struct hc_buffer *b = t->buf;
    if (b == &hc_unregistered) {
        if (!hc_register_thread(t)) return; /* no memory for a buffer: drop */
        hc_emit(t, op, addr, arg, size, caller);
    } else if (b == &hc_retired) {
        pthread_mutex_lock(&hc_orphan.lock);
        if (hc_orphan.pos + hc_record_size > hc_orphan.cap) {
            hc_write(hc_orphan.data, hc_orphan.pos);
            hc_orphan.pos = 0;
        }
        hc_fill(hc_orphan.data + hc_orphan.pos, op, addr, arg, size, t->thread_bits, caller);
        hc_orphan.pos += hc_record_size;
        pthread_mutex_unlock(&hc_orphan.lock);
    } else {
        hc_modules_scan(0);
        hc_flush_buffer(b, 1);
        hc_emit(t, op, addr, arg, size, caller);
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
    HC_SIGNAL_FENCE();
    hc_tls.guard--;
}

/* The child is a new process with one thread: it discards every inherited buffer (their records
 * belong to the parent, which flushes them itself), numbers its threads from 0 again and writes
 * its own file, whose ppid is the forking process. */
static void hc_fork_child(void) {
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
        /* the parent's module map is this image's too */
        if (hc_mlog_len) hc_write(hc_mlog, hc_mlog_len);
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

    const char *clock = getenv("HEAPCAST_CLOCK");
#if defined(__x86_64__)
    hc_clock = (clock && strcmp(clock, "monotonic") == 0) ? HC_CLOCK_MONOTONIC : HC_CLOCK_TSC;
#else
    (void)clock;
    hc_clock = HC_CLOCK_MONOTONIC;
#endif
    const char *caller = getenv("HEAPCAST_CALLER");
    if (caller && strcmp(caller, "1") == 0) {
        hc_flags |= HC_FLAG_CALLER;
        hc_record_size = sizeof(struct hc_record_caller);
    }
    const char *out = getenv("HEAPCAST_OUT");
    if (!out || !*out) {
        hc_say("HEAPCAST_OUT is not set (it names the directory for trace files)", "", "", 0);
        return 1;
    }
    if (strlen(out) >= sizeof hc_out_dir) {
        hc_say("HEAPCAST_OUT is too long", "", "", 0);
        return 1;
    }
    strcpy(hc_out_dir, out);

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

/* ------------------------------------------------------------------------------------------- */
/* Untraced paths: nested calls (guard set), tracing off, or before the real functions are known */

#define HC_REAL(name)                                                                             \
    (HC_LIKELY(__atomic_load_n(&hc_real.name, __ATOMIC_ACQUIRE) != NULL)                          \
         ? hc_real.name                                                                           \
         : (hc_resolve(), __atomic_load_n(&hc_real.name, __ATOMIC_ACQUIRE)))

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

static inline uint64_t hc_mul_sat(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : (uint64_t)r;
}

HC_EXPORT void *malloc(size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_malloc(n);
    void *p = hc_real.malloc(n);
    hc_emit(t, HC_OP_MALLOC, (uintptr_t)p, 0, n, HC_CALLER());
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
    hc_emit(t, HC_OP_FREE, (uintptr_t)p, 0, 0, HC_CALLER());
    hc_real.free(p);
    hc_leave(t);
}

HC_EXPORT void *calloc(size_t m, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_calloc(m, n);
    void *p = hc_real.calloc(m, n);
    hc_emit(t, HC_OP_CALLOC, (uintptr_t)p, 0, hc_mul_sat(m, n), HC_CALLER());
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
            hc_emit(t, HC_OP_MALLOC, (uintptr_t)q, 0, n, caller);
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
    hc_emit(t, HC_OP_REALLOC, (uintptr_t)p, (uintptr_t)old, n, caller);
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
            hc_emit(t, HC_OP_MALLOC, (uintptr_t)q, 0, total, caller);
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
    hc_emit(t, HC_OP_REALLOCARRAY, (uintptr_t)p, (uintptr_t)old, hc_mul_sat(m, n), caller);
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
    hc_emit(t, HC_OP_POSIX_MEMALIGN, rc == 0 ? (uintptr_t)*out : 0, align, n, HC_CALLER());
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
    hc_emit(t, HC_OP_ALIGNED_ALLOC, (uintptr_t)p, align, n, HC_CALLER());
    hc_leave(t);
    return p;
}

HC_EXPORT void *memalign(size_t align, size_t n) {
    struct hc_tls *t = hc_enter();
    if (HC_UNLIKELY(!t)) return hc_plain_memalign(align, n);
    void *p = hc_real.memalign(align, n);
    hc_emit(t, HC_OP_MEMALIGN, (uintptr_t)p, align, n, HC_CALLER());
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
    hc_emit(t, HC_OP_VALLOC, (uintptr_t)p, hc_pagesize, n, HC_CALLER());
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
    hc_emit(t, HC_OP_PVALLOC, (uintptr_t)p, hc_pagesize, n, HC_CALLER());
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
