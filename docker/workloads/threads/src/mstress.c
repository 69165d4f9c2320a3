/* mstress-like: threads allocate many blocks (mostly small, one in a hundred up to 256 KiB),
 * keep some, free others at random, and swap blocks with other threads through a shared array
 * of transfer slots (an atomic exchange), so blocks live long, cross threads and die anywhere
 * (after the stress test that ships with mimalloc).
 *
 *   hc-mstress SEED ITERATIONS THREADS
 *
 * Each iteration a thread allocates 50-149 blocks into its own array (freeing what a slot held),
 * frees a random third of the array, and trades 10 blocks through the transfer slots. What a
 * thread receives it keeps, in place of what it gave. The checksum sums every freed block. */
#include <pthread.h>

#include "stress.h"

enum { KEEP = 4096, TRANSFERS = 1024, MIN_SIZE = 16, MAX_SIZE = 256, BIG_EVERY = 100 };
enum { BIG = 256 * 1024 };

static long threads, iterations;
static uint64_t seed;
static _Atomic uint64_t checksum;
static struct block *_Atomic transfer[TRANSFERS];

static void *worker(void *arg)
{
    long t = (long)arg;
    uint64_t rng = rng_seed(seed, 1, (uint64_t)t);
    uint64_t sum = 0;
    struct block **kept = calloc(KEEP, sizeof *kept);
    if (kept == NULL)
        die("out of memory");
    for (long it = 0; it < iterations; it++) {
        long n = 50 + (long)rng_below(&rng, 100);
        for (long i = 0; i < n; i++) {
            uint64_t k = rng_below(&rng, KEEP);
            if (kept[k] != NULL)
                sum += block_free(kept[k]);
            kept[k] = block_new(draw_size(&rng, MIN_SIZE, MAX_SIZE, BIG_EVERY, BIG),
                                rng_next(&rng));
        }
        for (long i = 0; i < KEEP / 3 / 8; i++) {
            uint64_t k = rng_below(&rng, KEEP);
            if (kept[k] != NULL) {
                sum += block_free(kept[k]);
                kept[k] = NULL;
            }
        }
        for (int i = 0; i < 10; i++) {
            uint64_t k = rng_below(&rng, KEEP);
            uint64_t s = rng_below(&rng, TRANSFERS);
            kept[k] = atomic_exchange(&transfer[s], kept[k]);
        }
    }
    for (long k = 0; k < KEEP; k++)
        if (kept[k] != NULL)
            sum += block_free(kept[k]);
    free(kept);
    atomic_fetch_add(&checksum, sum);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die("usage: hc-mstress SEED ITERATIONS THREADS");
    seed = (uint64_t)arg_long(argv[1], "SEED", 0, 1L << 40);
    iterations = arg_long(argv[2], "ITERATIONS", 1, 100000000);
    threads = arg_long(argv[3], "THREADS", 1, 256);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    for (long t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, worker, (void *)t) != 0)
            die("pthread_create failed");
    for (long t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = atomic_load(&checksum);
    for (int s = 0; s < TRANSFERS; s++)
        if (transfer[s] != NULL)
            sum += block_free(transfer[s]);
    free(tid);
    printf("mstress threads=%ld iterations=%ld checksum=%016llx\n", threads, iterations,
           (unsigned long long)sum);
    return 0;
}
