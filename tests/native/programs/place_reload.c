/* Libraries loaded, allocated through, unloaded and others loaded (most often at the same
 * addresses): the placement layer's dlclose hook drops its cached unwind rules and frame keys
 * (native/context_key.h). Each library's plugin_allocate (programs/plugin.c) makes blocks, a few
 * kept past its dlclose.
 *
 *   place_reload ROUNDS SO...   each round: each SO in turn dlopen'ed, 5000 blocks, dlclose'd */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int rounds = atoi(argv[1]);
    void *kept[4096];
    int nkept = 0;
    unsigned long sum = 0;
    for (int r = 0; r < rounds; r++)
        for (int k = 2; k < argc; k++) {
            void *h = dlopen(argv[k], RTLD_NOW);
            if (!h) {
                fprintf(stderr, "%s\n", dlerror());
                return 4;
            }
            void *(*f)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_allocate");
            if (!f) return 5;
            for (int i = 0; i < 5000; i++) {
                unsigned char *p = f(24 + (size_t)(i % 200));
                if (!p) return 3;
                memset(p, i & 0xff, 24);
                sum += p[3];
                if (i % 100 == 0 && nkept < 4096) kept[nkept++] = p;
                else free(p);
            }
            dlclose(h);
        }
    for (int i = 0; i < nkept; i++) free(kept[i]);
    printf("rounds=%d kept=%d sum=%lu\n", rounds, nkept, sum);
    return 0;
}
