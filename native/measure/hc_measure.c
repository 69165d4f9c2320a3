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
 * No polling and no sleeping: one blocking waitpid, then a few small file reads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
    while (waitpid(pid, &status, 0) < 0) {
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
