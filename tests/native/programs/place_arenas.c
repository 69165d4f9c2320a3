/* One call site that keeps every block it makes (N blocks of SIZE bytes, live to the end), then
 * how many arenas jemalloc has: its automatic ones, plus one where the placement layer made its
 * long arena. mallctl is looked up at run time, so the program runs under any malloc (0 where
 * there is none).
 *
 *   place_arenas N SIZE */
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

int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    unsigned char **kept = calloc((size_t)n, sizeof *kept);
    if (!kept) return 1;
    for (long i = 0; i < n; i++)
        if (!(kept[i] = make(size, (unsigned)i))) return 1;
    int (*ctl)(const char *, void *, size_t *, void *, size_t) =
        (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
    unsigned narenas = 0;
    size_t len = sizeof narenas;
    if (ctl && ctl("arenas.narenas", &narenas, &len, NULL, 0) != 0) narenas = 0;
    for (long i = 0; i < n; i++) free(kept[i]);
    free(kept);
    printf("blocks=%ld arenas=%u\n", n, narenas);
    return 0;
}
