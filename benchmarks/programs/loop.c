/* Benchmark workload: THREADS threads, each ITERS iterations of a malloc and a free of a size
 * cycling through 16..4111 bytes, with a small window of live blocks so the allocator does real
 * work. Exactly THREADS * ITERS * 2 heap calls (plus what libc does for the threads).
 * With DEPTH > 0 each thread first descends DEPTH noipa frames (a recursion that is no tail
 * call) and runs the loop at the bottom, so a tracer that records call stacks walks DEPTH + 1
 * frames of the program (and libc's thread start) at every call.
 * Usage: loop [threads=8] [iters=250000] [depth=0]; prints the number of calls it made. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define WINDOW 64
static long iters = 250000;
static int depth = 0;

static void churn(unsigned seed) {
    void *live[WINDOW] = {0};
    for (long i = 0; i < iters; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned slot = (seed >> 16) % WINDOW;
        free(live[slot]); /* free(NULL) for the first use of a slot: not a traced call */
        live[slot] = malloc(16 + (seed >> 8) % 4096);
    }
    for (int s = 0; s < WINDOW; s++) free(live[s]);
}

__attribute__((noipa)) static unsigned descend(int levels, unsigned seed) {
    if (levels == 0) {
        churn(seed);
        return seed;
    }
    unsigned r = descend(levels - 1, seed);
    __asm__ volatile("" : : "r"(r) : "memory"); /* a use after the call: not a tail call */
    return r;
}

static void *work(void *arg) {
    unsigned seed = (unsigned)(long)arg * 2654435761u;
    if (depth > 0)
        descend(depth, seed);
    else
        churn(seed);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2) iters = atol(argv[2]);
    if (argc > 3) depth = atoi(argv[3]);
    pthread_t th[256];
    if (threads < 1 || threads > 256 || depth < 0) return 2;
    for (long t = 0; t < threads; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    printf("%ld\n", (long)threads * iters * 2);
    return 0;
}
