/* One call site whose blocks first live long, then die young: the placement layer's counter calls
 * the site long in phase 1, and in phase 2 every block it places long dies at once.
 *
 *   place_turn KEPT BRIEF      KEPT blocks kept to the end, then BRIEF blocks freed at once */
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
    unsigned char **kept = calloc((size_t)kept_n, sizeof *kept);
    if (!kept) return 1;
    unsigned long sum = 0;
    for (long i = 0; i < kept_n; i++) {
        if (!(kept[i] = make((unsigned)i))) return 1;
        sum += kept[i][199];
    }
    for (long i = 0; i < brief; i++) {
        unsigned char *p = make((unsigned)i);
        if (!p) return 1;
        sum += p[0];
        free(p);
    }
    for (long i = 0; i < kept_n; i++) free(kept[i]);
    free(kept);
    printf("kept=%ld brief=%ld sum=%lu\n", kept_n, brief, sum);
    return 0;
}
