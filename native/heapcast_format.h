/*
 * heapcast raw trace format, version 3: the C mirror of native/FORMAT.md.
 *
 * FORMAT.md is the spec; this header only restates it for the tracer, and the static asserts
 * below pin every size and offset the spec gives. tests/native/test_format_layout.py compiles a
 * program that prints these sizes/offsets and compares them with tasks/trace_reader.py's dtype.
 *
 * All fields are little-endian (the tracer only targets little-endian machines; see the assert).
 */
#ifndef HEAPCAST_FORMAT_H
#define HEAPCAST_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define HC_MAGIC "HEAPCAST" /* 8 bytes, no NUL in the file */
#define HC_VERSION 3u /* 3: stack records (HC_OP_STACK_NODE); 2: module records with the caller */

#define HC_FLAG_CALLER 1u /* bit 0: records carry the caller's return address */
#define HC_FLAG_STACKS 2u /* bit 1: records carry a stack id (only with bit 0) */

#define HC_CLOCK_MONOTONIC 1u /* record time = CLOCK_MONOTONIC ns, ns_per_tick = 1 */
#define HC_CLOCK_TSC 2u       /* record time = rdtsc ticks */

#define HC_CMDLINE_MAX 4096u /* bytes of /proc/self/cmdline kept in the header */

/* Header: 80 fixed bytes, then cmdline_len bytes of command line, zero-padded to header_size =
 * round_up(80 + cmdline_len, 8). Records start at header_size. */
struct hc_header {
    char magic[8];               /*  0 */
    uint32_t version;            /*  8 */
    uint32_t header_size;        /* 12 */
    uint32_t record_size;        /* 16 */
    uint32_t flags;              /* 20 */
    uint32_t pid;                /* 24 */
    uint32_t ppid;               /* 28 */
    uint64_t start_realtime_ns;  /* 32 */
    uint64_t start_monotonic_ns; /* 40 */
    uint64_t start_ticks;        /* 48 */
    double ns_per_tick;          /* 56 */
    uint32_t clock;              /* 64 */
    uint32_t cmdline_len;        /* 68 */
    uint64_t reserved;           /* 72 */
};

/* Record: 32 bytes, or 40 with the caller (flags bit 0). */
struct hc_record {
    uint64_t time;   /*  0: record clock ticks */
    uint64_t addr;   /*  8: returned / freed address, 0 on failure */
    uint64_t arg;    /* 16: old address (realloc*), alignment, page size, or OS tid */
    uint64_t packed; /* 24: bits 0-39 size, 40-47 op, 48-63 thread number */
};

struct hc_record_caller {
    struct hc_record r; /*  0 */
    uint64_t caller;    /* 32: return address of the call */
};

/* Record with the stack (flags bit 1): 48 bytes. */
struct hc_record_stack {
    struct hc_record r; /*  0 */
    uint64_t caller;    /* 32: return address of the call */
    uint64_t stack;     /* 40: STACK_NODE id of the call's innermost frame, 0: none */
};

#define HC_SIZE_BITS 40
#define HC_SIZE_MAX ((UINT64_C(1) << HC_SIZE_BITS) - 1) /* sizes saturate here */
#define HC_OP_SHIFT 40
#define HC_THREAD_SHIFT 48
#define HC_THREAD_MAX 65535u /* later threads share this number */

enum hc_op {
    HC_OP_MALLOC = 1,
    HC_OP_CALLOC = 2,
    HC_OP_REALLOC = 3,
    HC_OP_REALLOCARRAY = 4,
    HC_OP_FREE = 5,
    HC_OP_POSIX_MEMALIGN = 6,
    HC_OP_ALIGNED_ALLOC = 7,
    HC_OP_MEMALIGN = 8,
    HC_OP_VALLOC = 9,
    HC_OP_PVALLOC = 10,
    HC_OP_THREAD_START = 64,
    HC_OP_MODULE = 65,      /* version 2, caller traces only: a mapped ELF module (see below) */
    HC_OP_MODULE_PATH = 66, /* version 2: HC_MODULE_PATH_CHUNK bytes of the preceding module's path */
    HC_OP_STACK_NODE = 67,  /* version 3, stack traces only: a node of the process's stack trie */
};

/* Module records (version 2, written only when flags bit 0 is set, so always 40 bytes):
 *   HC_OP_MODULE:      time = ticks, addr = lowest mapped address, arg = end (exclusive),
 *                      size bits = path length in bytes, caller = load bias (run-time address of
 *                      ELF virtual address 0);
 *   HC_OP_MODULE_PATH: time, addr, arg = the next HC_MODULE_PATH_CHUNK bytes of the path
 *                      (zero-padded), size bits = bytes used, caller = 0.
 * A module record is followed directly by ceil(path length / 24) path records. */
#define HC_MODULE_PATH_CHUNK 24u

/* Stack node records (version 3, flags bit 1, so 48 bytes): time = ticks, addr = node id,
 * arg = parent node id (0: the root), size bits = depth (1: the root's child), caller = the
 * frame's address, stack = 0. Written once per process, before the first record that uses the
 * node in the writing thread's stream. */
#define HC_FRAMES_MAX 128u /* HEAPCAST_FRAMES at most */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "heapcast traces are little-endian");
_Static_assert(sizeof(double) == 8, "ns_per_tick is an IEEE f64");

_Static_assert(sizeof(struct hc_header) == 80, "header fixed part is 80 bytes");
_Static_assert(offsetof(struct hc_header, magic) == 0, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, version) == 8, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, header_size) == 12, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, record_size) == 16, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, flags) == 20, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, pid) == 24, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, ppid) == 28, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, start_realtime_ns) == 32, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, start_monotonic_ns) == 40, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, start_ticks) == 48, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, ns_per_tick) == 56, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, clock) == 64, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, cmdline_len) == 68, "FORMAT.md header offsets");
_Static_assert(offsetof(struct hc_header, reserved) == 72, "FORMAT.md header offsets");

_Static_assert(sizeof(struct hc_record) == 32, "record is 32 bytes");
_Static_assert(offsetof(struct hc_record, time) == 0, "FORMAT.md record offsets");
_Static_assert(offsetof(struct hc_record, addr) == 8, "FORMAT.md record offsets");
_Static_assert(offsetof(struct hc_record, arg) == 16, "FORMAT.md record offsets");
_Static_assert(offsetof(struct hc_record, packed) == 24, "FORMAT.md record offsets");
_Static_assert(sizeof(struct hc_record_caller) == 40, "record with caller is 40 bytes");
_Static_assert(offsetof(struct hc_record_caller, caller) == 32, "FORMAT.md record offsets");
_Static_assert(sizeof(struct hc_record_stack) == 48, "record with stack is 48 bytes");
_Static_assert(offsetof(struct hc_record_stack, stack) == 40, "FORMAT.md record offsets");

#endif /* HEAPCAST_FORMAT_H */
