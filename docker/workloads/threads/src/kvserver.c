/* hc-kvserver: a small key-value service, one thread per connection (as many services are), for
 * heapcast's service workload. Values are allocated by the thread of the connection that PUTs
 * them and freed by whichever later thread replaces them; every request also allocates and
 * frees its own temporaries (payload buffer, rendered records, reply). Under glibc each new
 * thread may get an arena of its own, and what one arena frees the others cannot reuse: the
 * resident size grows with the number of arenas, which is what MALLOC_ARENA_MAX and the other
 * allocators change.
 *
 *   hc-kvserver PORT READY_FILE     serve on 127.0.0.1:PORT; create READY_FILE once listening
 *
 * A SHUTDOWN request stops it after every connection has ended; it then prints what it holds
 * (deterministic for a fixed request mix) and frees it. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kv.h"

enum { KEYS = 1 << 16, STRIPES = 64, MAX_VALUE = 1 << 22, MAX_SCAN = 100000 };

struct value {
    size_t size;
    unsigned char bytes[];
};

static struct value *table[KEYS];
static pthread_mutex_t stripes[STRIPES];
static _Atomic long requests, connections, live_threads;
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static volatile int stopping;
static int listener;

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "hc-kvserver: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static int reply(int fd, const void *bytes, uint64_t n)
{
    return write_full(fd, &n, sizeof n) || (n && write_full(fd, bytes, n)) ? -1 : 0;
}

static int do_put(int fd, const struct kv_request *rq)
{
    if (rq->size > MAX_VALUE)
        return -1;
    unsigned char *payload = xmalloc(rq->size + 1); /* the request's buffer, freed here */
    if (read_full(fd, payload, rq->size) != 0) {
        free(payload);
        return -1;
    }
    struct value *v = xmalloc(sizeof *v + rq->size); /* the stored copy, freed by a later PUT */
    v->size = rq->size;
    memcpy(v->bytes, payload, rq->size);
    free(payload);
    pthread_mutex_t *m = &stripes[rq->key % STRIPES];
    pthread_mutex_lock(m);
    struct value *old = table[rq->key % KEYS];
    table[rq->key % KEYS] = v;
    pthread_mutex_unlock(m);
    free(old);
    uint64_t ack = rq->size;
    return reply(fd, &ack, sizeof ack);
}

static int do_get(int fd, const struct kv_request *rq)
{
    pthread_mutex_t *m = &stripes[rq->key % STRIPES];
    pthread_mutex_lock(m);
    struct value *v = table[rq->key % KEYS];
    size_t n = v ? v->size : 0;
    unsigned char *out = xmalloc(n + 1); /* the reply, copied under the lock, sent after */
    if (v)
        memcpy(out, v->bytes, n);
    pthread_mutex_unlock(m);
    int rc = reply(fd, out, n);
    free(out);
    return rc;
}

static int do_scan(int fd, const struct kv_request *rq)
{
    /* render `size` records as text lines, each a string of its own, then join them */
    uint32_t stride = rq->stride ? rq->stride : 1;
    uint32_t n = rq->size > MAX_SCAN ? MAX_SCAN : rq->size;
    char **lines = xmalloc((n + 1) * sizeof *lines);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t key = (rq->key + i * stride) % KEYS;
        pthread_mutex_t *m = &stripes[key % STRIPES];
        pthread_mutex_lock(m);
        size_t size = table[key] ? table[key]->size : 0;
        unsigned first = table[key] && size ? table[key]->bytes[0] : 0;
        pthread_mutex_unlock(m);
        char tmp[96];
        int len = snprintf(tmp, sizeof tmp, "key=%u size=%zu first=%u\n", key, size, first);
        lines[i] = xmalloc((size_t)len + 1);
        memcpy(lines[i], tmp, (size_t)len + 1);
        total += (size_t)len;
    }
    char *out = xmalloc(total + 1), *p = out;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(lines[i]);
        memcpy(p, lines[i], len);
        p += len;
        free(lines[i]);
    }
    free(lines);
    int rc = reply(fd, out, total);
    free(out);
    return rc;
}

static void *serve(void *arg)
{
    int fd = (int)(long)arg;
    struct kv_request rq;
    while (read_full(fd, &rq, sizeof rq) == 0) {
        int rc;
        if (rq.op == KV_PUT)
            rc = do_put(fd, &rq);
        else if (rq.op == KV_GET)
            rc = do_get(fd, &rq);
        else if (rq.op == KV_SCAN)
            rc = do_scan(fd, &rq);
        else if (rq.op == KV_SHUTDOWN) {
            stopping = 1;
            shutdown(listener, SHUT_RD); /* wakes the accept loop (Linux: accept fails) */
            uint64_t ack = 0;
            rc = reply(fd, &ack, sizeof ack) ? -1 : 1;
        } else
            rc = -1;
        if (rc != 0)
            break;
        atomic_fetch_add(&requests, 1);
    }
    close(fd);
    pthread_mutex_lock(&done_lock);
    if (atomic_fetch_sub(&live_threads, 1) == 1)
        pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: hc-kvserver PORT READY_FILE\n");
        return 2;
    }
    for (int i = 0; i < STRIPES; i++)
        pthread_mutex_init(&stripes[i], NULL);
    listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 128) != 0) {
        perror("hc-kvserver: bind/listen");
        return 2;
    }
    FILE *ready = fopen(argv[2], "w");
    if (ready == NULL) {
        perror("hc-kvserver: ready file");
        return 2;
    }
    fclose(ready);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (!stopping) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0)
            continue;
        no_delay(fd);
        atomic_fetch_add(&connections, 1);
        atomic_fetch_add(&live_threads, 1);
        pthread_t tid;
        if (pthread_create(&tid, &attr, serve, (void *)(long)fd) != 0) {
            fprintf(stderr, "hc-kvserver: pthread_create failed\n");
            return 2;
        }
    }
    close(listener);
    pthread_mutex_lock(&done_lock);
    while (atomic_load(&live_threads) > 0)
        pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
    long keys = 0;
    unsigned long long bytes = 0;
    for (int k = 0; k < KEYS; k++)
        if (table[k]) {
            keys++;
            bytes += table[k]->size;
            free(table[k]);
        }
    printf("hc-kvserver connections=%ld requests=%ld keys=%ld bytes=%llu\n",
           atomic_load(&connections), atomic_load(&requests), keys, bytes);
    return 0;
}
