/* fork + exec. `forkexec <how>`: the parent mallocs 111, forks; the child mallocs 222 (left in
 * its buffer, never freed) and execs this program again as `forkexec exec-child` with the exec
 * function named by <how> (execve, execv, execvp, execvpe, execl, execlp, execle); the exec'd
 * image mallocs 444 and frees it, then exits 5. The parent waits, mallocs 333, prints
 * "child <pid>". `forkexec self` execs directly (no fork) after malloc(555). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int do_exec(const char *how, const char *self) {
    char *argv[] = {(char *)self, "exec-child", NULL};
    if (!strcmp(how, "execve")) return execve(self, argv, environ);
    if (!strcmp(how, "execv")) return execv(self, argv);
    if (!strcmp(how, "execvp")) return execvp(self, argv);
    if (!strcmp(how, "execvpe")) return execvpe(self, argv, environ);
    if (!strcmp(how, "execl")) return execl(self, self, "exec-child", (char *)NULL);
    if (!strcmp(how, "execlp")) return execlp(self, self, "exec-child", (char *)NULL);
    if (!strcmp(how, "execle")) return execle(self, self, "exec-child", (char *)NULL, environ);
    return -1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "exec-child")) {
        void *p = malloc(444);
        free(p);
        return 5;
    }
    if (argc > 1 && !strcmp(argv[1], "self")) {
        void *p = malloc(555);
        (void)p;
        execv(argv[0], (char *[]){argv[0], "exec-child", NULL});
        return 100;
    }
    const char *how = argc > 1 ? argv[1] : "execve";
    void *a = malloc(111);
    pid_t pid = fork();
    if (pid == 0) {
        void *b = malloc(222);
        (void)b;
        do_exec(how, argv[0]);
        _exit(100); /* exec failed */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    void *c = malloc(333);
    free(c);
    free(a);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 5) return 1;
    printf("child %d\n", (int)pid);
    return 0;
}
