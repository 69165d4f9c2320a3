/* The 32-byte head both layers' table files start with (native/TABLE.md, Layout): 8 bytes of
 * magic, then little-endian u32 format version, model version, shape (the reuse table's tokens,
 * the lifetime table's size classes), payload bytes, and the u64 FNV-1a of the payload. Shared
 * by the cache layer (layers/layer/table.c, hl_load_table) and the placement layer
 * (layers/place.c, hp_load_life), so that both refuse a short file, a foreign one or another
 * format alike; what the shape and payload must be stays with each loader.
 *
 * One pread into a stack buffer, no allocation and no stdio: it runs inside the program's first
 * hooked call or the layer's constructor.
 *
 * Use: a loader declares its kind once with HC_TABLE_KIND (the refusals' words are built there,
 * each with the loader's fallback sentence, so none is written twice), then after open():
 *     why = hc_read_table_head(fd, &kind, &head); if (why) goto out;
 */
#ifndef HEAPCAST_TABLE_HEAD_H
#define HEAPCAST_TABLE_HEAD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define HC_TABLE_HEAD_BYTES 32 /* the payload starts here */

struct hc_table_head {
    uint32_t version; /* the file's format version */
    uint32_t model;   /* the registered model version it was written for (0: none) */
    uint32_t shape;   /* tokens (the reuse table) or size classes (the lifetime table) */
    uint32_t bytes;   /* the payload's length */
    uint64_t sum;     /* FNV-1a 64 of the payload */
};

/* One loader's table kind: its magic, the format versions it reads, and its refusals. */
struct hc_table_kind {
    const char *magic;       /* the file's first 8 bytes */
    uint32_t first, last;    /* the format versions read: first..last */
    const char *short_why;   /* fewer than 32 bytes */
    const char *magic_why;   /* another magic */
    const char *version_why; /* a version outside first..last */
};

/* A kind's initializer: `magic` (8 bytes), `name` ("layer table": the magic refusal says "is not
 * a heapcast <name>"), the versions first..last it reads and how its refusal says them (`reads`:
 * "this layer reads <reads>"), and `fallback`, appended to every refusal (what answers instead).
 * All string literals: the refusals are constants, nothing is formatted at run time. */
#define HC_TABLE_KIND(magic, name, first, last, reads, fallback)                                   \
    {                                                                                              \
        (magic), (first), (last), "is shorter than its 32-byte header" fallback,                  \
            "is not a heapcast " name " (magic)" fallback,                                         \
            "has another format version (this layer reads " reads ")" fallback                     \
    }

/* Read fd's head into *h and check its magic and format version against `kind`: NULL, or why
 * the file is refused (the kind's words). *h is filled as far as it was read: the fields are
 * set once the magic matched, so a version refusal still has them. */
static inline const char *hc_read_table_head(int fd, const struct hc_table_kind *kind,
                                             struct hc_table_head *h) {
    unsigned char head[HC_TABLE_HEAD_BYTES];
    if (pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head) return kind->short_why;
    if (memcmp(head, kind->magic, 8) != 0) return kind->magic_why;
    memcpy(&h->version, head + 8, 4);
    memcpy(&h->model, head + 12, 4);
    memcpy(&h->shape, head + 16, 4);
    memcpy(&h->bytes, head + 20, 4);
    memcpy(&h->sum, head + 24, 8);
    if (h->version < kind->first || h->version > kind->last) return kind->version_why;
    return NULL;
}

#endif
