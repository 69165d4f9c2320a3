/* Allocation calls made while an LD_PRELOAD layer is still looking up the real allocator.
 *
 * This program defines dlsym (built with -rdynamic, so it comes first in the global scope): the
 * layer's dlsym(RTLD_NEXT, ...) lookups reach it. The first such lookup, i.e. while the layer is
 * resolving and has no real function yet, calls posix_memalign, aligned_alloc, memalign, valloc
 * and realloc (of a block that glibc made directly, through __libc_malloc), as another library
 * or thread could at that moment; then it answers the lookup from libc. main prints what those
 * calls returned: one line per call, the same under any correct layer. Exit 3 on a failed check. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);

static int provoked;
static int pm_rc = -1;
static void *pm, *aa, *ma, *va, *ra, *pre;
static int ra_errno;

static void provoke(void) {
    provoked = 1;
    pm_rc = posix_memalign(&pm, 64, 1000);
    aa = aligned_alloc(256, 512);
    ma = memalign(128, 300);
    va = valloc(100);
    pre = __libc_malloc(100);
    memset(pre, 7, 100);
    errno = 0;
    ra = realloc(pre, 5000);
    ra_errno = errno;
}

void *dlsym(void *handle, const char *name) {
    static void *(*real)(void *, const char *);
    static void *libc;
    if (!real) real = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (handle != RTLD_NEXT) return real(handle, name);
    if (!provoked) provoke();
    /* RTLD_NEXT from the layer: the next definition is libc's (the layer is the only preload) */
    if (!libc) libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    return real(libc, name);
}

static int aligned(void *p, uintptr_t a) { return p != NULL && ((uintptr_t)p & (a - 1)) == 0; }

int main(void) {
    void *p = malloc(10);
    free(p);
    if (!provoked) {
        printf("no lookup\n");
        return 0;
    }
    printf("posix_memalign rc=%d aligned=%d\n", pm_rc, pm_rc == 0 && aligned(pm, 64));
    printf("aligned_alloc aligned=%d\n", aligned(aa, 256));
    printf("memalign aligned=%d\n", aligned(ma, 128));
    printf("valloc aligned=%d\n", aligned(va, 4096));
    /* a realloc the layer cannot do yet may fail (old block kept), never crash or lose data */
    if (ra == NULL) {
        for (int i = 0; i < 100; i++)
            if (((unsigned char *)pre)[i] != 7) return 3;
        printf("realloc refused errno=%s\n", ra_errno == ENOMEM ? "ENOMEM" : "other");
    } else {
        for (int i = 0; i < 100; i++)
            if (((unsigned char *)ra)[i] != 7) return 3;
        printf("realloc moved\n");
    }
    free(pm);
    free(aa);
    free(ma);
    free(va);
    return 0;
}
