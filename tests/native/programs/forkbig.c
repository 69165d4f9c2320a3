/* fork while another thread works on large blocks: a layer must hold its lock across fork
 * (pthread_atfork), or a child forked while the other thread held it waits forever on its first
 * large block. The child also reuses what the parent's cache held (its own copy).
 * usage: forkbig FORKS SIZE. Each child allocates, writes and checks two blocks of SIZE, exits
 * with 0 on success; the parent prints "forks=N ok=N checksum=C" and exits 0 if all were ok. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t size;
static volatile int stop;

static void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        char *p = malloc(size), *q = malloc(size + 4096);
        if (!p || !q) exit(3);
        p[0] = 1, q[size] = 2;
        free(p);
        free(q);
    }
    return NULL;
}

static int child_work(int k) {
    unsigned char *a = malloc(size), *b = calloc(1, size);
    if (!a || !b) return 3;
    for (size_t j = 0; j < size; j += 4096) {
        if (b[j]) return 4;
        a[j] = (unsigned char)(k + j / 4096);
    }
    uint64_t s = 0;
    for (size_t j = 0; j < size; j += 4096) s += a[j];
    free(a);
    free(b);
    return s == 0 ? 5 : 0;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 20;
    size = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 300000;
    /* something in the cache before the first fork */
    for (int i = 0; i < 4; i++) free(malloc(size + (size_t)i * 8192));
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    int ok = 0;
    uint64_t checksum = 0;
    for (int k = 0; k < forks; k++) {
        pid_t pid = fork();
        if (pid == 0) _exit(child_work(k));
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        checksum += (uint64_t)k * 7;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("forks=%d ok=%d checksum=%llu\n", forks, ok, (unsigned long long)checksum);
    return ok == forks ? 0 : 1;
}
