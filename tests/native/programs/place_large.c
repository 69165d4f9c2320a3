/* One call site that keeps every block it makes (so the placement layer's counter calls it
 * long): N blocks of SIZE bytes, all live to the end, then a checksum and every block freed.
 *
 *   place_large N SIZE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __attribute__((noinline)) unsigned char *make(size_t size, unsigned seed)
{
    unsigned char *p = malloc(size); /* the one site */
    if (p) memset(p, (int)(seed & 0xff), size);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    unsigned char **kept = calloc((size_t)n, sizeof *kept);
    if (!kept) return 1;
    unsigned long sum = 0;
    for (long i = 0; i < n; i++) {
        kept[i] = make(size, (unsigned)i);
        if (!kept[i]) return 1;
        sum += kept[i][size - 1];
    }
    for (long i = 0; i < n; i++) free(kept[i]);
    free(kept);
    printf("blocks=%ld size=%zu sum=%lu\n", n, size, sum);
    return 0;
}
