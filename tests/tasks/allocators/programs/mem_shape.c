/* A run whose memory rises and falls: MB megabytes mapped and touched, held HOLD_MS
 * milliseconds, unmapped, then IDLE_MS milliseconds with next to nothing. Its peak is about MB,
 * its memory averaged over the run about MB * HOLD_MS / (HOLD_MS + IDLE_MS). Built statically
 * (tests/tasks/allocators/test_measure_docker.py), so that it runs in any image.
 * usage: mem_shape MB HOLD_MS IDLE_MS */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mem_shape MB HOLD_MS IDLE_MS\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 3;
    memset(p, 1, bytes);
    sleep_ms(atol(argv[2]));
    munmap(p, bytes);
    sleep_ms(atol(argv[3]));
    printf("held %s MB\n", argv[1]);
    return 0;
}
