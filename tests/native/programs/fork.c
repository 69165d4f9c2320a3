/* GIVEN a parent with unflushed records, WHEN it forks, THEN the child writes its own file.
 * Parent: malloc(111) x3, fork; child: malloc(222) x2, free both, then exits with exit() or
 * _exit() (argv[1]); parent waits, malloc(333), frees everything, exits 0. Prints nothing
 * until the end; output "child <pid>" from the parent. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int use__exit = argc > 1 && strcmp(argv[1], "_exit") == 0;
    void *a[3];
    for (int i = 0; i < 3; i++) a[i] = malloc(111);
    pid_t pid = fork();
    if (pid == 0) {
        void *b0 = malloc(222), *b1 = malloc(222);
        free(b0);
        free(b1);
        if (use__exit) _exit(7);
        exit(7);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    void *c = malloc(333);
    free(c);
    for (int i = 0; i < 3; i++) free(a[i]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 7) return 1;
    printf("child %d\n", (int)pid);
    return 0;
}
