/* Threads that exit while others allocate: 2 long-lived threads allocate and free in a loop
 * (malloc(777) / free) until told to stop, while the main thread creates and joins SHORT short
 * threads one after another; short thread k makes 10 mallocs of 5000 + k and frees them.
 * Prints "long <tid> <iterations>" and "short <k> <tid>" at the end. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define LONG 2
#define SHORT 50
static volatile int stop;
static pid_t long_tids[LONG], short_tids[SHORT];
static long long_iters[LONG];

static void *long_worker(void *arg) {
    int i = (int)(long)arg;
    long_tids[i] = gettid();
    long n = 0;
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        void *p = malloc(777);
        free(p);
        n++;
    }
    long_iters[i] = n;
    return NULL;
}

static void *short_worker(void *arg) {
    int k = (int)(long)arg;
    void *blocks[10];
    short_tids[k] = gettid();
    for (int j = 0; j < 10; j++) blocks[j] = malloc((size_t)(5000 + k));
    for (int j = 0; j < 10; j++) free(blocks[j]);
    return NULL;
}

int main(void) {
    pthread_t lt[LONG], st;
    for (long i = 0; i < LONG; i++) pthread_create(&lt[i], NULL, long_worker, (void *)i);
    for (long k = 0; k < SHORT; k++) {
        pthread_create(&st, NULL, short_worker, (void *)k);
        pthread_join(st, NULL);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < LONG; i++) pthread_join(lt[i], NULL);
    for (int i = 0; i < LONG; i++) printf("long %d %ld\n", (int)long_tids[i], long_iters[i]);
    for (int k = 0; k < SHORT; k++) printf("short %d %d\n", k, (int)short_tids[k]);
    return 0;
}
