/* Two call sites whose return addresses share their low 16 bits (the placement layer's gate
 * key): twin functions, each aligned to 64 KiB, with one body. The first site keeps every block
 * (the counter calls it long), then the second makes short-lived blocks, which must stay short:
 * the gate lets them through to the site table, which tells the two sites apart. Prints whether
 * the twins' addresses share their low 16 bits, then a checksum.
 *
 *   place_twins N_KEPT N_SHORT */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile unsigned long made_a, made_b;

/* noipa: never merged, inlined or cloned; the call is not the last (the count after it), so
 * each function's call site is its own, at one offset in both */
__attribute__((noipa, aligned(65536))) static unsigned char *twin_a(size_t n) {
    unsigned char *p = malloc(n);
    made_a = made_a + 1;
    return p;
}

__attribute__((noipa, aligned(65536))) static unsigned char *twin_b(size_t n) {
    unsigned char *p = malloc(n);
    made_b = made_b + 1;
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long kept_n = atol(argv[1]), short_n = atol(argv[2]);
    int twins = (((uintptr_t)twin_a ^ (uintptr_t)twin_b) & 0xffff) == 0;
    unsigned char **kept = calloc((size_t)kept_n, sizeof *kept);
    if (!kept) return 1;
    unsigned long sum = 0;
    for (long i = 0; i < kept_n; i++) {
        kept[i] = twin_a(48);
        if (!kept[i]) return 1;
        memset(kept[i], (int)(i & 0xff), 48);
    }
    for (long i = 0; i < short_n; i++) {
        unsigned char *p = twin_b(48);
        if (!p) return 1;
        memset(p, (int)(i & 0xff), 48);
        sum += p[i % 48];
        free(p);
    }
    for (long i = 0; i < kept_n; i++) {
        sum += kept[i][i % 48];
        free(kept[i]);
    }
    free(kept);
    printf("twins=%d sum=%lu\n", twins, sum);
    return 0;
}
