/* Known allocations between two marker calls, for exact checks of the converter on a real trace.
 * Markers: malloc(777777) before, malloc(888888) after (each freed at once). Nothing else in the
 * program allocates between them: no stdio until the end. A second thread makes its own
 * allocations after the main thread's, joined before the end marker.
 * -fno-builtin keeps gcc from deleting the unused malloc/free pairs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void marker(size_t n) { free(malloc(n)); }

static void *worker(void *arg) {
    (void)arg;
    void *x = malloc(40);   /* token 6 */
    free(x);                /* 32 + 6 */
    return NULL;
}

int main(void) {
    marker(777777);
    void *a = malloc(100);          /* 0: token 7 */
    void *b = calloc(10, 30);       /* 1: 300 bytes, token 9 */
    free(a);                        /* 2: frees 100 -> token 39, a lives 2 calls */
    void *c = realloc(b, 5000);     /* 3: token 13, frees b (300 bytes) */
    void *d = NULL;
    if (posix_memalign(&d, 64, 1024)) return 1; /* 4: token 11, alignment 64 */
    void *e = malloc(24);           /* 5: token 5 */
    free(c);                        /* 6: frees 5000 -> token 45 */
    free(d);                        /* 7: frees 1024 -> token 43 */
    void *f = realloc(e, 0);        /* 8: glibc frees e and returns NULL: free token 37 */
    (void)f;
    void *g = malloc(24);           /* 9: never freed */
    (void)g;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    marker(888888);
    printf("done\n");
    return 0;
}
