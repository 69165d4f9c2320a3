/* larson-like: a server's worker threads allocating and freeing blocks of random sizes, each
 * thread's blocks taken over by another thread at the next round (so most frees happen on a
 * thread that did not allocate the block), after Larson and Krishnan's benchmark.
 *
 *   hc-larson SEED OPS THREADS      OPS: replacements per thread per round
 *
 * THREADS arrays of SLOTS blocks; at round r thread t works on array (t + r) % THREADS with the
 * generator of (SEED, r, array): each step frees a random slot's block and puts a new one there.
 * Rounds are separated by a barrier; the checksum sums every freed block. */
#include <pthread.h>

#include "stress.h"

enum { SLOTS = 1000, ROUNDS = 12, MIN_SIZE = 16, MAX_SIZE = 1000 };

static long threads, ops;
static uint64_t seed;
static struct block ***arrays;
static pthread_barrier_t barrier;
static _Atomic uint64_t checksum;

static void *worker(void *arg)
{
    long t = (long)arg;
    for (long r = 0; r < ROUNDS; r++) {
        long a = (t + r) % threads;
        uint64_t rng = rng_seed(seed, (uint64_t)r + 1, (uint64_t)a);
        uint64_t sum = 0;
        struct block **slots = arrays[a];
        for (long i = 0; i < ops; i++) {
            uint64_t k = rng_below(&rng, SLOTS);
            sum += block_free(slots[k]);
            slots[k] = block_new(draw_size(&rng, MIN_SIZE, MAX_SIZE, 0, 0), rng_next(&rng));
        }
        atomic_fetch_add(&checksum, sum);
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die("usage: hc-larson SEED OPS THREADS");
    seed = (uint64_t)arg_long(argv[1], "SEED", 0, 1L << 40);
    ops = arg_long(argv[2], "OPS", 1, 100000000);
    threads = arg_long(argv[3], "THREADS", 1, 256);
    arrays = calloc((size_t)threads, sizeof *arrays);
    for (long a = 0; a < threads; a++) {
        uint64_t rng = rng_seed(seed, 0, (uint64_t)a);
        arrays[a] = calloc(SLOTS, sizeof **arrays);
        for (long k = 0; k < SLOTS; k++)
            arrays[a][k] =
                block_new(draw_size(&rng, MIN_SIZE, MAX_SIZE, 0, 0), rng_next(&rng));
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    for (long t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, worker, (void *)t) != 0)
            die("pthread_create failed");
    for (long t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = atomic_load(&checksum);
    for (long a = 0; a < threads; a++) {
        for (long k = 0; k < SLOTS; k++)
            sum += block_free(arrays[a][k]);
        free(arrays[a]);
    }
    free(arrays);
    free(tid);
    printf("larson threads=%ld rounds=%d ops=%ld checksum=%016llx\n", threads, ROUNDS, ops,
           (unsigned long long)sum);
    return 0;
}
