/* hc-measure: run a program, wait for it, and write what it cost.
 *
 *   hc-measure [--cgroup] REPORT STDOUT -- PROGRAM [ARG...]
 *
 * Runs PROGRAM with its standard output in the file STDOUT (standard error is left alone), waits
 * for it with wait4, and writes REPORT: `key=value` lines (tasks/replay/runners/measure_tool.py
 * reads them). Exits with the program's exit code (128 + the signal when a signal killed it), so
 * the runner sees the program's status.
 *
 * Built statically on purpose: the runner sets LD_PRELOAD (an allocator, the tracer) in the
 * environment, and a static binary is never preloaded, so only PROGRAM and its children load them,
 * and this helper's own few allocations never go through the allocator being measured.
 *
 * With --cgroup (inside a container, where it is PID 1 and the cgroup is the container's own,
 * still alive when the program has ended) it also reads the cgroup's peak memory (v2 memory.peak,
 * else v1 memory.max_usage_in_bytes) and fault counters, for the whole container. Without it (a
 * host sandbox, whose cgroup is shared with everything else) only rusage is reported.
 * The rusage figures are the program's tree (every descendant that was waited for); measured
 * here rather than by the runner's own wait4, because a child forked from a large process (the
 * Python runner) starts with that process's RSS as its ru_maxrss, and a PID-namespace sandbox
 * (bubblewrap) does not pass its children's usage up to its parent.
 * While the program runs it samples its memory every HC_SAMPLE_MS and reports the time-weighted
 * mean: with --cgroup the cgroup's (v2 memory.current, else v1 memory.usage_in_bytes:
 * `cgroup_mean_bytes`), else the program's own process's resident set (/proc/PID/statm, its
 * children not counted: `process_mean_bytes`). That is the memory a program holds over its run,
 * which falls when a burst's freed pages go back to the system though its peak does not (what
 * placement buys, docs/allocators.md). It waits on the child's pidfd with poll(2) between
 * samples, so the program's end is seen at once and its wall time is not rounded up to a sample.
 * Where pidfd_open is refused (a kernel before 5.3, a seccomp filter), one blocking waitpid and
 * no mean.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (ok) *out = (uint64_t)v;
    return ok;
}

/* The value of `key` in a "key value" per line file (memory.stat, cpu.stat). */
static int read_keyed(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char name[128];
    unsigned long long v;
    int found = 0;
    while (fscanf(f, "%127s %llu", name, &v) == 2) {
        if (strcmp(name, key) == 0) {
            *out = (uint64_t)v;
            found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

static double seconds(struct timeval tv) { return (double)tv.tv_sec + tv.tv_usec / 1e6; }

#define HC_SAMPLE_MS 10

static int64_t ns_between(struct timespec a, struct timespec b) {
    return (int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
}

/* The cgroup's memory now, in bytes; 0 where neither file reads. */
static uint64_t cgroup_current(void) {
    uint64_t v = 0;
    if (!read_u64("/sys/fs/cgroup/memory.current", &v))
        read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &v);
    return v;
}

/* The resident set of process `pid` now (/proc/PID/statm's second field), in bytes; 0 where it
 * cannot be read (the process gone). */
static uint64_t process_resident(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    int ok = fscanf(f, "%llu %llu", &size, &resident) == 2;
    fclose(f);
    return ok ? (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

/* What a sample reads: the cgroup's memory (--cgroup: the container's, every process of it), or
 * the program's own process's resident set (its children not counted). */
static uint64_t memory_now(int cgroup, pid_t pid) {
    return cgroup ? cgroup_current() : process_resident(pid);
}

/* The memory samples of one run: each held until the next (or the program's end). */
struct sampled {
    long double byte_ns; /* sum of bytes x the nanoseconds each sample stood for */
    int64_t ns;          /* the time the samples cover */
    long n;
};

/* Wait for pid, sampling its memory (memory_now) every HC_SAMPLE_MS; 1 with *status set and
 * the samples in *m, 0 where its pidfd cannot be had (the caller then waits as before). */
static int wait_sampling(int cgroup, pid_t pid, int *status, struct sampled *m) {
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return 0;
    struct timespec last, now;
    clock_gettime(CLOCK_MONOTONIC, &last);
    uint64_t held = memory_now(cgroup, pid);
    m->n = 1;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ready = poll(&p, 1, HC_SAMPLE_MS);
        if (ready < 0 && errno != EINTR) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t dt = ns_between(last, now);
        m->byte_ns += (long double)held * dt;
        m->ns += dt;
        last = now;
        if (ready > 0) break; /* the child has ended */
        held = memory_now(cgroup, pid);
        m->n++;
    }
    close(fd);
    while (waitpid(pid, status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "hc-measure: waitpid: %s\n", strerror(errno));
            exit(125);
        }
    }
    return 1;
#else
    (void)cgroup, (void)pid, (void)status, (void)m;
    return 0;
#endif
}

int main(int argc, char **argv) {
    int cgroup = argc > 1 && strcmp(argv[1], "--cgroup") == 0;
    if (cgroup) {
        argv++;
        argc--;
    }
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: hc-measure [--cgroup] REPORT STDOUT -- PROGRAM [ARG...]\n");
        return 125;
    }
    const char *report = argv[1];
    int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        fprintf(stderr, "hc-measure: cannot open %s: %s\n", argv[2], strerror(errno));
        return 125;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "hc-measure: fork: %s\n", strerror(errno));
        return 125;
    }
    if (pid == 0) {
        if (dup2(out, STDOUT_FILENO) < 0) _exit(126);
        execvp(argv[4], argv + 4);
        fprintf(stderr, "hc-measure: cannot run %s: %s\n", argv[4], strerror(errno));
        _exit(127);
    }
    close(out);
    int status = 0;
    struct sampled mem = {0};
    int sampled = wait_sampling(cgroup, pid, &status, &mem);
    while (!sampled && waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "hc-measure: waitpid: %s\n", strerror(errno));
            return 125;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* As PID 1 this process inherits orphans; reap those already gone so their usage counts. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    FILE *r = fopen(report, "w");
    if (!r) {
        fprintf(stderr, "hc-measure: cannot write %s: %s\n", report, strerror(errno));
        return code;
    }
    int64_t wall_ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
    fprintf(r, "exit_code=%d\n", code);
    fprintf(r, "wall_ns=%" PRId64 "\n", wall_ns);
    fprintf(r, "user_s=%.6f\n", seconds(ru.ru_utime));
    fprintf(r, "sys_s=%.6f\n", seconds(ru.ru_stime));
    fprintf(r, "maxrss_kb=%ld\n", ru.ru_maxrss);
    fprintf(r, "minflt=%ld\n", ru.ru_minflt);
    fprintf(r, "majflt=%ld\n", ru.ru_majflt);
    if (sampled && mem.ns > 0) { /* what memory_now read: cgroup_mean_*, process_mean_* */
        const char *of = cgroup ? "cgroup" : "process";
        fprintf(r, "%s_mean_bytes=%" PRIu64 "\n%s_mean_samples=%ld\n", of,
                (uint64_t)(mem.byte_ns / mem.ns), of, mem.n);
    }
    uint64_t v;
    if (!cgroup) {
        fclose(r);
        return code;
    }
    if (read_u64("/sys/fs/cgroup/memory.peak", &v)) {
        fprintf(r, "cgroup_peak_bytes=%" PRIu64 "\ncgroup_peak_source=cgroup-v2 memory.peak\n", v);
    } else if (read_u64("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", &v)) {
        fprintf(r,
                "cgroup_peak_bytes=%" PRIu64
                "\ncgroup_peak_source=cgroup-v1 memory.max_usage_in_bytes\n",
                v);
    }
    if (read_keyed("/sys/fs/cgroup/memory.stat", "pgfault", &v) ||
        read_keyed("/sys/fs/cgroup/memory/memory.stat", "total_pgfault", &v))
        fprintf(r, "cgroup_pgfault=%" PRIu64 "\n", v);
    if (read_keyed("/sys/fs/cgroup/memory.stat", "pgmajfault", &v) ||
        read_keyed("/sys/fs/cgroup/memory/memory.stat", "total_pgmajfault", &v))
        fprintf(r, "cgroup_pgmajfault=%" PRIu64 "\n", v);
    fclose(r);
    return code;
}
