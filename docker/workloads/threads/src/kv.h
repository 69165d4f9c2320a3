/* The wire protocol between hc-kvserver and hc-loadgen (heapcast's service workload).
 *
 * A request is a fixed header, then `size` payload bytes for a PUT; every request gets a reply:
 * a u64 length, then that many bytes. Both ends are little-endian x86-64 processes in one
 * container, so the header travels as the struct's bytes. */
#ifndef HEAPCAST_KV_H
#define HEAPCAST_KV_H

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <unistd.h>

enum kv_op { KV_PUT = 1, KV_GET = 2, KV_SCAN = 3, KV_SHUTDOWN = 4 };

struct kv_request {
    uint32_t op;
    uint32_t key;
    uint32_t size; /* PUT: payload bytes; SCAN: how many records to render */
    uint32_t stride; /* SCAN: records key, key + stride, key + 2 stride, ... */
};

/* Requests and replies go out in pieces (header, then payload) and wait for an answer: without
 * TCP_NODELAY, Nagle's algorithm and delayed ACKs hold each exchange for tens of ms. */
static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int read_full(int fd, void *buf, size_t n)
{ /* 0: all read; -1: error or the peer closed */
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

#endif
