/* 8 worker threads; worker i makes COUNT(i) = 100 * (i + 1) mallocs of sizes 1000 * (i + 1) + j
 * (j = 0 .. COUNT(i) - 1) and frees them all, newest first. A barrier makes them run together.
 * Prints "worker <i> <tid>" per worker (stdout, after joining) so a test maps trace threads to
 * workers by THREAD_START's tid. No stdio before the joins: the trace holds only these calls
 * and pthread's own. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define WORKERS 8
static pthread_barrier_t barrier;
static pid_t tids[WORKERS];

static void *worker(void *arg) {
    int i = (int)(long)arg;
    int count = 100 * (i + 1);
    void **blocks = __builtin_alloca(sizeof(void *) * (size_t)count);
    tids[i] = gettid();
    pthread_barrier_wait(&barrier);
    for (int j = 0; j < count; j++) blocks[j] = malloc((size_t)(1000 * (i + 1) + j));
    for (int j = count - 1; j >= 0; j--) free(blocks[j]);
    return NULL;
}

int main(void) {
    pthread_t th[WORKERS];
    pthread_barrier_init(&barrier, NULL, WORKERS);
    for (long i = 0; i < WORKERS; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < WORKERS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < WORKERS; i++) printf("worker %d %d\n", i, (int)tids[i]);
    return 0;
}
