/* A known call tree for the tracer's stacks (tests/native/test_call_stacks.py holds the same
 * tree as the stacks it expects). Every allocation the test checks has a size of its own, 7000
 * and up, so the test knows the path it came from; every function on a path is noipa (neither
 * inlined, cloned nor merged) and does work after each call, so no call is a tail call and each
 * function keeps its frame at -O2.
 *
 *   7005, 7020  recursion_case -> recurse x6 / x21 -> xmalloc   (recursion 5 and 20 levels deep)
 *   7101..7104  one wrapper (xmalloc) from four paths: parse_config, load_table, grow_table, main
 *   7201, 7203  a SIGVTALRM handler interrupting spin_until_alarm, then spin_again (signal_case)
 *               -> xmalloc: the two loops have the same frame at the same stack pointer, so
 *               the handler's frames are at the same addresses both times, and only the
 *               interrupted code (the signal frame's saved registers) tells the stacks apart
 *   7202        a SIGUSR1 handler run by raise() in raise_case -> xmalloc
 *   7204        a SIGUSR2 handler on an alternate signal stack (a malloc'd block, far from the
 *               thread's stack) run by raise() in altstack_case -> xmalloc
 *   7301..7303  longjmp_case: jump_outer -> jump_middle -> jump_inner -> xmalloc, which jumps back
 *               to longjmp_case (7301); then after_jump -> xmalloc (7302) and the same nested
 *               path without the jump (7303)
 *   7501..7503  three threads: thread_a -> a_work, thread_b -> b_work -> b_deeper, thread_c ->
 *               recurse x4, each -> xmalloc
 *   7305        big_frame_case, a frame of 2 MiB (alloca) -> big_inner -> xmalloc
 *   7601        a fork child: fork_case -> child_work -> xmalloc
 *   7602        a fork child before exec: exec_case -> pre_exec_work -> xmalloc, then it execs
 *               argv[1] (the C++ program calltree_cxx.cpp), whose allocations are its own
 *   7801        nocfi_case -> nocfi_alloc, a hand-written function without unwind information,
 *               -> malloc
 *   7802        jit_case -> code copied into an mmap'd executable page (no module, no unwind
 *               information) -> malloc
 *
 * Usage: calltree [CXX_PROGRAM]. Prints one line per case (the same traced or not) and exits 3.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOIPA __attribute__((noipa))
/* a use of p after the call: the call before it cannot become a jump */
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

NOIPA void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) abort();
    KEEP(p);
    return p;
}

/* ---- recursion of a known depth: recurse(n) calls itself n times, then xmalloc */
NOIPA void *recurse(int n, size_t size) {
    void *p = n > 0 ? recurse(n - 1, size) : xmalloc(size);
    KEEP(p);
    return p;
}

NOIPA void recursion_case(void) {
    free(recurse(5, 7005));
    free(recurse(20, 7020));
    printf("recursion 5 and 20\n");
}

/* ---- one wrapper, several callers */
NOIPA void *parse_config(void) {
    void *p = xmalloc(7101);
    KEEP(p);
    return p;
}

NOIPA void *grow_table(void) {
    void *p = xmalloc(7103);
    KEEP(p);
    return p;
}

NOIPA void *load_table(int grow) {
    void *p = grow ? grow_table() : xmalloc(7102);
    KEEP(p);
    return p;
}

NOIPA void wrapper_case(void) {
    free(parse_config());
    free(load_table(0));
    free(load_table(1));
    printf("wrapper from three paths\n");
}

/* ---- a signal handler that allocates, over a loop it interrupts and over raise() */
static volatile sig_atomic_t got_alarm;
static volatile unsigned long spins;
static void *alarm_block, *usr1_block;
static size_t alarm_size;

NOIPA void on_alarm(int sig) {
    alarm_block = xmalloc(alarm_size);
    got_alarm = sig;
}

NOIPA void on_usr1(int sig) {
    usr1_block = xmalloc(7202);
    KEEP(usr1_block);
}

NOIPA void arm_alarm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGVTALRM, &sa, NULL);
    /* user CPU time: it expires while the loop runs, so the handler interrupts the loop */
    struct itimerval t = {.it_value = {.tv_sec = 0, .tv_usec = 20000}};
    setitimer(ITIMER_VIRTUAL, &t, NULL);
}

NOIPA void spin_until_alarm(void) {
    arm_alarm();
    while (!got_alarm) spins++;
}

/* spin_until_alarm's twin, apart from one more iteration's worth of work */
NOIPA void spin_again(void) {
    arm_alarm();
    while (!got_alarm) spins += 2;
}

NOIPA void signal_case(void) {
    alarm_size = 7201;
    spin_until_alarm();
    void *first = alarm_block;
    got_alarm = 0;
    alarm_size = 7203;
    spin_again();
    free(first);
    free(alarm_block);
    printf("signal handler over two loops\n");
}

NOIPA void raise_case(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    free(usr1_block);
    printf("signal handler under raise\n");
}

NOIPA void on_usr2(int sig) {
    usr1_block = xmalloc(7204);
    KEEP(usr1_block);
}

NOIPA void altstack_case(void) {
    stack_t alt = {.ss_sp = xmalloc(1 << 16), .ss_size = 1 << 16}, old;
    sigaltstack(&alt, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR2, &sa, NULL);
    raise(SIGUSR2);
    sigaltstack(&old, NULL);
    free(usr1_block);
    free(alt.ss_sp);
    printf("signal handler on an alternate stack\n");
}

/* ---- a frame larger than most: 2 MiB of the 8 MiB stack */
NOIPA void *big_inner(void) {
    void *p = xmalloc(7305);
    KEEP(p);
    return p;
}

NOIPA void big_frame_case(size_t bytes) {
    char *buf = __builtin_alloca(bytes);
    memset(buf, 1, 64);
    void *p = big_inner();
    KEEP(buf);
    KEEP(p);
    free(p);
    printf("a frame of %zu KiB\n", bytes >> 10);
}

/* ---- longjmp out of a nested path, then allocating again */
static jmp_buf jump_back;
static void *jumped_block;

NOIPA void *jump_inner(size_t size, int jump) {
    void *p = xmalloc(size);
    if (jump) {
        jumped_block = p;
        longjmp(jump_back, 1);
    }
    KEEP(p);
    return p;
}

NOIPA void *jump_middle(size_t size, int jump) {
    void *p = jump_inner(size, jump);
    KEEP(p);
    return p;
}

NOIPA void *jump_outer(size_t size, int jump) {
    void *p = jump_middle(size, jump);
    KEEP(p);
    return p;
}

NOIPA void *after_jump(void) {
    void *p = xmalloc(7302);
    KEEP(p);
    return p;
}

NOIPA void longjmp_case(void) {
    if (setjmp(jump_back) == 0) jump_outer(7301, 1);
    free(jumped_block);
    free(after_jump());
    free(jump_outer(7303, 0));
    printf("longjmp out of three frames\n");
}

/* ---- threads, each with its own path */
NOIPA void *a_work(void) {
    void *p = xmalloc(7501);
    KEEP(p);
    return p;
}

NOIPA void *b_deeper(void) {
    void *p = xmalloc(7502);
    KEEP(p);
    return p;
}

NOIPA void *b_work(void) {
    void *p = b_deeper();
    KEEP(p);
    return p;
}

NOIPA void *thread_a(void *arg) {
    free(a_work());
    return arg;
}

NOIPA void *thread_b(void *arg) {
    free(b_work());
    return arg;
}

NOIPA void *thread_c(void *arg) {
    free(recurse(3, 7503));
    return arg;
}

NOIPA void threads_case(void) {
    void *(*bodies[])(void *) = {thread_a, thread_b, thread_c};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, bodies[i], NULL);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    printf("three threads\n");
}

/* ---- fork, and fork + exec */
NOIPA void *child_work(void) {
    void *p = xmalloc(7601);
    KEEP(p);
    return p;
}

NOIPA void *pre_exec_work(void) {
    void *p = xmalloc(7602);
    KEEP(p);
    return p;
}

NOIPA int wait_child(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

NOIPA void fork_case(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        free(child_work());
        exit(0);
    }
    printf("fork child exited %d\n", wait_child(pid));
}

NOIPA void exec_case(const char *program) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        void *kept = pre_exec_work();
        KEEP(kept);
        execl(program, program, (char *)NULL);
        _exit(100);
    }
    printf("exec child exited %d\n", wait_child(pid));
}

/* ---- frames without unwind information */
void *nocfi_alloc(size_t n);
/* hand-written, no .cfi directives: .eh_frame has nothing for it */
__asm__(".text\n"
        ".globl nocfi_alloc\n"
        ".type nocfi_alloc, @function\n"
        "nocfi_alloc:\n"
        "  subq $8, %rsp\n"
        "  call malloc@PLT\n"
        "  addq $8, %rsp\n"
        "  ret\n"
        ".size nocfi_alloc, .-nocfi_alloc\n");

NOIPA void nocfi_case(void) {
    void *p = nocfi_alloc(7801);
    KEEP(p);
    free(p);
    printf("no unwind information\n");
}

NOIPA void jit_case(void) {
    /* sub $8,%rsp; movabs $malloc,%rax; call *%rax; add $8,%rsp; ret: the size is already in
     * %rdi, the first argument of the copied function and of malloc */
    unsigned char code[] = {0x48, 0x83, 0xec, 0x08, 0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0,
                            0xff, 0xd0, 0x48, 0x83, 0xc4, 0x08, 0xc3};
    void *(*target)(size_t) = malloc;
    memcpy(code + 6, &target, sizeof target);
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *mem =
        mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) abort();
    memcpy(mem, code, sizeof code);
    if (mprotect(mem, (size_t)page, PROT_READ | PROT_EXEC) != 0) abort();
    void *(*jitted)(size_t) = (void *(*)(size_t))mem;
    void *p = jitted(7802);
    KEEP(p);
    free(p);
    munmap(mem, (size_t)page);
    printf("jitted code\n");
}

int main(int argc, char **argv) {
    recursion_case();
    wrapper_case();
    free(xmalloc(7104));
    signal_case();
    raise_case();
    altstack_case();
    big_frame_case(2 << 20);
    longjmp_case();
    threads_case();
    fork_case();
    if (argc > 1) exec_case(argv[1]);
    nocfi_case();
    jit_case();
    return 3;
}
