/* Prints the sizes and offsets of heapcast_format.h as JSON, for comparison with the Python
 * reader's dtype (tests/native/test_format_layout.py). */
#include <stddef.h>
#include <stdio.h>

#include "heapcast_format.h"

#define H(f) printf("\"%s\": %zu, ", #f, offsetof(struct hc_header, f))
#define R(f) printf("\"%s\": %zu, ", #f, offsetof(struct hc_record, f))

int main(void) {
    printf("{\"header_size\": %zu, \"record_size\": %zu, \"record_caller_size\": %zu, ",
           sizeof(struct hc_header), sizeof(struct hc_record), sizeof(struct hc_record_caller));
    printf("\"caller\": %zu, ", offsetof(struct hc_record_caller, caller));
    printf("\"record_stack_size\": %zu, \"stack\": %zu, \"stack_caller\": %zu, \"flag_stacks\": %u, ",
           sizeof(struct hc_record_stack), offsetof(struct hc_record_stack, stack),
           offsetof(struct hc_record_stack, caller), HC_FLAG_STACKS);
    printf("\"header\": {");
    H(magic); H(version); H(header_size); H(record_size); H(flags); H(pid); H(ppid);
    H(start_realtime_ns); H(start_monotonic_ns); H(start_ticks); H(ns_per_tick); H(clock);
    H(cmdline_len);
    printf("\"reserved\": %zu}, \"record\": {", offsetof(struct hc_header, reserved));
    R(time); R(addr); R(arg);
    printf("\"packed\": %zu}, ", offsetof(struct hc_record, packed));
    printf("\"size_bits\": %d, \"op_shift\": %d, \"thread_shift\": %d, \"ops\": {", HC_SIZE_BITS,
           HC_OP_SHIFT, HC_THREAD_SHIFT);
    printf("\"MALLOC\": %d, \"CALLOC\": %d, \"REALLOC\": %d, \"REALLOCARRAY\": %d, \"FREE\": %d, ",
           HC_OP_MALLOC, HC_OP_CALLOC, HC_OP_REALLOC, HC_OP_REALLOCARRAY, HC_OP_FREE);
    printf("\"POSIX_MEMALIGN\": %d, \"ALIGNED_ALLOC\": %d, \"MEMALIGN\": %d, \"VALLOC\": %d, ",
           HC_OP_POSIX_MEMALIGN, HC_OP_ALIGNED_ALLOC, HC_OP_MEMALIGN, HC_OP_VALLOC);
    printf("\"PVALLOC\": %d, \"THREAD_START\": %d, \"MODULE\": %d, \"MODULE_PATH\": %d, "
           "\"STACK_NODE\": %d}, ",
           HC_OP_PVALLOC, HC_OP_THREAD_START, HC_OP_MODULE, HC_OP_MODULE_PATH, HC_OP_STACK_NODE);
    printf("\"version\": %u, \"module_path_chunk\": %u}\n", HC_VERSION, HC_MODULE_PATH_CHUNK);
    return 0;
}
