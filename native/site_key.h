/* The call-site key of a return address, as tasks/learning/sites.py computes it from a traced
 * row (native/TABLE.md, The call site): the module holding the address, named as the tracer
 * names it (the loader's name, the main program by /proc/self/exe's target), crc32(path) << 32
 * xor (address - load bias), times 0x9E3779B97F4A7C15, xor itself shifted right by 29, modulo
 * HC_SITES. Shared by the cache layer (layers/layer.c: a free's key in the reuse table) and the
 * placement layer (layers/place.c: an allocation's key in the lifetime table), so that both ask
 * the key the training data names.
 *
 * The module is found by glibc's _dl_find_object (2.35+), else by walking dl_iterate_phdr's
 * list under the loader's lock; each return address's answer is remembered in a direct-mapped
 * cache of words (address << 16 | (site + 1) << 1 | 1) written and read whole, without a lock:
 * a word is never torn, and one overwritten is found again. No allocation anywhere. Call it
 * holding no lock of the library's own (the loader's lock may be taken inside, and a thread
 * holding it may be allocating). Known limits: a module unloaded and another loaded at its
 * addresses keeps the first's answers (as the tracer's module map does, FORMAT.md); a library
 * dlopen'ed by a relative name is hashed by that name, where the tracer makes it absolute; an
 * address no module held when first asked (-1) stays -1.
 *
 * Use: hc_site_init() once at start (reads /proc/self/exe), then hc_site_of(return address).
 */
#ifndef HEAPCAST_SITE_KEY_H
#define HEAPCAST_SITE_KEY_H

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "module_range.h"

#define HC_SITES 4096u /* tasks/learning/sites.py SITE_VOCABULARY */
#define HC_SITE_CACHE_BITS 10

static char hc_site_exe[4096]; /* /proc/self/exe's target, read at start */
static size_t hc_site_exe_len;
static uint64_t hc_site_cache[1u << HC_SITE_CACHE_BITS];

/* Once, before the first hc_site_of: the main program's name as the tracer records it. */
static void hc_site_init(void) {
    ssize_t n = readlink("/proc/self/exe", hc_site_exe, sizeof hc_site_exe - 1);
    hc_site_exe_len = n > 0 ? (size_t)n : 0;
}

static uint32_t hc_crc32(const char *s, size_t n) { /* zlib's crc32: reflected 0xEDB88320 */
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= (unsigned char)s[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* The key of a call from `offset` bytes past the load bias of the module the loader names
 * `name` ("" for the main program, which is named by its path as the tracer names it). */
static int hc_site_key(const char *name, uintptr_t offset) {
    size_t len = strlen(name);
    if (len == 0) {
        name = hc_site_exe;
        len = hc_site_exe_len;
    }
    uint64_t h = ((uint64_t)hc_crc32(name, len) << 32) ^ (uint64_t)offset;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return (int)(h % HC_SITES);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
extern int _dl_find_object(void *, struct dl_find_object *) __attribute__((weak));
#endif

struct hc_site_query {
    uintptr_t addr;
    int site;
};

static int hc_site_module(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct hc_site_query *q = data;
    uint64_t lo, hi, bias = (uint64_t)info->dlpi_addr;
    if (!hc_module_range(info, &lo, &hi) || q->addr < bias + lo || q->addr >= bias + hi) return 0;
    q->site = hc_site_key(info->dlpi_name ? info->dlpi_name : "", q->addr - bias);
    return 1;
}

/* The call-site key of a call returning to `ret`; -1 where no module holds it. */
static int hc_site_of(const void *ret) {
    uintptr_t a = (uintptr_t)ret;
    if (a == 0) return -1;
    uint64_t *slot =
        &hc_site_cache[(uint64_t)a * 0x9E3779B97F4A7C15ull >> (64 - HC_SITE_CACHE_BITS)];
    uint64_t w = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if ((w & 1) && (w >> 16) == (uint64_t)a) return (int)((w >> 1) & 0x7FFF) - 1;
    struct hc_site_query q = {a, -1};
#ifdef DLFO_STRUCT_HAS_EH_DBASE
    /* glibc 2.35+: the loader's own lock-free lookup (made for unwinders), reading only its
     * tables; dl_iterate_phdr reads every module's program headers, pages a process may never
     * have touched (page faults: README.md, History) */
    if (_dl_find_object != NULL) {
        struct dl_find_object fo;
        if (_dl_find_object((void *)a, &fo) == 0 && fo.dlfo_link_map != NULL) {
            const struct link_map *lm = fo.dlfo_link_map;
            q.site = hc_site_key(lm->l_name ? lm->l_name : "", a - (uintptr_t)lm->l_addr);
        }
    } else
#endif
        dl_iterate_phdr(hc_site_module, &q);
    if ((uint64_t)a >> 48 == 0) /* user addresses fit 48 bits: else asked again next time */
        __atomic_store_n(slot, (uint64_t)a << 16 | (uint64_t)(q.site + 1) << 1 | 1,
                         __ATOMIC_RELAXED);
    return q.site;
}

#endif
