/* Allocates and frees forever; after `ready_after` iterations (argv[1]) prints "ready" and keeps
 * going until killed. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long ready_after = argc > 1 ? atol(argv[1]) : 100000;
    for (long i = 0;; i++) {
        void *p = malloc((size_t)(i % 4096) + 1);
        free(p);
        if (i == ready_after) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}
