/* Prints a fixed text with stdio (which allocates) and exits 3. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    char *p = malloc(64);
    snprintf(p, 64, "hello %d", 42);
    printf("%s\nsecond line\n", p);
    free(p);
    return 3;
}
