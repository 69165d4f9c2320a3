/* A shared library for `hot_caller dlopen` (tests/native/test_caller_modules.py). */
#include <stdlib.h>

__attribute__((noinline)) void *plugin_allocate(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}
