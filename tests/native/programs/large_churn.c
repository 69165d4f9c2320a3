/* Large-block churn, for `heapcast tune` (its test and its benchmark): a 40 MiB block, above
 * glibc's dynamic mmap threshold (32 MiB), malloc'd, touched and freed N times in a row.
 * usage: large_churn [N]   N defaults to 12; prints the sum of one byte of each block */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 12;
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        size_t size = 40u << 20;
        unsigned char *p = malloc(size);
        memset(p, i, size);
        sum += p[size / 2];
        free(p);
    }
    printf("%lu\n", sum);
    return 0;
}
