/* The floor of any rule that needs the whole process's cache at every large call (the layer's
 * largest: "the n largest freed blocks in the process"): THREADS threads, each ITERS "pairs" of
 * two holds of ONE lock shared by all threads (a malloc's hold and a free's), each hold one
 * increment of shared data, and no allocation at all. The lock is the layer's own kind
 * (native/layers/layer.c, struct hl_spin): a test-and-set word given back with a release store,
 * waiters spin 100 pauses, then yield their core. PRIVATE 1: each thread its own lock and data
 * (what a sharded rule pays). Prints "ns_per_pair=X" from the threads' own CPU time, as
 * pairloop.c does (summed over threads, divided by all pairs).
 * Usage: lockfloor THREADS ITERS PRIVATE */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct lock_and_data {
    int w;
    long data[2];
} __attribute__((aligned(64)));

static struct lock_and_data shared;
static long iters;
static int private_;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int try_take(int *w) {
    int free_ = 0;
    return __atomic_compare_exchange_n(w, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void take(int *w) {
    if (try_take(w)) return;
    for (unsigned i = 0;; i++) {
        if (i < 100) relax();
        else sched_yield();
        if (__atomic_load_n(w, __ATOMIC_RELAXED) == 0 && try_take(w)) return;
    }
}

static inline void give(int *w) { __atomic_store_n(w, 0, __ATOMIC_RELEASE); }

static void *work(void *arg) {
    double *ns = arg;
    static __thread struct lock_and_data mine;
    struct lock_and_data *l = private_ ? &mine : &shared;
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < iters; i++) {
        take(&l->w);
        l->data[0]++;
        give(&l->w);
        take(&l->w);
        l->data[1]++;
        give(&l->w);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    *ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: lockfloor THREADS ITERS PRIVATE\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    iters = atol(argv[2]);
    private_ = atoi(argv[3]);
    if (threads < 1 || threads > 256 || iters < 1) {
        fprintf(stderr, "lockfloor: THREADS 1..256, ITERS >= 1\n");
        return 2;
    }
    pthread_t th[256];
    double ns[256];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, work, &ns[i]) != 0) return 3;
    double sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        sum += ns[i];
    }
    printf("ns_per_pair=%.3f\n", sum / ((double)threads * (double)iters));
    return 0;
}
