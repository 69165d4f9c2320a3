/* The call-site key of a return address, as tasks/learning/sites.py computes it from a traced
 * row (native/TABLE.md, The call site): the module holding the address, named as the tracer
 * names it (the loader's name, the main program by /proc/self/exe's target), crc32(path) << 32
 * xor (address - load bias), times 0x9E3779B97F4A7C15, xor itself shifted right by 29, modulo
 * HC_SITES. Shared by the cache layer (layers/layer.c: a free's key in the reuse table) and the
 * placement layer (layers/place.c: an allocation's key in the lifetime table), so that both ask
 * the key the training data names; the frame key under it (hc_frame_key, before the hash) is
 * what the calling contexts fold (context_key.h).
 *
 * The module is found by glibc's _dl_find_object (2.35+), else by walking dl_iterate_phdr's
 * list under the loader's lock; each return address's answer is remembered in a direct-mapped
 * cache of words (address << 16 | (site + 1) << 1 | 1) written and read whole, without a lock:
 * a word is never torn, and one overwritten is found again. No allocation anywhere. Call it
 * holding no lock of the library's own (the loader's lock may be taken inside, and a thread
 * holding it may be allocating). Known limits: a module unloaded and another loaded at its
 * addresses keeps the first's answers unless the layer calls hc_frame_forget at the unload (the
 * placement layer hooks dlclose); a library dlopen'ed by a relative name is hashed by that
 * name, where the tracer makes it absolute; an address no module held when first asked (-1)
 * stays -1.
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

/* The vocabulary's hash of a frame key (below): the call site the one-frame tables name. */
static inline int hc_site_mix(uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return (int)(h % HC_SITES);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
extern int _dl_find_object(void *, struct dl_find_object *) __attribute__((weak));
#endif

struct hc_site_query {
    uintptr_t addr;
    uintptr_t bias;
    uint32_t crc;
    int found;
};

/* The module's name as the tracer records it ("" is the main program: /proc/self/exe). */
static uint32_t hc_module_crc(const char *name) {
    size_t len = strlen(name);
    return len ? hc_crc32(name, len) : hc_crc32(hc_site_exe, hc_site_exe_len);
}

static int hc_site_module(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct hc_site_query *q = data;
    uint64_t lo, hi, bias = (uint64_t)info->dlpi_addr;
    if (!hc_module_range(info, &lo, &hi) || q->addr < bias + lo || q->addr >= bias + hi) return 0;
    q->crc = hc_module_crc(info->dlpi_name ? info->dlpi_name : "");
    q->bias = (uintptr_t)bias;
    q->found = 1;
    return 1;
}

/* The module holding `a`: its name's crc32 and its load bias; 0 where none holds it. */
static int hc_module_of(uintptr_t a, uint32_t *crc, uintptr_t *bias) {
    struct hc_site_query q = {a, 0, 0, 0};
#ifdef DLFO_STRUCT_HAS_EH_DBASE
    /* glibc 2.35+: the loader's own lock-free lookup (made for unwinders), reading only its
     * tables; dl_iterate_phdr reads every module's program headers, pages a process may never
     * have touched (page faults: README.md, History) */
    if (_dl_find_object != NULL) {
        struct dl_find_object fo;
        if (_dl_find_object((void *)a, &fo) == 0 && fo.dlfo_link_map != NULL) {
            const struct link_map *lm = fo.dlfo_link_map;
            q.crc = hc_module_crc(lm->l_name ? lm->l_name : "");
            q.bias = (uintptr_t)lm->l_addr;
            q.found = 1;
        }
    } else
#endif
        dl_iterate_phdr(hc_site_module, &q);
    *crc = q.crc;
    *bias = q.bias;
    return q.found;
}

/* The call-site key of a call returning to `ret`; -1 where no module holds it. */
static int hc_site_of(const void *ret) {
    uintptr_t a = (uintptr_t)ret;
    if (a == 0) return -1;
    uint64_t *slot =
        &hc_site_cache[(uint64_t)a * 0x9E3779B97F4A7C15ull >> (64 - HC_SITE_CACHE_BITS)];
    uint64_t w = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if ((w & 1) && (w >> 16) == (uint64_t)a) return (int)((w >> 1) & 0x7FFF) - 1;
    uint32_t crc;
    uintptr_t bias;
    int site = hc_module_of(a, &crc, &bias) ? hc_site_mix((uint64_t)crc << 32 ^ (a - bias)) : -1;
    if ((uint64_t)a >> 48 == 0) /* user addresses fit 48 bits: else asked again next time */
        __atomic_store_n(slot, (uint64_t)a << 16 | (uint64_t)(site + 1) << 1 | 1,
                         __ATOMIC_RELAXED);
    return site;
}

/* ---- the frame key: what the calling contexts fold (context_key.h) --------------------------- */

/* A frame's key, before the vocabulary's hash: crc32(path) << 32 xor offset, or the address
 * itself where no module holds it (tasks/dataset/sites.py site_keys; the dataset's frames in no
 * module keep their raw address). Each module seen gets an entry of hc_frame_mods, written once
 * and never changed (two threads meeting a module together may both add it: harmless); each
 * return address's answer is remembered in a direct-mapped cache of words (address << 16 |
 * entry + 1, HC_FRAME_NONE where no module holds it), published after its entry (release) and
 * read whole (acquire). A full module table leaves the address uncached (asked again). */
#define HC_FRAME_MODS 4096u
#define HC_FRAME_NONE 0xFFFFu
#define HC_FRAME_CACHE_BITS 14
static struct hc_frame_mod {
    uint64_t bias;
    uint32_t crc;
} hc_frame_mods[HC_FRAME_MODS];
static uint32_t hc_frame_nmods;
static uint64_t hc_frame_cache[1u << HC_FRAME_CACHE_BITS];

static __attribute__((noinline)) uint64_t hc_frame_key_miss(uintptr_t a, uint64_t *slot) {
    uint32_t crc;
    uintptr_t bias;
    uint64_t entry = HC_FRAME_NONE, key = a;
    if (hc_module_of(a, &crc, &bias)) {
        key = (uint64_t)crc << 32 ^ (uint64_t)(a - bias);
        uint32_t n = __atomic_load_n(&hc_frame_nmods, __ATOMIC_ACQUIRE);
        if (n > HC_FRAME_MODS) n = HC_FRAME_MODS;
        for (uint32_t i = 0; i < n && entry == HC_FRAME_NONE; i++)
            if (__atomic_load_n(&hc_frame_mods[i].bias, __ATOMIC_RELAXED) == bias &&
                __atomic_load_n(&hc_frame_mods[i].crc, __ATOMIC_RELAXED) == crc)
                entry = i + 1;
        if (entry == HC_FRAME_NONE) {
            uint32_t i = __atomic_fetch_add(&hc_frame_nmods, 1, __ATOMIC_ACQ_REL);
            if (i >= HC_FRAME_MODS) return key; /* full: not cached */
            __atomic_store_n(&hc_frame_mods[i].bias, bias, __ATOMIC_RELAXED);
            __atomic_store_n(&hc_frame_mods[i].crc, crc, __ATOMIC_RELAXED);
            entry = i + 1;
        }
    }
    if ((uint64_t)a >> 48 == 0)
        __atomic_store_n(slot, (uint64_t)a << 16 | entry, __ATOMIC_RELEASE);
    return key;
}

static inline uint64_t hc_frame_key(uintptr_t a) {
    uint64_t *slot =
        &hc_frame_cache[(uint64_t)a * 0x9E3779B97F4A7C15ull >> (64 - HC_FRAME_CACHE_BITS)];
    uint64_t w = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (__builtin_expect(w != 0 && (w >> 16) == (uint64_t)a, 1)) {
        uint64_t e = w & 0xFFFF;
        if (e == HC_FRAME_NONE) return a;
        const struct hc_frame_mod *m = &hc_frame_mods[e - 1];
        return (uint64_t)m->crc << 32 ^ (uint64_t)(a - m->bias);
    }
    return hc_frame_key_miss(a, slot);
}

/* A module was unloaded: another may now sit at its addresses. */
static inline void hc_frame_forget(void) {
    memset(hc_frame_cache, 0, sizeof hc_frame_cache);
    memset(hc_site_cache, 0, sizeof hc_site_cache);
}

#endif
