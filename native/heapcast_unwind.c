/* The unwinder (x86-64): part of heapcast.c (the tracer's stacks) and of context_key.h (the
 * layers' calling context), one translation unit each; never compiled alone. The includer
 * defines HC_LIKELY, HC_UNLIKELY and HC_NOINLINE and includes <link.h>, <string.h> and
 * <sys/mman.h>.
 *
 * What it does: from a hook's frame, the return addresses of its callers, innermost first
 * (FORMAT.md, Stacks). How: each frame is stepped with one rule read from the module's own
 * DWARF call frame information (.eh_frame, found through .eh_frame_hdr's sorted table), as
 * bytehound's unwinder does; unlike libunwind or libgcc, the rule of an address is computed once
 * and kept in a cache of 64-bit words (tag and rule in one word: one relaxed load, no lock,
 * no tearing), so a step is a cache hit, one add and one or two loads from the stack.
 *
 * A rule says, for the instruction a return address comes back to (the call is at ip - 1):
 *   CFA  = rsp + off, or rbp + off             (the caller's stack pointer)
 *   ra   = *(CFA - 8)                          (every x86-64 rule we keep has it there)
 *   rbp' = *(CFA - 8 * slot) when saved, else rbp unchanged
 * or that the frame is a signal frame (the kernel's trampoline, CIE augmentation 'S': the
 * interrupted registers are in the ucontext at the stack pointer), or that the walk stops
 * here: no module, no FDE, a CFA by expression, a register the rule keeps elsewhere, the
 * return address undefined (the outermost frame: _start, clone's child). Rules are computed
 * inside dl_iterate_phdr's callback (under the loader's lock, so the module stays mapped) and
 * under no lock of ours; two threads computing the same one store the same word. The cache is
 * cleared (hc_uw_forget) when the loader unloads a module (the tracer's module scan sees it;
 * the layers hook dlclose): an address may then belong to other code. Frame pointers
 * alone are not enough: Debian builds without them, so rbp is only followed where the CFI says
 * the function keeps its frame there.
 *
 * Safety: the stack is only read at CFA - 8 and CFA - 8 * slot, and only when the CFA is above
 * the current stack pointer and less than HC_UW_FRAME_MAX above it. A signal frame's registers
 * are the kernel's (only the trampoline's CIE says 'S'); its interrupted stack pointer, which
 * may be far from the handler's (a handler on a sigaltstack), must be 8-byte aligned and
 * becomes the base of the checks above. */

#include <pthread.h>
#include <ucontext.h>

#ifndef HC_UW_BITS
#define HC_UW_BITS 18u /* 2^18 cache words (2 MiB), direct-mapped by the low bits of the key */
#endif
#define HC_UW_MASK ((1u << HC_UW_BITS) - 1u)
#define HC_UW_OFF_MAX (1u << 20)   /* a rule's CFA offset: larger ones end the walk */
#define HC_UW_FRAME_MAX (8u << 20) /* a frame (CFA - sp, alloca included): the default stack */

/* a rule in 32 bits: flags (bits 0-3), rbp's slot below the CFA in words (4-11), CFA offset
 * (12-31, bytes) */
#define HC_RULE_CFA_BP 1u
#define HC_RULE_BP_SAVED 2u
#define HC_RULE_SIGNAL 4u
#define HC_RULE_STOP 8u
#define HC_RULE(flags, slot, off) ((uint32_t)(flags) | ((uint32_t)(slot) << 4) | ((uint32_t)(off) << 12))

static uint64_t *hc_uw_cache; /* mmap'd at start when stacks are recorded */

/* A code address's word in the cache: its low bits mixed with its high ones (the word's tag),
 * so that code a multiple of the table's span apart (a program's and a library's hot paths)
 * does not share a word; the slot and the tag still give the address back, so a tag that
 * matches is the address's own rule. */
static inline uint32_t hc_uw_slot(uint64_t key) {
    uint64_t tag = key >> HC_UW_BITS;
    return (uint32_t)((key ^ ((tag * 0x9E3779B97F4A7C15ull) >> 24)) & HC_UW_MASK);
}

/* fork: a thread inside dl_iterate_phdr holds the loader's lock, and a child forked meanwhile
 * inherits that lock held by a thread it does not have: its first rule computed would wait on
 * it forever (seen: forkbig's children under the placement layer at depth 16, a thread walking
 * while another forks). So hc_uw_compute counts the walks inside the loader (hc_uw_in_loader),
 * and a child forked while any was (hc_uw_fork_child, from pthread_atfork) computes no rule
 * again: its walks stop where the inherited cache has none (a shorter stack or context, never
 * a wait). A child forked while none was computes rules as its parent did. */
static int hc_uw_in_loader;
static int hc_uw_no_loader;
static void hc_uw_fork_child(void) {
    if (hc_uw_in_loader) hc_uw_no_loader = 1;
    hc_uw_in_loader = 0;
}

static void hc_uw_start(void) {
    void *m = mmap(NULL, sizeof(uint64_t) << HC_UW_BITS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    hc_uw_cache = m == MAP_FAILED ? NULL : m;
    static int forks_watched;
    if (hc_uw_cache && !__atomic_exchange_n(&forks_watched, 1, __ATOMIC_ACQ_REL))
        pthread_atfork(NULL, NULL, hc_uw_fork_child);
}

/* An unloaded module's addresses may now hold other code: forget every rule. */
static uint32_t hc_uw_generation; /* counts hc_uw_forget: a thread's last walk is reused only
                                    * within one generation (heapcast_stacks.c) */
static void hc_uw_forget(void) {
    if (hc_uw_cache) memset(hc_uw_cache, 0, sizeof(uint64_t) << HC_UW_BITS);
    __atomic_fetch_add(&hc_uw_generation, 1, __ATOMIC_RELEASE);
}

/* ---- reading DWARF ---------------------------------------------------------------------- */

struct hc_dw {
    const uint8_t *p, *end;
    int bad;
};

static uint64_t hc_dw_uleb(struct hc_dw *d) {
    uint64_t v = 0;
    for (unsigned shift = 0; d->p < d->end && shift < 64; shift += 7) {
        uint8_t b = *d->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    d->bad = 1;
    return 0;
}

static int64_t hc_dw_sleb(struct hc_dw *d) {
    int64_t v = 0;
    unsigned shift = 0;
    while (d->p < d->end && shift < 64) {
        uint8_t b = *d->p++;
        v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
            return v;
        }
    }
    d->bad = 1;
    return 0;
}

static uint64_t hc_dw_fixed(struct hc_dw *d, unsigned n) {
    if ((size_t)(d->end - d->p) < n) {
        d->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, d->p, n);
    d->p += n;
    return v;
}

/* A pointer in DW_EH_PE encoding `enc`: the forms GCC and the linkers write on x86-64. */
static uint64_t hc_dw_encoded(struct hc_dw *d, uint8_t enc, uint64_t datarel) {
    if (enc == 0xff) return 0; /* DW_EH_PE_omit */
    uint64_t at = (uint64_t)(uintptr_t)d->p, v;
    switch (enc & 0x0f) {
    case 0x00: v = hc_dw_fixed(d, 8); break;                                 /* absptr */
    case 0x01: v = hc_dw_uleb(d); break;                                     /* uleb128 */
    case 0x02: v = hc_dw_fixed(d, 2); break;                                 /* udata2 */
    case 0x03: v = hc_dw_fixed(d, 4); break;                                 /* udata4 */
    case 0x04: v = hc_dw_fixed(d, 8); break;                                 /* udata8 */
    case 0x09: v = (uint64_t)hc_dw_sleb(d); break;                           /* sleb128 */
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)hc_dw_fixed(d, 2); break;     /* sdata2 */
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)hc_dw_fixed(d, 4); break;     /* sdata4 */
    case 0x0c: v = hc_dw_fixed(d, 8); break;                                 /* sdata8 */
    default: d->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0x00: break;              /* absolute */
    case 0x10: v += at; break;     /* pcrel */
    case 0x30: v += datarel; break; /* datarel (.eh_frame_hdr's table) */
    default: d->bad = 1; return 0;
    }
    if (enc & 0x80) v = v ? *(const uint64_t *)(uintptr_t)v : 0; /* indirect */
    return v;
}

/* ---- the CFI program ---------------------------------------------------------------------- */

enum { HC_HOW_SAME = 0, HC_HOW_OFFSET = 1, HC_HOW_UNDEF = 2, HC_HOW_OTHER = 3 };
#define HC_DW_RBP 6
#define HC_DW_RSP 7
#define HC_DW_RA 16

struct hc_cfa_row {
    int cfa_reg, cfa_expr;
    int64_t cfa_off;
    int bp_how, ra_how;
    int64_t bp_off, ra_off;
};

struct hc_cie {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    int signal, has_z;
    const uint8_t *insns, *insns_end;
};

static void hc_row_set(struct hc_cfa_row *r, uint64_t reg, int how, int64_t off) {
    if (reg == HC_DW_RBP) r->bp_how = how, r->bp_off = off;
    else if (reg == HC_DW_RA) r->ra_how = how, r->ra_off = off;
}

static void hc_row_restore(struct hc_cfa_row *r, const struct hc_cfa_row *init, uint64_t reg) {
    if (reg == HC_DW_RBP) r->bp_how = init->bp_how, r->bp_off = init->bp_off;
    else if (reg == HC_DW_RA) r->ra_how = init->ra_how, r->ra_off = init->ra_off;
}

/* Runs the CFA instructions in [p, end) from location `loc` while it is at most `target`.
 * Returns 0, or -1 for an instruction this unwinder does not know. */
static int hc_cfa_run(const uint8_t *p, const uint8_t *end, const struct hc_cie *cie,
                      struct hc_cfa_row *row, const struct hc_cfa_row *init, uint64_t loc,
                      uint64_t target) {
    struct hc_dw d = {p, end, 0};
    struct hc_cfa_row saved[8];
    unsigned nsaved = 0;
    while (d.p < d.end && !d.bad) {
        uint8_t op = *d.p++;
        uint64_t delta = 0, reg;
        switch (op >> 6) {
        case 1: delta = op & 0x3f; goto advance;                      /* advance_loc */
        case 2: hc_row_set(row, op & 0x3f, HC_HOW_OFFSET,              /* offset */
                           (int64_t)hc_dw_uleb(&d) * cie->data_align);
            continue;
        case 3: hc_row_restore(row, init, op & 0x3f); continue;       /* restore */
        }
        switch (op) {
        case 0x00: break;                                              /* nop */
        case 0x01: loc = hc_dw_encoded(&d, cie->fde_enc, 0);           /* set_loc */
            if (loc > target) return 0;
            break;
        case 0x02: delta = hc_dw_fixed(&d, 1); goto advance;
        case 0x03: delta = hc_dw_fixed(&d, 2); goto advance;
        case 0x04: delta = hc_dw_fixed(&d, 4); goto advance;
        case 0x05: reg = hc_dw_uleb(&d);                               /* offset_extended */
            hc_row_set(row, reg, HC_HOW_OFFSET, (int64_t)hc_dw_uleb(&d) * cie->data_align);
            break;
        case 0x06: hc_row_restore(row, init, hc_dw_uleb(&d)); break;   /* restore_extended */
        case 0x07: hc_row_set(row, hc_dw_uleb(&d), HC_HOW_UNDEF, 0); break;
        case 0x08: hc_row_set(row, hc_dw_uleb(&d), HC_HOW_SAME, 0); break;
        case 0x09: reg = hc_dw_uleb(&d);                               /* register */
            hc_dw_uleb(&d);
            hc_row_set(row, reg, HC_HOW_OTHER, 0);
            break;
        case 0x0a: if (nsaved == 8) return -1;                         /* remember_state */
            saved[nsaved++] = *row;
            break;
        case 0x0b: if (nsaved == 0) return -1;                         /* restore_state */
            {
                struct hc_cfa_row s = saved[--nsaved];
                /* the CFA is not part of the remembered registers in GCC's reading either way;
                 * restore it all, as libgcc does (the CFA is remembered too) */
                *row = s;
            }
            break;
        case 0x0c: row->cfa_reg = (int)hc_dw_uleb(&d);                 /* def_cfa */
            row->cfa_off = (int64_t)hc_dw_uleb(&d);
            row->cfa_expr = 0;
            break;
        case 0x0d: row->cfa_reg = (int)hc_dw_uleb(&d); row->cfa_expr = 0; break;
        case 0x0e: row->cfa_off = (int64_t)hc_dw_uleb(&d); break;     /* def_cfa_offset */
        case 0x0f: d.p += hc_dw_uleb(&d); row->cfa_expr = 1; break;   /* def_cfa_expression */
        case 0x10: reg = hc_dw_uleb(&d);                               /* expression */
            d.p += hc_dw_uleb(&d);
            hc_row_set(row, reg, HC_HOW_OTHER, 0);
            break;
        case 0x11: reg = hc_dw_uleb(&d);                               /* offset_extended_sf */
            hc_row_set(row, reg, HC_HOW_OFFSET, hc_dw_sleb(&d) * cie->data_align);
            break;
        case 0x12: row->cfa_reg = (int)hc_dw_uleb(&d);                 /* def_cfa_sf */
            row->cfa_off = hc_dw_sleb(&d) * cie->data_align;
            row->cfa_expr = 0;
            break;
        case 0x13: row->cfa_off = hc_dw_sleb(&d) * cie->data_align; break;
        case 0x14: reg = hc_dw_uleb(&d); hc_dw_uleb(&d);               /* val_offset */
            hc_row_set(row, reg, HC_HOW_OTHER, 0);
            break;
        case 0x15: reg = hc_dw_uleb(&d); hc_dw_sleb(&d);               /* val_offset_sf */
            hc_row_set(row, reg, HC_HOW_OTHER, 0);
            break;
        case 0x16: reg = hc_dw_uleb(&d);                               /* val_expression */
            d.p += hc_dw_uleb(&d);
            hc_row_set(row, reg, HC_HOW_OTHER, 0);
            break;
        case 0x2e: hc_dw_uleb(&d); break;                              /* GNU_args_size */
        case 0x2f: reg = hc_dw_uleb(&d);                               /* GNU_negative_offset_ext */
            hc_row_set(row, reg, HC_HOW_OFFSET, -(int64_t)hc_dw_uleb(&d) * cie->data_align);
            break;
        default: return -1;
        }
        continue;
    advance:
        loc += delta * cie->code_align;
        if (loc > target) return 0;
    }
    return d.bad ? -1 : 0;
}

/* Parses the CIE at `at` (its length field). Returns 0 or -1. */
static int hc_cie_parse(const uint8_t *at, struct hc_cie *cie) {
    uint64_t len = *(const uint32_t *)at;
    const uint8_t *p = at + 4;
    if (len == 0xffffffffu) {
        len = *(const uint64_t *)p;
        p += 8;
    }
    struct hc_dw d = {p, p + len, 0};
    d.p += (len == 0 ? 0 : (p == at + 4 ? 4 : 8)); /* the CIE id */
    uint8_t version = (uint8_t)hc_dw_fixed(&d, 1);
    const char *aug = (const char *)d.p;
    size_t auglen = strnlen(aug, (size_t)(d.end - d.p));
    d.p += auglen + 1;
    if (version != 1 && version != 3) return -1;
    if (aug[0] == 'e' && aug[1] == 'h') return -1; /* pre-GCC-3 "eh": not written any more */
    cie->code_align = hc_dw_uleb(&d);
    cie->data_align = hc_dw_sleb(&d);
    cie->ra_reg = version == 1 ? hc_dw_fixed(&d, 1) : hc_dw_uleb(&d);
    cie->fde_enc = 0; /* absptr */
    cie->signal = 0;
    cie->has_z = aug[0] == 'z';
    if (cie->has_z) {
        uint64_t n = hc_dw_uleb(&d);
        const uint8_t *after = d.p + n;
        for (const char *a = aug + 1; *a && !d.bad; a++) {
            if (*a == 'R') cie->fde_enc = (uint8_t)hc_dw_fixed(&d, 1);
            else if (*a == 'L') hc_dw_fixed(&d, 1);
            else if (*a == 'P') hc_dw_encoded(&d, (uint8_t)hc_dw_fixed(&d, 1) & 0x7f, 0);
            else if (*a == 'S') cie->signal = 1;
            else if (*a == 'B' || *a == 'G') continue;
            else break; /* unknown letters: the length says where the instructions start */
        }
        d.p = after;
    } else if (aug[0]) {
        return -1;
    }
    if (d.bad || d.p > d.end || cie->ra_reg != HC_DW_RA) return -1;
    cie->insns = d.p;
    cie->insns_end = d.end;
    return 0;
}

/* ---- finding the FDE ---------------------------------------------------------------------- */

/* The rule for code address `addr` (a return address - 1, or an interrupted instruction) in the
 * module whose .eh_frame_hdr is `hdr`. */
static uint32_t hc_uw_rule_in(const uint8_t *hdr, uint64_t addr) {
    const uint32_t stop = HC_RULE(HC_RULE_STOP, 0, 0);
    if (hdr[0] != 1 || hdr[3] != 0x3b) return stop; /* version 1, datarel|sdata4 table */
    struct hc_dw d = {hdr + 4, hdr + 4 + 32, 0};
    hc_dw_encoded(&d, hdr[1], (uint64_t)(uintptr_t)hdr); /* eh_frame_ptr */
    uint64_t count = hc_dw_encoded(&d, hdr[2], (uint64_t)(uintptr_t)hdr);
    if (d.bad || count == 0) return stop;
    const int32_t *table = (const int32_t *)(uintptr_t)d.p;
    int64_t rel = (int64_t)(addr - (uint64_t)(uintptr_t)hdr);
    uint64_t lo = 0, hi = count; /* the last entry whose start is <= addr */
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if ((int64_t)table[2 * mid] <= rel) lo = mid;
        else hi = mid;
    }
    if ((int64_t)table[2 * lo] > rel) return stop;
    const uint8_t *fde = hdr + table[2 * lo + 1];

    /* the FDE: length, CIE pointer, pc_begin, pc_range, augmentation, instructions */
    uint64_t len = *(const uint32_t *)fde;
    const uint8_t *p = fde + 4;
    if (len == 0xffffffffu) return stop; /* 64-bit DWARF: never in .eh_frame on x86-64 */
    const uint8_t *fde_end = p + len;
    const uint8_t *cie_at = p - *(const uint32_t *)p;
    struct hc_cie cie;
    if (hc_cie_parse(cie_at, &cie) != 0) return stop;
    d = (struct hc_dw){p + 4, fde_end, 0};
    uint64_t begin = hc_dw_encoded(&d, cie.fde_enc, 0);
    uint64_t range = hc_dw_encoded(&d, cie.fde_enc & 0x0f, 0);
    if (d.bad || addr < begin || addr >= begin + range) return stop;
    if (cie.has_z) d.p += hc_dw_uleb(&d);
    if (d.bad || d.p > fde_end) return stop;

    struct hc_cfa_row init = {HC_DW_RSP, 0, 8, HC_HOW_SAME, HC_HOW_SAME, 0, 0};
    if (hc_cfa_run(cie.insns, cie.insns_end, &cie, &init, &init, 0, UINT64_MAX) != 0) return stop;
    struct hc_cfa_row row = init;
    if (hc_cfa_run(d.p, fde_end, &cie, &row, &init, begin, addr) != 0) return stop;

    if (row.cfa_expr) return cie.signal ? HC_RULE(HC_RULE_SIGNAL, 0, 0) : stop;
    if (row.cfa_reg != HC_DW_RSP && row.cfa_reg != HC_DW_RBP) return stop;
    if (row.cfa_off <= 0 || row.cfa_off >= (int64_t)HC_UW_OFF_MAX) return stop;
    if (row.ra_how != HC_HOW_OFFSET || row.ra_off != -8) return stop; /* undefined: outermost */
    uint32_t flags = row.cfa_reg == HC_DW_RBP ? HC_RULE_CFA_BP : 0, slot = 0;
    if (row.bp_how == HC_HOW_OFFSET) {
        if (row.bp_off >= 0 || row.bp_off % 8 || -row.bp_off / 8 > 255) return stop;
        flags |= HC_RULE_BP_SAVED;
        slot = (uint32_t)(-row.bp_off / 8);
    } else if (row.bp_how == HC_HOW_OTHER) {
        return stop;
    }
    return HC_RULE(flags, slot, (uint64_t)row.cfa_off);
}

struct hc_uw_find {
    uint64_t addr;
    uint32_t rule;
};

/* Called by dl_iterate_phdr, which holds the loader's lock: the module cannot be unloaded while
 * its CFI is read (as libgcc's _Unwind_Find_FDE does it). */
static int hc_uw_find_cb(struct dl_phdr_info *info, size_t size, void *data) {
    struct hc_uw_find *f = data;
    const ElfW(Phdr) *hdr = NULL;
    int inside = 0;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uint64_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->addr >= lo && f->addr < lo + ph->p_memsz) inside = 1;
        else if (ph->p_type == PT_GNU_EH_FRAME) hdr = ph;
    }
    if (!inside) return 0;
    if (hdr) f->rule = hc_uw_rule_in((const uint8_t *)(uintptr_t)(info->dlpi_addr + hdr->p_vaddr), f->addr);
    return 1;
}

/* The rule for code address `addr`: stop where no module holds it (JIT code) or it has no CFI. */
static uint32_t hc_uw_compute(uint64_t addr) {
    struct hc_uw_find f = {addr, HC_RULE(HC_RULE_STOP, 0, 0)};
    if (__atomic_load_n(&hc_uw_no_loader, __ATOMIC_RELAXED)) return f.rule; /* see hc_uw_start */
    __atomic_fetch_add(&hc_uw_in_loader, 1, __ATOMIC_SEQ_CST);
    dl_iterate_phdr(hc_uw_find_cb, &f);
    __atomic_fetch_sub(&hc_uw_in_loader, 1, __ATOMIC_RELEASE);
    return f.rule;
}

#ifdef HC_WALK_CHECK
static uint64_t hc_uw_misses, hc_uw_miss_ticks; /* said at exit by the walk check */
#endif

static HC_NOINLINE uint32_t hc_uw_miss(uint64_t key) {
#ifdef HC_WALK_CHECK
    uint64_t t0 = __rdtsc();
    uint32_t rule = hc_uw_compute(key);
    __atomic_fetch_add(&hc_uw_misses, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&hc_uw_miss_ticks, __rdtsc() - t0, __ATOMIC_RELAXED);
#else
    uint32_t rule = hc_uw_compute(key);
#endif
    uint64_t word = ((key >> HC_UW_BITS) << 32) | rule;
    __atomic_store_n(&hc_uw_cache[hc_uw_slot(key)], word, __ATOMIC_RELAXED);
    return rule;
}

static inline __attribute__((always_inline)) uint32_t hc_uw_rule(uint64_t key) {
    uint64_t word = __atomic_load_n(&hc_uw_cache[hc_uw_slot(key)], __ATOMIC_RELAXED);
    if (HC_LIKELY(word && (word >> 32) == (key >> HC_UW_BITS))) return (uint32_t)word;
    return hc_uw_miss(key);
}

/* ---- one step ------------------------------------------------------------------------------ */

#define HC_STEP_SIGNAL 0xff /* how: the step read a signal frame's registers: not reused */

/* One step of a walk: from the frame (ip, sp, bp; `exact`: ip is an interrupted instruction,
 * not a return address) to its caller, in place. Returns 0 where the walk ends (no rule, a
 * CFA the checks refuse, a signal frame's stack pointer not aligned). *how: 0 rbp kept, k rbp
 * read at CFA - 8k, HC_STEP_SIGNAL; *used_bp: the CFA was read from rbp. The walk and the walk
 * check step alike through this one function. */
static inline __attribute__((always_inline)) int hc_step(uint64_t *ip, uint64_t *sp, uint64_t *bp,
                                                         int *exact, uint8_t *how, uint8_t *used_bp) {
    uint32_t rule = hc_uw_rule(*exact ? *ip : *ip - 1);
    if (HC_UNLIKELY(rule & (HC_RULE_STOP | HC_RULE_SIGNAL))) {
        if (rule & HC_RULE_STOP) return 0;
        const ucontext_t *uc = (const ucontext_t *)(uintptr_t)*sp;
        uint64_t nsp = (uint64_t)uc->uc_mcontext.gregs[REG_RSP];
        if (!nsp || (nsp & 7)) return 0;
        *ip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
        *bp = (uint64_t)uc->uc_mcontext.gregs[REG_RBP];
        *sp = nsp;
        *exact = 1;
        *how = HC_STEP_SIGNAL;
        return 1;
    }
    *used_bp = (uint8_t)(rule & HC_RULE_CFA_BP);
    uint64_t cfa = ((rule & HC_RULE_CFA_BP) ? *bp : *sp) + (rule >> 12);
    if (cfa <= *sp || cfa - *sp > HC_UW_FRAME_MAX) return 0;
    uint32_t slot = (rule & HC_RULE_BP_SAVED) ? (rule >> 4) & 0xff : 0;
    if (slot) *bp = *(const uint64_t *)(uintptr_t)(cfa - 8 * (uint64_t)slot);
    *ip = *(const uint64_t *)(uintptr_t)(cfa - 8);
    *sp = cfa;
    *exact = 0;
    *how = (uint8_t)slot;
    return 1;
}
