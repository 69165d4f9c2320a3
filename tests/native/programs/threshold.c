/* Where does glibc put a large block after a larger one was freed? glibc raises its mmap
 * threshold at the free of a larger mmapped block, so the next block of 200000 bytes comes from
 * its heap; a layer that keeps the freed block from glibc must raise it the same way.
 * Prints "heap" or "mmap" (an mmapped chunk's usable size is a page multiple less its 16-byte
 * header). usage: threshold [mallopt | twice]: with "mallopt", the program first fixes the
 * threshold at 128 KiB itself (mallopt(M_MMAP_THRESHOLD)), which no one may move; with "twice", a
 * block of 300000 bytes is made and freed first (the threshold raised in two steps: a layer may
 * pass one free to glibc, which raises it itself, and keep the other). */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "mallopt") && !mallopt(M_MMAP_THRESHOLD, 128 * 1024))
        return 2;
    if (argc > 1 && !strcmp(argv[1], "twice")) {
        char *o = malloc(300000);
        if (!o) return 2;
        memset(o, 3, 300000);
        free(o);
    }
    char *p = malloc(600000);
    if (!p) return 2;
    memset(p, 1, 600000);
    free(p);
    char *q = malloc(200000); /* too small for the freed block (the layer's fit rule): glibc's */
    if (!q) return 2;
    memset(q, 2, 200000);
    printf("%s\n", malloc_usable_size(q) % 4096 == 4096 - 16 ? "mmap" : "heap");
    free(q);
    return 0;
}
