/* One call site that keeps every block it makes (so the placement layer's counter calls it
 * long): N blocks of SIZE bytes, all live to the end, then a checksum and every block freed.
 * With a third argument `arenas`, also how many arenas jemalloc has while the blocks live: its
 * automatic ones, plus one where the placement layer made its long arena (mallctl looked up at
 * run time, so the program runs under any malloc: 0 where there is none).
 *
 *   place_large N SIZE [arenas] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __attribute__((noinline)) unsigned char *make(size_t size, unsigned seed)
{
    unsigned char *p = malloc(size); /* the one site */
    if (p) memset(p, (int)(seed & 0xff), size);
    return p;
}

static unsigned arenas(void)
{
    int (*ctl)(const char *, void *, size_t *, void *, size_t) =
        (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
    unsigned narenas = 0;
    size_t len = sizeof narenas;
    if (ctl && ctl("arenas.narenas", &narenas, &len, NULL, 0) != 0) narenas = 0;
    return narenas;
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "arenas"))) return 2;
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
    unsigned count = argc == 4 ? arenas() : 0;
    for (long i = 0; i < n; i++) free(kept[i]);
    free(kept);
    printf("blocks=%ld size=%zu sum=%lu\n", n, size, sum);
    if (argc == 4) printf("arenas=%u\n", count);
    return 0;
}
