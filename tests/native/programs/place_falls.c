/* One call site whose blocks live long, then die young, then live long again: the placement
 * layer's counter calls the site long, then short (its verdict falls), then long again.
 *
 *   place_falls KEPT BRIEF      KEPT blocks kept to the end, BRIEF freed at once, KEPT more kept */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __attribute__((noinline)) unsigned char *make(unsigned seed)
{
    unsigned char *p = malloc(200); /* the one site */
    if (p) memset(p, (int)(seed & 0xff), 200);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    long kept_n = atol(argv[1]), brief = atol(argv[2]);
    unsigned char **kept = calloc(2 * (size_t)kept_n, sizeof *kept);
    if (!kept) return 1;
    unsigned long sum = 0;
    for (long i = 0; i < 2 * kept_n; i++) {
        if (i == kept_n) /* the middle phase: blocks that die at once */
            for (long j = 0; j < brief; j++) {
                unsigned char *p = make((unsigned)j);
                if (!p) return 1;
                sum += p[0];
                free(p);
            }
        if (!(kept[i] = make((unsigned)i))) return 1;
        sum += kept[i][199];
    }
    for (long i = 0; i < 2 * kept_n; i++) free(kept[i]);
    free(kept);
    printf("kept=%ld brief=%ld sum=%lu\n", 2 * kept_n, brief, sum);
    return 0;
}
