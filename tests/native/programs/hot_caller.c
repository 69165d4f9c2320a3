/* Most heap calls come from one function with a known name, for the caller tests
 * (tests/native/test_caller_modules.py):
 *   hot_caller            hot_allocator: 3000 mallocs (1000 never freed); main: 10 calls
 *   hot_caller fork       the same in a forked child, the parent only waits
 *   hot_caller dlopen SO  after start, dlopen SO and call its plugin_allocate 20000 times
 *                         (more than a buffer: the module is recorded at a flush, not at exit) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) void *hot_allocator(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory"); /* not a tail call: the return address stays here */
    return p;
}

static void *leaked[1000];

static int work(void) {
    for (int i = 0; i < 2000; i++) free(hot_allocator(16 + (size_t)i % 512));
    for (int i = 0; i < 1000; i++) leaked[i] = hot_allocator(64);
    for (int i = 0; i < 10; i++) free(malloc(8));
    return leaked[999] == NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) _exit(work());
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    }
    if (argc > 2 && strcmp(argv[1], "dlopen") == 0) {
        void *h = dlopen(argv[2], RTLD_NOW);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            return 4;
        }
        void *(*f)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_allocate");
        if (!f) return 5;
        for (int i = 0; i < 20000; i++) free(f(32));
        return 0;
    }
    return work();
}
