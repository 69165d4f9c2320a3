/* xmalloc-test-like: producer threads allocate blocks and pass them through a shared queue to
 * consumer threads, which free them: every free is on another thread than the allocation
 * (after Lever and Boreham's xmalloc test).
 *
 *   hc-xmalloc-test SEED BLOCKS PAIRS      BLOCKS per producer; PAIRS producers and consumers
 *
 * Blocks travel in batches of 64 through a bounded queue (mutex and condition variables). The
 * checksum sums every freed block. */
#include <pthread.h>

#include "stress.h"

enum { BATCH = 64, QUEUE = 256, MIN_SIZE = 16, MAX_SIZE = 512, BIG_EVERY = 200, BIG = 16384 };

struct batch {
    int n;
    struct block *b[BATCH];
};

static long pairs, blocks;
static uint64_t seed;
static _Atomic uint64_t checksum;

static struct batch *queue[QUEUE];
static int head, count;
static long producers_left;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER, not_empty = PTHREAD_COND_INITIALIZER;

static void push(struct batch *b)
{
    pthread_mutex_lock(&lock);
    while (count == QUEUE)
        pthread_cond_wait(&not_full, &lock);
    queue[(head + count++) % QUEUE] = b;
    pthread_cond_signal(&not_empty);
    pthread_mutex_unlock(&lock);
}

/* the next batch, or NULL when every producer is done and the queue is empty */
static struct batch *pop(void)
{
    pthread_mutex_lock(&lock);
    while (count == 0 && producers_left > 0)
        pthread_cond_wait(&not_empty, &lock);
    struct batch *b = NULL;
    if (count > 0) {
        b = queue[head];
        head = (head + 1) % QUEUE;
        count--;
        pthread_cond_signal(&not_full);
    }
    pthread_mutex_unlock(&lock);
    return b;
}

static void *producer(void *arg)
{
    uint64_t rng = rng_seed(seed, 1, (uint64_t)(long)arg);
    for (long done = 0; done < blocks;) {
        struct batch *b = malloc(sizeof *b);
        if (b == NULL)
            die("out of memory");
        b->n = 0;
        for (; b->n < BATCH && done < blocks; done++)
            b->b[b->n++] =
                block_new(draw_size(&rng, MIN_SIZE, MAX_SIZE, BIG_EVERY, BIG), rng_next(&rng));
        push(b);
    }
    pthread_mutex_lock(&lock);
    if (--producers_left == 0)
        pthread_cond_broadcast(&not_empty);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    uint64_t sum = 0;
    struct batch *b;
    while ((b = pop()) != NULL) {
        for (int i = 0; i < b->n; i++)
            sum += block_free(b->b[i]);
        free(b);
    }
    atomic_fetch_add(&checksum, sum);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die("usage: hc-xmalloc-test SEED BLOCKS PAIRS");
    seed = (uint64_t)arg_long(argv[1], "SEED", 0, 1L << 40);
    blocks = arg_long(argv[2], "BLOCKS", 1, 1000000000);
    pairs = arg_long(argv[3], "PAIRS", 1, 128);
    producers_left = pairs;
    pthread_t *tid = calloc((size_t)(2 * pairs), sizeof *tid);
    for (long t = 0; t < pairs; t++)
        if (pthread_create(&tid[t], NULL, producer, (void *)t) != 0 ||
            pthread_create(&tid[pairs + t], NULL, consumer, NULL) != 0)
            die("pthread_create failed");
    for (long t = 0; t < 2 * pairs; t++)
        pthread_join(tid[t], NULL);
    free(tid);
    printf("xmalloc-test pairs=%ld blocks=%ld checksum=%016llx\n", pairs, blocks,
           (unsigned long long)atomic_load(&checksum));
    return 0;
}
