/* A reader thread hands blocks to the main thread, which uses and frees them: the thread that
 * frees a block never asks for one, the one that asks never frees (numpy_pipeline's shape, in
 * C). The reader fills CHUNKS blocks of SIZE bytes one after another and hands each to main,
 * which sums a byte of each page and frees the block; the reader asks for the next block only
 * once main has freed the last, so that every request follows the free that could serve it,
 * whatever the threads' timing (with a queue of two, a reader that ran ahead asked before the
 * free, and the count of reuses moved with the machine's load). Prints the sum.
 * Usage: handoff CHUNKS SIZE */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define DEPTH 2
static long chunks;
static size_t size;
static unsigned char *queue[DEPTH];
static int head, count;
static long freed; /* blocks main has freed */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

static void *reader(void *arg) {
    (void)arg;
    for (long i = 0; i < chunks; i++) {
        pthread_mutex_lock(&mu);
        while (freed < i) pthread_cond_wait(&changed, &mu);
        pthread_mutex_unlock(&mu);
        unsigned char *p = malloc(size);
        if (!p) exit(3);
        for (size_t off = 0; off < size; off += 4096) p[off] = (unsigned char)(i + off / 4096);
        pthread_mutex_lock(&mu);
        while (count == DEPTH) pthread_cond_wait(&changed, &mu);
        queue[(head + count++) % DEPTH] = p;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    chunks = atol(argv[1]);
    size = (size_t)atol(argv[2]);
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL)) return 4;
    unsigned long long sum = 0;
    for (long i = 0; i < chunks; i++) {
        pthread_mutex_lock(&mu);
        while (count == 0) pthread_cond_wait(&changed, &mu);
        unsigned char *p = queue[head];
        head = (head + 1) % DEPTH;
        count--;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&mu);
        for (size_t off = 0; off < size; off += 4096) sum += p[off];
        free(p);
        pthread_mutex_lock(&mu);
        freed++;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&mu);
    }
    pthread_join(t, NULL);
    printf("%ld chunks, sum %llu\n", chunks, sum);
    return 0;
}
