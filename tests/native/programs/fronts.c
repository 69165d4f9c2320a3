/* Large blocks across threads, for the heapcast layer's per-thread fronts (pools, guided: the
 * block a thread kept last waits in that thread's own slot, outside the shared cache).
 * usage:
 *   fronts doublefree SIZE   thread A mallocs, writes and frees a block (into A's front) and
 *                            stays alive; main frees the block again: a double free from another
 *                            thread. Then A and main each malloc SIZE and print "same" or
 *                            "distinct" if the program survives (glibc kills it at the second
 *                            free; a layer must pass it through, never hand the block out twice).
 *   fronts idle SIZE         thread A mallocs, writes and frees a block (into A's front) and
 *                            waits; meanwhile main mallocs SIZE, writes it and frees it.
 *                            Prints "done".
 *   fronts exit SIZE N       N threads one after another: each mallocs, writes and frees a block
 *                            of SIZE, and exits. Prints "done".
 *   fronts relay SIZE N ITERS  N threads, ITERS rounds each: malloc SIZE, stamp the block with
 *                            (thread, round, length) at both ends (SIZE, 1.5 or 2 x SIZE), trade it through a shared mailbox
 *                            for a block another thread stamped, check that block's stamps and
 *                            free it (so most frees are of blocks another thread made). A block
 *                            handed to two owners at once shows as a broken stamp. Prints
 *                            "ok CHECKED" or "broken ..." (exit 1). Main relays ITERS rounds
 *                            first, alone: the threads start on what it kept with the process
 *                            single-threaded (no locks taken; see hl_single_threaded).
 *   fronts late SIZE         main mallocs, writes and frees a block alone (into its front, no
 *                            lock taken), then a thread frees it again and mallocs SIZE, as
 *                            does main; prints "same" or "distinct" as doublefree. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t size;

/* After a double free: main mallocs SIZE beside the block q another thread got; prints "same"
 * (the one block handed to two owners: exit 1) or "distinct" (exit 0); 2 when a malloc failed. */
static int same_or_distinct(char *q) {
    char *r = malloc(size);
    if (!q || !r) return 2;
    printf("%s\n", q == r ? "same" : "distinct");
    fflush(stdout);
    return q == r ? 1 : 0;
}

/* doublefree ------------------------------------------------------------------------------- */
static pthread_barrier_t bar;
static char *shared;

static void *first_owner(void *arg) {
    shared = malloc(size);
    if (!shared) exit(2);
    memset(shared, 1, size);
    free(shared);
    pthread_barrier_wait(&bar); /* main frees it again */
    pthread_barrier_wait(&bar);
    *(char **)arg = malloc(size);
    return NULL;
}

static int doublefree(void) {
    pthread_t t;
    char *q = NULL;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_create(&t, NULL, first_owner, &q);
    pthread_barrier_wait(&bar);
    free(shared); /* the second free, from another thread */
    pthread_barrier_wait(&bar);
    pthread_join(t, NULL);
    return same_or_distinct(q);
}

static char *late_block;

static void *second_free(void *arg) {
    free(late_block); /* the second free, from a thread that did not exist at the first */
    *(char **)arg = malloc(size);
    return NULL;
}

static int late(void) {
    late_block = malloc(size);
    if (!late_block) return 2;
    memset(late_block, 6, size);
    free(late_block); /* kept with the process single-threaded */
    pthread_t t;
    char *q = NULL;
    pthread_create(&t, NULL, second_free, &q);
    pthread_join(t, NULL);
    return same_or_distinct(q);
}

/* idle ------------------------------------------------------------------------------------- */
static void *idle_owner(void *arg) {
    char *p = malloc(size);
    if (!p) exit(2);
    memset(p, 4, size);
    free(p);
    pthread_barrier_wait(&bar); /* main takes its block meanwhile */
    pthread_barrier_wait(&bar);
    return arg;
}

static int idle(void) {
    pthread_t t;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_create(&t, NULL, idle_owner, NULL);
    pthread_barrier_wait(&bar);
    char *q = malloc(size);
    if (!q) return 2;
    memset(q, 5, size);
    free(q);
    pthread_barrier_wait(&bar);
    pthread_join(t, NULL);
    printf("done\n");
    return 0;
}

/* exit ------------------------------------------------------------------------------------- */
static void *one_block(void *arg) {
    char *p = malloc(size);
    if (!p) exit(2);
    memset(p, 3, size);
    free(p);
    return arg;
}

static int exits(int n) {
    for (int i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, NULL, one_block, NULL);
        pthread_join(t, NULL);
    }
    printf("done\n");
    return 0;
}

/* relay ------------------------------------------------------------------------------------ */
#define BOX 4
static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static char *box[BOX];
static long rounds;
static long checked;
static int broken;

struct stamp {
    long thread, round;
    size_t len;
};

static void stamp(char *p, size_t len, long thread, long round) {
    struct stamp s = {thread, round, len};
    memcpy(p, &s, sizeof s);
    memcpy(p + len - sizeof s, &s, sizeof s);
}

static int stamped_once(const char *p) {
    struct stamp a, b;
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + a.len - sizeof b, sizeof b);
    return a.thread == b.thread && a.round == b.round && a.len == b.len;
}

static void *relay(void *arg) {
    long me = (long)arg, mine = 0;
    for (long i = 0; i < rounds; i++) {
        size_t len = size + (size_t)((i + me) % 3) * (size / 2); /* three sizes: not all fit */
        char *p = malloc(len);
        if (!p) exit(2);
        stamp(p, len, me, i);
        pthread_mutex_lock(&box_lock);
        char *q = box[i % BOX];
        box[i % BOX] = p;
        pthread_mutex_unlock(&box_lock);
        if (q == NULL) continue;
        if (!stamped_once(q)) __atomic_store_n(&broken, 1, __ATOMIC_RELAXED);
        struct stamp was;
        memcpy(&was, q, sizeof was);
        stamp(q, was.len, -1, -1); /* unstamped before it goes: a later owner stamps anew */
        free(q);
        mine++;
    }
    __atomic_fetch_add(&checked, mine, __ATOMIC_RELAXED);
    return NULL;
}

static int relays(int n) {
    pthread_t t[64];
    relay((void *)(long)n); /* main alone first: a single-threaded process */
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, relay, (void *)i);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < BOX; i++) {
        if (box[i] && !stamped_once(box[i])) broken = 1;
        free(box[i]);
    }
    if (broken) {
        printf("broken stamps\n");
        return 1;
    }
    printf("ok %ld\n", checked);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size = (size_t)strtoull(argv[2], NULL, 10);
    if (size < 2 * sizeof(struct stamp)) return 2;
    if (!strcmp(argv[1], "doublefree")) return doublefree();
    if (!strcmp(argv[1], "idle")) return idle();
    if (!strcmp(argv[1], "late")) return late();
    if (!strcmp(argv[1], "exit") && argc == 4) return exits(atoi(argv[3]));
    if (!strcmp(argv[1], "relay") && argc == 5) {
        int n = atoi(argv[3]);
        rounds = atol(argv[4]);
        if (n < 1 || n > 64) return 2;
        return relays(n);
    }
    return 2;
}
