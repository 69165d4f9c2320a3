/* hc-probe: which malloc a process really runs with, written down by the process itself.
 *
 * Preloaded beside the allocator under test (LD_PRELOAD=.../libhcprobe.so:<allocator>) with
 * HEAPCAST_PROBE_OUT naming a file. Each process image that loads it appends one line when it
 * starts and one when it exits normally (tab-separated key=value; read by
 * tasks/replay/runners/preload.py):
 *
 *   start  pid ppid secure exe malloc env.<knob>... jemalloc.opt.<name>... tcmalloc.release_rate
 *          mimalloc.version
 *   exit   pid forked cpu_ns cpu_ns_before
 *
 * `malloc` is the file that defines the malloc the program's calls bind to (malloc_file): the
 * preloaded library when the preload took, libc.so.6 when it did not, the program itself when it
 * carries its own allocator. The jemalloc/tcmalloc/mimalloc fields are
 * the allocator's own answers (mallctl "opt.*", the release rate, mi_version), so a knob is seen
 * in force, not only set. `cpu_ns` is the CPU time this image used (all its threads) from the
 * probe's start, and `cpu_ns_before` what the process had used before it (the loader's work:
 * mapping and relocating the image's libraries, the preloaded ones among them; and an earlier
 * image of the same process, which exec'd this one and so wrote no exit line; 0 in a forked
 * child, whose clock starts at the fork), so the reader can tell how much of the program's work
 * ran with the library: a short process is mostly its loader's work, which the reader
 * (tasks/replay/runners/preload.py) counts as the program's (docs/changelog.md, "the figures in
 * native/'s comments"). A process that is statically linked, setuid, or started by a parent that
 * cleared its environment never loads the probe and leaves no line.
 *
 *   mallopt pid mallopt.<param>        (the program fixed one of glibc's knobs itself)
 *
 * A knob set in the environment holds only until the program sets the same one by mallopt:
 * TensorFlow's generator dataset fixes M_MMAP_THRESHOLD at 128 KiB on Python 3.11, and a
 * GLIBC_TUNABLES mmap_threshold measured there would be measured under a wrong name. So the
 * probe passes mallopt on (to the next definition: the allocator's, or glibc's) and writes a
 * `mallopt` line for each call on a parameter a glibc knob sets; calls made before the probe's
 * constructor are written with its start line.
 *
 * Held to an allocator's standard, since it runs inside other programs: one interposed symbol,
 * mallopt, which only passes the call on after noting it; no allocation of its own, one
 * write(2) per line on an O_APPEND descriptor (lines of several processes never interleave),
 * errors ignored (the program's output and exit code never change), nothing written without
 * HEAPCAST_PROBE_OUT.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 4000

static char out_path[1024];
static pid_t start_pid;
static long long start_cpu_ns;

/* The environment variables that choose or tune an allocator, recorded as the process saw them. */
static const char *const KNOBS[] = {
    "GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "MALLOC_CONF", "TCMALLOC_RELEASE_RATE",
    "MIMALLOC_ARENA_EAGER_COMMIT", "MIMALLOC_PURGE_DELAY", "HEAPCAST_LAYER", /* heapcast's layer */
};

struct line {
    char buf[LINE_MAX_BYTES];
    size_t n;
};

/* A new line of this kind (start, exit, mallopt): its first field. */
static void begin(struct line *l, const char *kind) {
    l->n = strlen(kind);
    memcpy(l->buf, kind, l->n);
}

/* Append "\tkey=value", tabs and newlines in the value replaced, silently cut at the buffer. */
static void add(struct line *l, const char *key, const char *value) {
    size_t room = sizeof(l->buf) - 2 - l->n; /* keep space for "\n" */
    int k = snprintf(l->buf + l->n, room, "\t%s=", key);
    if (k < 0 || (size_t)k >= room) return;
    l->n += (size_t)k;
    for (const char *p = value; *p && l->n < sizeof(l->buf) - 2; p++)
        l->buf[l->n++] = (*p == '\t' || *p == '\n') ? ' ' : *p;
}

static void add_num(struct line *l, const char *key, long long v) {
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    add(l, key, num);
}

static void emit(struct line *l) {
    l->buf[l->n++] = '\n';
    int fd = open(out_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return;
    ssize_t w;
    do {
        w = write(fd, l->buf, l->n);
    } while (w < 0 && errno == EINTR);
    close(fd);
}

static long long cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* jemalloc: the options in force, from its own mallctl. */
static void jemalloc_opts(struct line *l) {
    int (*mallctl)(const char *, void *, size_t *, void *, size_t) =
        (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
    if (!mallctl) return;
    bool b;
    size_t sz = sizeof b;
    if (mallctl("opt.background_thread", &b, &sz, NULL, 0) == 0)
        add_num(l, "jemalloc.opt.background_thread", b);
    ssize_t ms;
    sz = sizeof ms;
    if (mallctl("opt.dirty_decay_ms", &ms, &sz, NULL, 0) == 0)
        add_num(l, "jemalloc.opt.dirty_decay_ms", (long long)ms);
    sz = sizeof ms;
    if (mallctl("opt.muzzy_decay_ms", &ms, &sz, NULL, 0) == 0)
        add_num(l, "jemalloc.opt.muzzy_decay_ms", (long long)ms);
    unsigned narenas;
    sz = sizeof narenas;
    if (mallctl("opt.narenas", &narenas, &sz, NULL, 0) == 0)
        add_num(l, "jemalloc.opt.narenas", narenas);
}

/* gperftools' tcmalloc: the release rate in force, from MallocExtension (no C entry point for
 * it: the C++ member is called with the instance as `this`, the Itanium ABI). */
static void tcmalloc_opts(struct line *l) {
    void *(*instance)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "_ZN15MallocExtension8instanceEv");
    double (*rate)(void *) =
        (double (*)(void *))dlsym(RTLD_DEFAULT, "_ZN22TCMallocImplementation20GetMemoryReleaseRateEv");
    if (!instance || !rate) return;
    void *ext = instance();
    if (!ext) return;
    char num[48];
    snprintf(num, sizeof num, "%.6g", rate(ext));
    add(l, "tcmalloc.release_rate", num);
}

/* The file whose malloc the program's calls bind to. The global lookup first; where it lands on
 * no definition named malloc (an executable's PLT entry made the canonical address: Debian's
 * python3) or on the tracer (which forwards), the next definition after this probe, which comes
 * before the allocator in LD_PRELOAD. */
static const char *malloc_file(void) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    if (m && dladdr1(m, &info, (void **)&sym, RTLD_DL_SYMENT) && info.dli_fname && sym &&
        sym->st_shndx != SHN_UNDEF && !strstr(info.dli_fname, "libheapcast"))
        return info.dli_fname;
    m = dlsym(RTLD_NEXT, "malloc");
    if (m && dladdr(m, &info) && info.dli_fname) return info.dli_fname;
    return "?";
}

static void mimalloc_opts(struct line *l) {
    int (*version)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "mi_version");
    if (version) add_num(l, "mimalloc.version", version());
}

/* glibc's mallopt parameters that a knob of the environment also sets (GLIBC_TUNABLES
 * glibc.malloc.<name>, MALLOC_<NAME>_): the names tasks/replay/runners/preload.py compares. */
static const struct {
    int param;
    const char *key;
} MALLOPT_KNOBS[] = {
    {M_TRIM_THRESHOLD, "mallopt.trim_threshold"}, {M_TOP_PAD, "mallopt.top_pad"},
    {M_MMAP_THRESHOLD, "mallopt.mmap_threshold"}, {M_MMAP_MAX, "mallopt.mmap_max"},
    {M_ARENA_TEST, "mallopt.arena_test"},         {M_ARENA_MAX, "mallopt.arena_max"},
};
#define N_MALLOPT_KNOBS (sizeof MALLOPT_KNOBS / sizeof MALLOPT_KNOBS[0])
/* calls before the constructor knew where to write: per knob, set (1) and its last value */
static int early_set[N_MALLOPT_KNOBS];
static int early_value[N_MALLOPT_KNOBS];
/* the value of each knob's last line, so that a program repeating a call writes one line */
static int written_set[N_MALLOPT_KNOBS];
static int written_value[N_MALLOPT_KNOBS];

static void add_early_mallopts(struct line *l) {
    for (size_t i = 0; i < N_MALLOPT_KNOBS; i++)
        if (__atomic_load_n(&early_set[i], __ATOMIC_ACQUIRE))
            add_num(l, MALLOPT_KNOBS[i].key, __atomic_load_n(&early_value[i], __ATOMIC_RELAXED));
}

__attribute__((visibility("default"))) int mallopt(int param, int value) {
    static int (*next)(int, int);
    int (*f)(int, int) = __atomic_load_n(&next, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (int (*)(int, int))dlsym(RTLD_NEXT, "mallopt");
        __atomic_store_n(&next, f, __ATOMIC_RELEASE);
    }
    for (size_t i = 0; i < N_MALLOPT_KNOBS; i++) {
        if (MALLOPT_KNOBS[i].param != param) continue;
        if (out_path[0]) {
            if (__atomic_load_n(&written_set[i], __ATOMIC_ACQUIRE) &&
                __atomic_load_n(&written_value[i], __ATOMIC_RELAXED) == value)
                continue;
            __atomic_store_n(&written_value[i], value, __ATOMIC_RELAXED);
            __atomic_store_n(&written_set[i], 1, __ATOMIC_RELEASE);
            struct line l;
            begin(&l, "mallopt");
            add_num(&l, "pid", getpid());
            add_num(&l, MALLOPT_KNOBS[i].key, value);
            emit(&l);
        } else {
            __atomic_store_n(&early_value[i], value, __ATOMIC_RELAXED);
            __atomic_store_n(&early_set[i], 1, __ATOMIC_RELEASE);
        }
    }
    return f ? f(param, value) : 0;
}

__attribute__((constructor)) static void probe_start(void) {
    const char *out = getenv("HEAPCAST_PROBE_OUT");
    if (!out || !*out || strlen(out) >= sizeof out_path) return;
    memcpy(out_path, out, strlen(out) + 1);
    start_pid = getpid();
    start_cpu_ns = cpu_ns();
    struct line l;
    begin(&l, "start");
    add_num(&l, "pid", start_pid);
    add_num(&l, "ppid", getppid());
    add_num(&l, "secure", (long long)getauxval(AT_SECURE));
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    add(&l, "exe", exe);
    add(&l, "malloc", malloc_file());
    for (size_t i = 0; i < sizeof KNOBS / sizeof KNOBS[0]; i++) {
        const char *v = getenv(KNOBS[i]);
        if (v) {
            char key[64];
            snprintf(key, sizeof key, "env.%s", KNOBS[i]);
            add(&l, key, v);
        }
    }
    jemalloc_opts(&l);
    tcmalloc_opts(&l);
    mimalloc_opts(&l);
    add_early_mallopts(&l);
    emit(&l);
}

__attribute__((destructor)) static void probe_exit(void) {
    if (!out_path[0]) return;
    struct line l;
    begin(&l, "exit");
    pid_t pid = getpid();
    /* a forked child (no exec) runs this image too; its CPU clock started at 0 at the fork */
    bool forked = pid != start_pid;
    long long now = cpu_ns();
    add_num(&l, "pid", pid);
    add_num(&l, "forked", forked);
    add_num(&l, "cpu_ns", now < 0 ? -1 : now - (forked ? 0 : start_cpu_ns));
    add_num(&l, "cpu_ns_before", forked || start_cpu_ns < 0 ? 0 : start_cpu_ns);
    emit(&l);
}
