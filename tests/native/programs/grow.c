/* A buffer grown by malloc, copy and free, as strings, vectors and hash tables grow: each round
 * starts at START bytes and grows by 1/16 STEPS times, the old block freed just after the new
 * one is made; the last block is freed at the round's end. Prints a checksum of the contents.
 * usage: grow ROUNDS STEPS START */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: grow ROUNDS STEPS START\n");
        return 2;
    }
    int rounds = atoi(argv[1]), steps = atoi(argv[2]);
    size_t start = (size_t)strtoull(argv[3], NULL, 10);
    unsigned long long sum = 0;
    for (int r = 0; r < rounds; r++) {
        size_t n = start;
        unsigned char *p = malloc(n);
        if (!p) return 3;
        memset(p, r + 1, n);
        for (int s = 0; s < steps; s++) {
            size_t m = n + n / 16;
            unsigned char *q = malloc(m);
            if (!q) return 3;
            memcpy(q, p, n);
            memset(q + n, s + 1, m - n);
            free(p);
            p = q;
            n = m;
        }
        for (size_t i = 0; i < n; i += 4096) sum += p[i];
        sum += n;
        free(p);
    }
    printf("rounds=%d steps=%d checksum=%llu\n", rounds, steps, sum);
    return 0;
}
