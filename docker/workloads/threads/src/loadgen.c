/* hc-loadgen: the load generator of heapcast's service workload, a fixed request mix against
 * hc-kvserver from client threads, each over a series of short sessions (one connection each,
 * so the server starts a thread per session, as a service's clients come and go).
 *
 *   hc-loadgen PORT SEED SESSIONS CLIENTS      SESSIONS per client, 200 requests each
 *
 * Client c owns keys c, c + CLIENTS, ...; so what each GET sees depends on its own requests
 * only, never on the scheduling. Mix: 45% GET, 35% PUT (100 B - 4 KiB; one in 20 from 64 KiB to
 * 512 KiB), 20% SCAN (10 - 199 records of its own keys). Prints the totals and a checksum of
 * every reply, then asks the server to shut down. */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kv.h"
#include "stress.h"

enum { REQUESTS = 200, KEYS_PER_CLIENT = 512 };

static long sessions, clients;
static uint64_t seed;
static int port;
static _Atomic uint64_t checksum, reply_bytes, sent;

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        perror("hc-loadgen: connect");
        exit(2);
    }
    no_delay(fd);
    return fd;
}

/* one request and its reply; returns the reply's hash (length and a few sampled bytes) */
static uint64_t call(int fd, const struct kv_request *rq, const void *payload, unsigned char **buf,
                     size_t *cap)
{
    uint64_t n;
    if (write_full(fd, rq, sizeof *rq) || (rq->op == KV_PUT && write_full(fd, payload, rq->size)) ||
        read_full(fd, &n, sizeof n)) {
        fprintf(stderr, "hc-loadgen: the server closed the connection\n");
        exit(2);
    }
    if (n > *cap) {
        free(*buf);
        *cap = n;
        *buf = malloc(n);
        if (*buf == NULL)
            die("out of memory");
    }
    if (n && read_full(fd, *buf, n)) {
        fprintf(stderr, "hc-loadgen: short reply\n");
        exit(2);
    }
    atomic_fetch_add(&reply_bytes, n);
    uint64_t h = mix64(n ^ ((uint64_t)rq->op << 56));
    for (uint64_t i = 0; i < n; i += 4093)
        h = mix64(h ^ (*buf)[i]);
    if (n)
        h = mix64(h ^ (*buf)[n - 1]);
    return h;
}

static void *client(void *arg)
{
    long c = (long)arg;
    uint64_t rng = rng_seed(seed, 1, (uint64_t)c);
    uint64_t sum = 0;
    size_t cap = 0, pcap = 0;
    unsigned char *buf = NULL, *payload = NULL;
    for (long s = 0; s < sessions; s++) {
        int fd = dial();
        for (int r = 0; r < REQUESTS; r++) {
            uint64_t pick = rng_below(&rng, 100);
            struct kv_request rq = {0};
            rq.key = (uint32_t)(c + clients * (long)rng_below(&rng, KEYS_PER_CLIENT));
            if (pick < 45) {
                rq.op = KV_GET;
            } else if (pick < 80) {
                rq.op = KV_PUT;
                rq.size = (uint32_t)(rng_below(&rng, 20) == 0
                                         ? 65536 + rng_below(&rng, 512 * 1024 - 65536)
                                         : 100 + rng_below(&rng, 4096 - 100));
                if (rq.size > pcap) {
                    free(payload);
                    pcap = rq.size;
                    payload = malloc(pcap);
                    if (payload == NULL)
                        die("out of memory");
                }
                memset(payload, (int)(rng_next(&rng) & 0xff), rq.size);
                payload[0] = (unsigned char)(rq.key * 7 + (uint32_t)s);
            } else {
                rq.op = KV_SCAN;
                rq.size = (uint32_t)(10 + rng_below(&rng, 190));
                rq.stride = (uint32_t)clients; /* its own keys only */
            }
            sum += call(fd, &rq, payload, &buf, &cap);
            atomic_fetch_add(&sent, 1);
        }
        close(fd);
    }
    free(buf);
    free(payload);
    atomic_fetch_add(&checksum, sum);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        die("usage: hc-loadgen PORT SEED SESSIONS CLIENTS");
    port = (int)arg_long(argv[1], "PORT", 1, 65535);
    seed = (uint64_t)arg_long(argv[2], "SEED", 0, 1L << 40);
    sessions = arg_long(argv[3], "SESSIONS", 1, 1000000);
    clients = arg_long(argv[4], "CLIENTS", 1, 128);
    pthread_t *tid = calloc((size_t)clients, sizeof *tid);
    for (long c = 0; c < clients; c++)
        if (pthread_create(&tid[c], NULL, client, (void *)c) != 0)
            die("pthread_create failed");
    for (long c = 0; c < clients; c++)
        pthread_join(tid[c], NULL);
    free(tid);
    /* the totals first, flushed: the server prints its own line once it has shut down, and
     * the two share the workload's standard output, so this order is the only one */
    printf("hc-loadgen clients=%ld sessions=%ld requests=%llu reply_bytes=%llu checksum=%016llx\n",
           clients, sessions, (unsigned long long)atomic_load(&sent),
           (unsigned long long)atomic_load(&reply_bytes), (unsigned long long)atomic_load(&checksum));
    fflush(stdout);
    int fd = dial();
    struct kv_request rq = {.op = KV_SHUTDOWN};
    size_t cap = 0;
    unsigned char *buf = NULL;
    call(fd, &rq, NULL, &buf, &cap);
    free(buf);
    close(fd);
    return 0;
}
