/* cache-scratch-like: passive false sharing (after Berger et al.'s Hoard benchmark). The main
 * thread allocates one small object per thread, side by side, and hands each thread one; the
 * thread frees it, then over and over allocates a small object, writes it many times and frees
 * it. An allocator that gives a thread the freed neighbour of another thread's object makes the
 * two threads write one cache line.
 *
 *   hc-cache-scratch SEED ITERATIONS THREADS      (object: 8 bytes, 100 writes each)
 *
 * The checksum sums every freed object (its stamp is the result of its writes). */
#include <pthread.h>

#include "stress.h"

enum { OBJECT_SIZE = 8, WRITES = 100 };

static long threads, iterations;
static uint64_t seed;
static _Atomic uint64_t checksum;

struct handoff {
    long thread;
    struct block *object;
};

static void *worker(void *arg)
{
    struct handoff *h = arg;
    uint64_t sum = block_free(h->object);
    uint64_t rng = rng_seed(seed, 1, (uint64_t)h->thread);
    for (long i = 0; i < iterations; i++) {
        struct block *b = block_new(OBJECT_SIZE, 0);
        volatile uint64_t *word = &b->stamp;
        uint64_t step = rng_next(&rng) | 1;
        for (int w = 0; w < WRITES; w++)
            *word = *word * 31 + step;
        ((unsigned char *)b)[b->size - 1] = (unsigned char)b->stamp;
        sum += block_free(b);
    }
    atomic_fetch_add(&checksum, sum);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die("usage: hc-cache-scratch SEED ITERATIONS THREADS");
    seed = (uint64_t)arg_long(argv[1], "SEED", 0, 1L << 40);
    iterations = arg_long(argv[2], "ITERATIONS", 1, 1000000000);
    threads = arg_long(argv[3], "THREADS", 1, 256);
    struct handoff *h = calloc((size_t)threads, sizeof *h);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    for (long t = 0; t < threads; t++) {
        h[t].thread = t;
        h[t].object = block_new(OBJECT_SIZE, rng_seed(seed, 0, (uint64_t)t));
    }
    for (long t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, worker, &h[t]) != 0)
            die("pthread_create failed");
    for (long t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    free(h);
    free(tid);
    printf("cache-scratch threads=%ld iterations=%ld checksum=%016llx\n", threads, iterations,
           (unsigned long long)atomic_load(&checksum));
    return 0;
}
