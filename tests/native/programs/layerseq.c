/* A hand-made sequence of large allocations, to hold the simulator to the real largest layer
 * (tests/native/test_cache_layer.py). Each argument is one step:
 *   m:SLOT:SIZE   malloc        c:SLOT:SIZE   calloc
 *   a:SLOT:ALIGN:SIZE   posix_memalign
 *   r:SLOT:SIZE   realloc       f:SLOT        free
 * Every block is written once per page (first touch a write: one fault per page), calloc's
 * zeros checked where nothing was written. Prints one checksum line; exit 3 on a failed check. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
#define PAGE 4096

int main(int argc, char **argv) {
    unsigned char *slot[SLOTS] = {0};
    size_t len[SLOTS] = {0};
    uint64_t sum = 0;
    for (int i = 1; i < argc; i++) {
        char op;
        unsigned s;
        unsigned long long x = 0, y = 0;
        int n = sscanf(argv[i], "%c:%u:%llu:%llu", &op, &s, &x, &y);
        if (n < 2 || s >= SLOTS) {
            fprintf(stderr, "layerseq: bad step %s\n", argv[i]);
            return 2;
        }
        unsigned char *p = NULL;
        size_t size = (size_t)x;
        if (op == 'f') {
            free(slot[s]);
            slot[s] = NULL;
            continue;
        } else if (op == 'm') {
            p = malloc(size);
        } else if (op == 'c') {
            p = calloc(1, size);
        } else if (op == 'a') {
            void *q = NULL;
            size = (size_t)y;
            if (posix_memalign(&q, (size_t)x, size) != 0) q = NULL;
            p = q;
            if (p && ((uintptr_t)p % x)) return 3;
        } else if (op == 'r') {
            p = realloc(slot[s], size);
            if (p)
                for (size_t j = 0; j < len[s] && j < size; j += PAGE) sum += p[j];
        } else {
            fprintf(stderr, "layerseq: bad step %s\n", argv[i]);
            return 2;
        }
        if (!p) return 3;
        size_t from = op == 'r' ? len[s] : 0;
        for (size_t j = from - from % PAGE; j < size; j += PAGE) {
            if (j >= from) p[j] = (unsigned char)(i + j / PAGE);
        }
        p[size - 1] = (unsigned char)i;
        if (op == 'c')
            for (size_t j = PAGE / 2; j < size - 1; j += PAGE)
                if (p[j]) return 3;
        slot[s] = p;
        len[s] = size;
        sum += (uint64_t)i * size;
    }
    printf("steps=%d checksum=%llu\n", argc - 1, (unsigned long long)sum);
    return 0;
}
