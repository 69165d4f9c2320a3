/*
 * The layer's in-process predictor: the online counter of tasks/learning/online.py with orders
 * (2, 1) and the unigram, for one thread, predict then update.
 *
 * Tokens are the project's (tasks/dataset/tokens.py): an allocation of n bytes is
 * min(bit_length(n), 31), a free is 32 + the token of the freed block's requested size.
 *
 * Rule (the same as online.py's with orders=(2, 1)): the answering context is the longest of
 * (previous two tokens, previous token, nothing) seen before in this thread; its top-1 is the
 * token with the highest count after it, ties to the token that reached that count last. At a
 * thread's first position nothing answers (top1 = HCP_NONE). `hcp_answer` equals
 * online_features(tokens, offsets, orders=(2, 1)) row for row (top1, order, count, total):
 * tests/native/test_layer.py holds it on a token sequence.
 *
 * Why orders (2, 1) and exact counts instead of online.py's hashed (12, 8, ..., 1): the layer
 * answers only on the calls it can act on (blocks of at least `min` bytes), a short alphabet
 * where two calls of context already separate the phases (alloc A, free A, alloc A, ...), and
 * exact count rows make both the update (three increments, three compares) and the question
 * the guided policy asks (hcp_soon: "is class c among the k most likely calls at one of the next
 * h calls?", one pass over a 64-entry row per step) branch-light and free of hashing. Memory: ~1.1 MiB of address space per thread
 * (mmapped by the layer, only the rows of contexts a thread meets are ever touched).
 *
 * Counts are 32-bit: a context would need 2^32 calls to wrap.
 */
#ifndef HEAPCAST_PREDICTOR_H
#define HEAPCAST_PREDICTOR_H

#include <stdint.h>
#include <string.h>

#define HCP_TOKENS 64
#define HCP_NONE 64 /* top1 when nothing answers (online.py's NO_TOKEN) */
#define HCP_FREE 32 /* a free's token: HCP_FREE + the freed block's class */
#define HCP_LIKELY(x) __builtin_expect(!!(x), 1)

struct hcp_counter {
    uint64_t n_seen;
    uint8_t h1, h2; /* the previous token, the one before */
    uint8_t top0;
    uint32_t c0[HCP_TOKENS];
    uint8_t top1[HCP_TOKENS];
    uint32_t c1[HCP_TOKENS][HCP_TOKENS];
    uint8_t top2[HCP_TOKENS * HCP_TOKENS];
    uint32_t c2[HCP_TOKENS * HCP_TOKENS][HCP_TOKENS];
};

/* The answer for the next call: online_features' (top1, order, count, total), and the answering
 * context's count row (NULL when nothing answers). order: 1 = the two-token context, 2 = the
 * one-token context, 0 = the unigram or nothing. total: hcp_answer's only (0 from
 * hcp_answer_at). A context was seen iff its top-1's count is not 0. */
struct hcp_answer {
    uint8_t top1, order;
    uint32_t count, total;
    const uint32_t *row;
};

static inline unsigned hcp_class(size_t n) {
    unsigned b = n ? 64u - (unsigned)__builtin_clzll((unsigned long long)n) : 0u;
    return b < 31u ? b : 31u;
}

/* The answer after a history whose length is `seen` and whose last two tokens are h2, h1. */
static inline struct hcp_answer hcp_answer_at(const struct hcp_counter *c, uint64_t seen,
                                              unsigned h2, unsigned h1) {
    struct hcp_answer a = {HCP_NONE, 0, 0, 0, NULL};
    if (seen >= 2) {
        unsigned ctx = h2 * HCP_TOKENS + h1;
        const uint32_t *row = c->c2[ctx];
        if (row[c->top2[ctx]]) {
            a.top1 = c->top2[ctx];
            a.order = 1;
            a.row = row;
            a.count = row[a.top1];
            return a;
        }
    }
    if (seen >= 1) {
        if (c->c1[h1][c->top1[h1]]) {
            a.top1 = c->top1[h1];
            a.order = 2;
            a.row = c->c1[h1];
        } else {
            a.top1 = c->top0;
            a.row = c->c0;
        }
        a.count = a.row[a.top1];
    }
    return a;
}

/* The answer for the thread's next call, with its total (the row's sum: counted here, not kept
 * per row, since only the tests and tools ask it, never the layer's question). */
static inline struct hcp_answer hcp_answer(const struct hcp_counter *c) {
    struct hcp_answer a = hcp_answer_at(c, c->n_seen, c->h2, c->h1);
    if (a.row)
        for (unsigned t = 0; t < HCP_TOKENS; t++) a.total += a.row[t];
    return a;
}

static inline void hcp_bump(uint32_t *row, uint8_t *top, unsigned y) {
    uint32_t v = ++row[y];
    if (v >= row[*top]) *top = (uint8_t)y; /* ties: the token that reached the count last */
}

/* Learn the thread's next token y (0..63). */
static inline void hcp_learn(struct hcp_counter *c, unsigned y) {
    /* locals: the rows are written through pointers that may alias the history bytes */
    uint64_t seen = c->n_seen;
    unsigned h1 = c->h1, h2 = c->h2;
    hcp_bump(c->c0, &c->top0, y);
    if (HCP_LIKELY(seen >= 2)) {
        unsigned ctx = h2 * HCP_TOKENS + h1;
        hcp_bump(c->c2[ctx], &c->top2[ctx], y);
    }
    if (HCP_LIKELY(seen >= 1)) hcp_bump(c->c1[h1], &c->top1[h1], y);
    c->h2 = (uint8_t)h1;
    c->h1 = (uint8_t)y;
    c->n_seen = seen + 1;
}

/* Is token y among the k (>= 1) most likely next tokens of the answering context? (seen after it
 * at least once, and fewer than k tokens counted strictly more often; ties count for y). The
 * top-1's count is the row's largest: y equal to it needs no scan, nor does k = 1 otherwise. */
static inline int hcp_in_top(const struct hcp_answer *a, unsigned y, unsigned k) {
    if (a->row == NULL || a->row[y] == 0) return 0;
    uint32_t v = a->row[y];
    if (a->top1 == y || v == a->row[a->top1]) return 1;
    if (k <= 1) return 0;
    unsigned above = 0;
    for (unsigned t = 0; t < HCP_TOKENS; t += 16) { /* 16 at a time: vectorised, early exit */
        for (unsigned j = 0; j < 16; j++) above += a->row[t + j] > v;
        if (above >= k) return 0;
    }
    return 1;
}

/* Is y among the k most likely tokens at one of the next `horizon` calls? The context is rolled
 * forward with each step's top-1 (the counter's single most likely continuation; nothing is
 * learnt): "a call of y comes soon" as far as the thread's own past tells. */
static inline int hcp_soon(const struct hcp_counter *c, unsigned y, unsigned k, unsigned horizon) {
    uint64_t seen = c->n_seen;
    unsigned h2 = c->h2, h1 = c->h1;
    for (unsigned s = 0; s < horizon; s++) {
        struct hcp_answer a = hcp_answer_at(c, seen, h2, h1);
        if (hcp_in_top(&a, y, k)) return 1;
        if (a.top1 == HCP_NONE) return 0;
        h2 = h1;
        h1 = a.top1;
        seen++;
    }
    return 0;
}

#endif
