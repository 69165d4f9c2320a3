/* Two callers whose large blocks all pass one allocation wrapper (xmalloc) and one free wrapper
 * (xfree): the blocks' call sites (the free's return address, the allocation's) are the same
 * for both, only the allocation's calling context (xmalloc's caller) tells them apart. Each
 * round: `a` blocks made by make_scratch, each written and freed at once (a temporary its
 * caller asks for again soon), then `b` made by make_record, written, all freed together, then
 * CHURN small blocks made and freed (2 * CHURN calls: a record's free is followed by no large
 * request for that long; studies/layer_context_table). Prints one checksum line that depends
 * only on the data written. Exit 3 if a check fails.
 *
 * usage: ctxwrap ROUNDS A B SIZE [CHURN] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGE 4096
#define MAX_B 64

static __attribute__((noinline)) void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) exit(2);
    __asm__ volatile("" ::: "memory"); /* no tail call: xmalloc stays a frame of its own */
    return p;
}

static __attribute__((noinline)) void xfree(void *p) {
    free(p);
    __asm__ volatile("" ::: "memory");
}

static __attribute__((noinline)) unsigned char *make_scratch(size_t n) {
    unsigned char *p = xmalloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static __attribute__((noinline)) unsigned char *make_record(size_t n) {
    unsigned char *p = xmalloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static uint64_t fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t sum = 0;
    for (size_t j = 0; j < n; j += PAGE) {
        p[j] = (unsigned char)(seed * 31 + j / PAGE);
        sum += p[j];
    }
    return sum;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: ctxwrap ROUNDS A B SIZE [CHURN]\n");
        return 2;
    }
    int rounds = atoi(argv[1]), a = atoi(argv[2]), b = atoi(argv[3]);
    int churn = argc == 6 ? atoi(argv[5]) : 0;
    size_t size = strtoull(argv[4], NULL, 10);
    if (b > MAX_B || size < 1) return 2;
    uint64_t sum = 0;
    unsigned char *kept[MAX_B];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < a; i++) {
            unsigned char *p = make_scratch(size);
            sum += fill(p, size, (uint64_t)(r * 7 + i));
            xfree(p);
        }
        for (int i = 0; i < b; i++) {
            kept[i] = make_record(size);
            sum += fill(kept[i], size, (uint64_t)(r * 13 + i));
        }
        for (int i = 0; i < b; i++) {
            if (kept[i][0] != (unsigned char)((r * 13 + i) * 31)) return 3;
            xfree(kept[i]);
        }
        for (int i = 0; i < churn; i++) { /* small calls between the records' frees and more */
            unsigned char *q = malloc(64 + (size_t)(i & 63));
            if (q == NULL) return 2;
            q[0] = (unsigned char)i;
            sum += q[0];
            free(q);
        }
    }
    printf("ctxwrap %d %d %d %zu sum %llu\n", rounds, a, b, size, (unsigned long long)sum);
    return 0;
}
