/* Large calls the layer passes on, counted: LIVE threads alive at once (a barrier holds them
 * until each has made its first pair), then CHURN threads one after another (each exits before
 * the next starts), each making ITERS malloc(SIZE)/free pairs; main makes none. Prints the
 * pairs made. Under heapcast's layer with a policy that keeps nothing, every pair is two calls
 * passed on, each counted once in the stats (`passed`): the layer's per-thread counters, their
 * owners' exits and a thread count above what it has counters for may lose none.
 * Usage: passcount LIVE CHURN ITERS SIZE (ITERS >= 1) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static long iters;
static size_t size;
static pthread_barrier_t all_started;
static int use_barrier;

static void pair(long i) {
    volatile char *p = malloc(size);
    if (!p) exit(3);
    p[0] = (char)i;
    free((void *)p);
}

static void *work(void *arg) {
    (void)arg;
    pair(0);
    /* every live thread has made a pair before any goes on (and exits) */
    if (use_barrier) pthread_barrier_wait(&all_started);
    for (long i = 1; i < iters; i++) pair(i);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: passcount LIVE CHURN ITERS SIZE\n");
        return 2;
    }
    int live = atoi(argv[1]), churn = atoi(argv[2]);
    iters = atol(argv[3]);
    size = (size_t)atol(argv[4]);
    if (live < 1 || churn < 0 || iters < 1) {
        fprintf(stderr, "passcount: LIVE >= 1, CHURN >= 0, ITERS >= 1\n");
        return 2;
    }
    pthread_t *t = calloc((size_t)live, sizeof *t);
    if (!t) return 3;
    use_barrier = 1;
    pthread_barrier_init(&all_started, NULL, (unsigned)live);
    for (int i = 0; i < live; i++)
        if (pthread_create(&t[i], NULL, work, NULL) != 0) return 4;
    for (int i = 0; i < live; i++) pthread_join(t[i], NULL);
    use_barrier = 0;
    for (int i = 0; i < churn; i++) {
        pthread_t one;
        if (pthread_create(&one, NULL, work, NULL) != 0) return 4;
        pthread_join(one, NULL);
    }
    free(t);
    printf("pairs %ld\n", (long)(live + churn) * iters);
    return 0;
}
