/* A loaded ELF module's address range, as the tracer records it (FORMAT.md, Modules) and the
 * layer's call-site key finds it (TABLE.md): [bias + lo, bias + hi) over its PT_LOAD segments'
 * virtual addresses, bias being the module's load bias (dlpi_addr). Shared by heapcast.c and
 * layers/layer.c so that a site the dataset names is the site the layer computes. */
#ifndef HEAPCAST_MODULE_RANGE_H
#define HEAPCAST_MODULE_RANGE_H

#include <link.h>
#include <stdint.h>

/* lo, hi: the lowest and the end of the highest PT_LOAD segment (ELF virtual addresses); 0 if the
 * module has none. */
static inline int hc_module_range(const struct dl_phdr_info *info, uint64_t *lo, uint64_t *hi) {
    uint64_t a = UINT64_MAX, b = 0;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        if (ph->p_vaddr < a) a = ph->p_vaddr;
        if (ph->p_vaddr + ph->p_memsz > b) b = ph->p_vaddr + ph->p_memsz;
    }
    *lo = a;
    *hi = b;
    return b > a;
}

#endif
