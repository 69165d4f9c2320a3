/* One call of every hooked allocation function, with known sizes and alignments. Prints one
 * line per call: "<name> <returned address> <old address>" (decimal), written with write(2)
 * from a static buffer so that stdio allocates nothing. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char out[8192];
static size_t used;

static void note(const char *name, void *p, uintptr_t old) {
    used += (size_t)snprintf(out + used, sizeof out - used, "%s %lu %lu\n", name,
                             (unsigned long)(uintptr_t)p, (unsigned long)old);
}

int main(void) {
    void *m = malloc(100);
    note("malloc", m, 0);
    void *c = calloc(10, 30);
    note("calloc", c, 0);
    uintptr_t m_addr = (uintptr_t)m;
    void *r = realloc(m, 5000);
    note("realloc", r, m_addr);
    void *rn = realloc(NULL, 50);
    note("realloc_null", rn, 0);
    uintptr_t rn_addr = (uintptr_t)rn;
    void *r0 = realloc(rn, 0); /* glibc: frees rn, returns NULL */
    note("realloc_zero", r0, rn_addr);
    uintptr_t c_addr = (uintptr_t)c;
    void *ra = reallocarray(c, 20, 40);
    note("reallocarray", ra, c_addr);
    void *pm = NULL;
    if (posix_memalign(&pm, 64, 1000) != 0) return 2;
    note("posix_memalign", pm, 0);
    void *aa = aligned_alloc(128, 1024);
    note("aligned_alloc", aa, 0);
    void *ma = memalign(256, 2000);
    note("memalign", ma, 0);
    void *va = valloc(3000);
    note("valloc", va, 0);
    void *pv = pvalloc(5000);
    note("pvalloc", pv, 0);
    void *huge = malloc((size_t)1 << 62); /* fails: recorded with addr 0 */
    note("malloc_fail", huge, 0);
    free(NULL); /* not recorded */
    note("usable", (void *)(uintptr_t)malloc_usable_size(r), 0);
    free(r);
    free(ra);
    free(pm);
    free(aa);
    free(ma);
    free(va);
    free(pv);
    note("main", (void *)(uintptr_t)&main, 0);
    if (write(1, out, used) != (ssize_t)used) return 3;
    return 0;
}
