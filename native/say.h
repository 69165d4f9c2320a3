/*
 * The one output path of every heapcast LD_PRELOAD library (the tracer, heapcast.c; the layers,
 * layers/layer.c and layers/place.c): text built in a stack buffer and written with write(2).
 * One copy, included once per library.
 *
 * Why: the libraries speak (a refusal, the stats line, a file of sites) from inside someone
 * else's program: in a malloc hook, at start-up before the real allocator is known, in a
 * destructor, in a fork child. So nothing here allocates, takes a lock or calls stdio (snprintf
 * may malloc), every function is async-signal-safe, a write interrupted by a signal or cut short
 * goes on, and errno is what it was (the program may be about to read it).
 *
 * Building a line: each hc_text_* appends to [p, end) and returns the new p, never past end (what
 * does not fit is cut); the caller keeps room for its last character ("\n") by passing end - 1.
 */
#ifndef HEAPCAST_SAY_H
#define HEAPCAST_SAY_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* s, up to end */
static inline char *hc_text(char *p, char *end, const char *s) {
    while (*s && p < end) *p++ = *s++;
    return p;
}

/* v in decimal, up to end (the last digits cut where it does not fit) */
static inline char *hc_text_u64(char *p, char *end, uint64_t v) {
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n && p < end) *p++ = d[--n];
    return p;
}

/* v in lower-case hexadecimal, without a prefix (printf's %lx) */
static inline char *hc_text_hex(char *p, char *end, uint64_t v) {
    char d[16];
    int n = 0;
    do d[n++] = "0123456789abcdef"[v & 15], v >>= 4;
    while (v);
    while (n && p < end) *p++ = d[--n];
    return p;
}

/* All of s[0..len) to fd: EINTR and partial writes go on; a failure stops quietly (the program's
 * own output is never touched). errno kept. */
static inline void hc_write_all(int fd, const char *s, size_t len) {
    int saved = errno;
    while (len > 0) {
        ssize_t w = write(fd, s, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        s += w;
        len -= (size_t)w;
    }
    errno = saved;
}

/* One line "<who><a><b><c><d>\n" on stderr (at most 767 characters and the newline); who names
 * the library ("heapcast layer: "). */
static inline void hc_say_line(const char *who, const char *a, const char *b, const char *c,
                        const char *d) {
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    p = hc_text(p, end, who);
    p = hc_text(p, end, a);
    p = hc_text(p, end, b);
    p = hc_text(p, end, c);
    p = hc_text(p, end, d);
    *p++ = '\n';
    hc_write_all(2, line, (size_t)(p - line));
}

#endif
