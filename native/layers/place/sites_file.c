/* Part of layers/place.c (one translation unit; never compiled alone).
 * The sites files, the optimistic bound's reference: a run with learn=FILE writes its long sites
 * at exit, and a run with mode=sites, sites=FILE reads them at start and places them long from
 * the first call (no learning). "module offset" lines; "-" is the program. */

struct hp_find {
    uintptr_t addr;        /* in: an address (learn) */
    const char *name;      /* in: a module name (sites); out: the module holding addr */
    uintptr_t base;        /* out */
    int found;
};

static int hp_find_module(struct dl_phdr_info *info, size_t size, void *arg) {
    struct hp_find *f = arg;
    const char *name = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "-";
    if (f->name != NULL && f->addr == 0) {
        if (strcmp(name, f->name) != 0) return 0;
        f->base = info->dlpi_addr, f->found = 1;
        return 1;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (f->addr >= lo && f->addr < lo + ph->p_memsz) {
            f->name = name, f->base = info->dlpi_addr, f->found = 1;
            return 1;
        }
    }
    return 0;
}

/* At start (the library's constructor: dl_iterate_phdr takes the loader's lock, which a first
 * malloc inside dlopen may hold): the long sites, frozen (no learning in mode=sites). */
static void hp_read_sites(void) {
    static char text[1 << 16];
    int fd = open(hp_set.sites, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        hp_say("cannot open the sites file; every site is short");
        return;
    }
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return;
    text[n] = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sp = strrchr(line, ' ');
        if (sp == NULL) continue;
        *sp = 0;
        struct hp_find f = {.name = line};
        dl_iterate_phdr(hp_find_module, &f);
        if (!f.found) continue;
        uintptr_t site = f.base + (uintptr_t)strtoull(sp + 1, NULL, 16);
        hp_sites[hp_site_index(site)].word = site << 1 | 1;
    }
}

static void hp_write_sites(void) {
    int fd = open(hp_set.learn, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        hp_say("cannot write the learn file");
        return;
    }
    for (unsigned e = 0; e < HP_NSITES; e++) {
        uintptr_t w = hp_sites[e].word;
        if (!(w & 1)) continue;
        struct hp_find f = {.addr = w >> 1};
        dl_iterate_phdr(hp_find_module, &f);
        if (!f.found) continue;
        char line[600];
        char *end = line + sizeof line - 1, *q = line;
        q = hc_text(q, line + 500, f.name); /* the module's name, cut at 500 characters */
        q = hc_text_hex(hc_text(q, end, " "), end, (uint64_t)((w >> 1) - f.base));
        *q++ = '\n';
        hc_write_all(fd, line, (size_t)(q - line));
    }
    close(fd);
}
