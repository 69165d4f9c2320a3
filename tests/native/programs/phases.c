/* Two phases that take turns, as a training step's input pipeline and its model do: phase A
 * holds NA blocks of SA bytes at once, then frees them; phase B holds NB blocks of SB bytes,
 * then frees them; ROUNDS times. A's blocks are too small for B's requests and too large to
 * serve A's from B's (the layer's fit rule), so a cache that keeps one phase's blocks through
 * the other holds them on top of what the program itself has live. Every page of each block is
 * written, so what the program holds is resident. Prints one checksum line, the same under any
 * allocator; with PHASES_VMHWM=1 in its environment, also on stderr its peak resident set
 * (VmHWM: the process's own, where a parent's rusage would count the pages of the process it
 * was forked from). usage: phases ROUNDS NA SA NB SB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BLOCKS 64
#define PAGE 4096

static uint64_t phase(int n, size_t size, uint64_t seed) {
    unsigned char *b[MAX_BLOCKS];
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        b[i] = malloc(size);
        if (b[i] == NULL) exit(2);
        for (size_t j = 0; j < size; j += PAGE) b[i][j] = (unsigned char)(seed + i + j / PAGE);
    }
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < size; j += PAGE) sum += b[i][j];
        free(b[i]);
    }
    return sum;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: phases ROUNDS NA SA NB SB\n");
        return 2;
    }
    int rounds = atoi(argv[1]), na = atoi(argv[2]), nb = atoi(argv[4]);
    size_t sa = strtoul(argv[3], NULL, 10), sb = strtoul(argv[5], NULL, 10);
    if (na < 0 || na > MAX_BLOCKS || nb < 0 || nb > MAX_BLOCKS) return 2;
    uint64_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        sum += phase(na, sa, (uint64_t)r);
        sum += phase(nb, sb, (uint64_t)r + 7);
    }
    printf("%llu\n", (unsigned long long)sum);
    const char *hwm = getenv("PHASES_VMHWM");
    FILE *f = hwm && !strcmp(hwm, "1") ? fopen("/proc/self/status", "r") : NULL;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) fputs(line, stderr);
    if (f) fclose(f);
    return 0;
}
