/* The layer's predictor (native/layers/predictor.h) on a token sequence, for the tests and the
 * benchmark.
 *   predict_tokens FILE     FILE: one byte per token (0..63), one thread. Prints, per position,
 *                           the answer before the token is learnt: "top1 order count total".
 *   predict_tokens bench N  N learn+hcp_soon steps (the guided policy's work at a free) on a
 *                           repeating large-block pattern;
 *                           prints "ns_per_call=X" (the thread's CPU time). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "layers/predictor.h"

static struct hcp_counter *fresh(void) {
    void *m = mmap(NULL, sizeof(struct hcp_counter), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) exit(2);
    return m;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "bench")) {
        long n = atol(argv[2]);
        struct hcp_counter *c = fresh();
        static const unsigned pat[] = {27, 27, 59, 20, 52, 59, 27, 59, 18, 50};
        struct timespec a, b;
        unsigned kept = 0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        for (long i = 0; i < n; i++) {
            unsigned y = pat[i % 10];
            hcp_learn(c, y);
            kept += (unsigned)hcp_soon(c, y & 31, 2, 4); /* the guided policy's question */
        }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
        printf("ns_per_call=%.2f kept=%u\n", ns / (double)n, kept);
        return 0;
    }
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    struct hcp_counter *c = fresh();
    int ch;
    while ((ch = fgetc(f)) != EOF) {
        if (ch >= HCP_TOKENS) return 3;
        struct hcp_answer a = hcp_answer(c);
        printf("%u %u %u %u\n", a.top1, a.order, a.count, a.total);
        hcp_learn(c, (unsigned)ch);
    }
    fclose(f);
    return 0;
}
