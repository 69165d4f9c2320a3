/* free() of a block glibc did not make but that looks like one of its mmapped chunks (the
 * program built the header itself, in its own mapping): glibc unmaps it. A layer must pass it to
 * the real free, never keep it. Prints "unmapped" or "still mapped" (msync on the region). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(void) {
    size_t n = 512 * 1024;
    unsigned char *region = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 2;
    ((size_t *)region)[0] = 0;     /* prev_size: no padding before the chunk */
    ((size_t *)region)[1] = n | 2; /* size | IS_MMAPPED */
    free(region + 16);
    int gone = msync(region, n, MS_ASYNC) == -1 && errno == ENOMEM;
    /* a layer that kept it would hand it out here */
    void *p = malloc(n - 4096), *q = malloc(n - 4096);
    int handed = (unsigned char *)p == region + 16 || (unsigned char *)q == region + 16;
    printf("%s%s\n", gone ? "unmapped" : "still mapped", handed ? " and handed out" : "");
    free(p);
    free(q);
    return 0;
}
