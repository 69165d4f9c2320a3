/* Part of heapcast.c (one translation unit; never compiled alone): the writer's clock and file.
 * The record clock (TSC or CLOCK_MONOTONIC) and its calibration, the one stderr line, the trace
 * file (its name, its header: FORMAT.md), the checked descriptor, the serialised write, and the
 * clock rate patched into the header at exit. */

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
    char *end = line + sizeof line, *p = line;
    char *parts_end = end - 128; /* room kept for the error and the tail */
    p = hc_text(p, parts_end, "heapcast: ");
    p = hc_text(p, parts_end, a);
    p = hc_text(p, parts_end, b);
    p = hc_text(p, parts_end, c);
    if (err) {
        const char *e = strerrordesc_np(err);
        p = hc_text(hc_text(p, parts_end, ": "), end - 2, e ? e : "error");
    }
    p = hc_text(p, end, "; the program runs untraced\n");
    hc_write_all(2, line, (size_t)(p - line));
}

/* ------------------------------------------------------------------------------------------- */
/* The trace file                                                                                */

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
        char *p = hc_path, *end = hc_path + sizeof hc_path;
        memcpy(p, hc_out_dir, dl);
        p += dl;
        if (dl && p[-1] != '/') *p++ = '/';
        p = hc_text_u64(p, end, pid);
        *p++ = '-';
        p = hc_text_u64(p, end, rt);
        if (k) {
            *p++ = '-';
            p = hc_text_u64(p, end, k);
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
