/* Benchmark workload for the allocator layer: THREADS threads, each ITERS malloc(SIZE)/free
 * pairs in a tight loop (the block written once, so it is used). Prints
 * "ns_per_pair=X" from the threads' own CPU time (CLOCK_THREAD_CPUTIME_ID, summed over threads,
 * divided by all pairs): time spent waiting for a core on a shared machine is not counted.
 * Usage: pairloop THREADS ITERS SIZE. THREADS 0: the loop runs in main, and the process never
 * starts a thread (glibc's malloc, and heapcast's layer, take no locks then). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long iters;
static size_t size;

static void *work(void *arg) {
    double *ns = arg;
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < iters; i++) {
        char *p = malloc(size);
        if (!p) exit(3);
        p[0] = (char)i;
        free(p);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    *ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int threads = atoi(argv[1]);
    iters = atol(argv[2]);
    size = (size_t)strtoull(argv[3], NULL, 10);
    if (threads < 0 || threads > 64) return 2;
    pthread_t th[64];
    double ns[64];
    if (threads == 0) {
        work(&ns[0]);
        printf("ns_per_pair=%.3f\n", ns[0] / (double)iters);
        return 0;
    }
    for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, work, &ns[t]);
    double total = 0;
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL), total += ns[t];
    printf("ns_per_pair=%.3f\n", total / ((double)threads * (double)iters));
    return 0;
}
