/* Known call paths into one allocation wrapper, for the export tests: main -> small_path ->
 * wrapper allocates 3 blocks of 100 bytes (freed), main -> big_path -> wrapper 2 blocks of
 * 5000 bytes (never freed). Built -O0 with frame pointers; noinline keeps every frame. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static void *wrapper(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    return p;
}

__attribute__((noinline)) static void small_path(void) {
    for (int i = 0; i < 3; i++) {
        void *p = wrapper(100);
        free(p);
    }
}

__attribute__((noinline)) static void *big_path(void) { return wrapper(5000); }

int main(void) {
    small_path();
    void *a = big_path();
    void *b = big_path();
    printf("%p %p\n", a, b != NULL ? (void *)1 : NULL);
    return 0;
}
