/* Benchmark workload for the placement layer (issue 45): a key-value service whose footprint rises
 * and falls, leaving long-lived state behind. BURSTS bursts; in each, SHORT request buffers
 * (32..288 bytes, from new_request) interleaved with one long-lived entry (same sizes, from
 * new_entry, a distinct call site) every EVERY requests; at the burst's end every request buffer
 * is freed, the entries stay. After each burst and at the end the process's resident set
 * (/proc/self/statm) goes to stderr ("rss_kb burst=I N", "rss_kb end N"); stdout gets one
 * checksum line, the same under every allocator. Usage: burstkv BURSTS SHORT EVERY [wrap]
 * wrap: every block (the requests, the entries, the two arrays) comes from one allocation
 * wrapper, xmalloc, as in programs that check every malloc in one place: one call site for all,
 * the requests and the entries told apart by xmalloc's callers (the calling context) alone. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t lcg = 42;
static unsigned next_size(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return 32 + (unsigned)((lcg >> 33) % 257);
}

static int wrap; /* every block through xmalloc */

/* The wrapper: one call site of malloc for every block of a wrap run. */
__attribute__((noinline)) static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) exit(3);
    return p;
}

__attribute__((noinline)) static char *new_request(size_t n) {
    char *p = wrap ? xmalloc(n) : malloc(n);
    if (!p) exit(3);
    memset(p, (int)(n & 0xff), n);
    return p;
}

__attribute__((noinline)) static char *new_entry(size_t n) {
    char *p = wrap ? xmalloc(n) : malloc(n);
    if (!p) exit(3);
    memset(p, (int)(n & 0x7f), n);
    return p;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && !strcmp(argv[4], "wrap"))) return 2;
    wrap = argc == 5;
    int bursts = atoi(argv[1]);
    long shorts = atol(argv[2]), every = atol(argv[3]);
    if (bursts <= 0 || shorts <= 0 || every <= 0) return 2;
    size_t req_bytes = (size_t)shorts * sizeof(char *);
    char **req = wrap ? xmalloc(req_bytes) : malloc(req_bytes);
    long nent = (long)bursts * (shorts / every + 1);
    size_t ent_bytes = (size_t)nent * sizeof(char *);
    char **ent = wrap ? xmalloc(ent_bytes) : malloc(ent_bytes);
    if (!req || !ent) return 3;
    long ne = 0;
    uint64_t sum = 0;
    for (int b = 0; b < bursts; b++) {
        for (long i = 0; i < shorts; i++) {
            size_t n = next_size();
            req[i] = new_request(n);
            if (i % every == 0) ent[ne++] = new_entry(next_size());
        }
        for (long i = 0; i < shorts; i++) {
            sum += (unsigned char)req[i][0];
            free(req[i]);
        }
        fprintf(stderr, "rss_kb burst=%d %ld\n", b, rss_kb());
    }
    for (long i = 0; i < ne; i++) sum += (unsigned char)ent[i][1];
    fprintf(stderr, "rss_kb end %ld\n", rss_kb());
    printf("entries=%ld sum=%llu\n", ne, (unsigned long long)sum);
    for (long i = 0; i < ne; i++) free(ent[i]);
    free(ent);
    free(req);
    return 0;
}
