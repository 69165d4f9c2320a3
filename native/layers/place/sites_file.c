/* Part of layers/place.c (one translation unit; never compiled alone).
 * The sites files, the optimistic bound's reference: a run with learn=FILE writes its long sites
 * at exit, and a run with mode=sites, sites=FILE reads them at start and places them long from
 * the first call (no learning). The format (../../TABLE.md, "The sites file"): format 2, a first
 * line "# heapcast place sites 2 depth=D", then one site a line: at depth 1 "module offset"
 * (hex; "-" is the program), deeper the context's key (16 hex digits, ../context_key.h, the
 * same in every process of the program). A file without that line is format 1: "module offset"
 * lines, depth 1. The reader keys on the file's depth, whatever the depth option says. */

#define HP_SITES_HEAD "# heapcast place sites "
#define HP_SITES_FORMAT 2

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

/* "module offset": the address it names in this process, 0 where no module has that name. */
static uintptr_t hp_site_named(char *line) {
    char *sp = strrchr(line, ' ');
    if (sp == NULL) return 0;
    *sp = 0;
    struct hp_find f = {.name = line};
    dl_iterate_phdr(hp_find_module, &f);
    return f.found ? f.base + (uintptr_t)strtoull(sp + 1, NULL, 16) : 0;
}

/* The file's depth from its first line (format 2), 1 without one (format 1); 0, said in one
 * line naming the file, for a format this layer does not read. */
static unsigned hp_sites_depth(const char *first) {
    if (strncmp(first, HP_SITES_HEAD, sizeof HP_SITES_HEAD - 1) != 0) return 1;
    char *end;
    unsigned long format = strtoul(first + sizeof HP_SITES_HEAD - 1, &end, 10);
    unsigned long depth = 0;
    if (format == HP_SITES_FORMAT && !strncmp(end, " depth=", 7))
        depth = strtoul(end + 7, &end, 10);
    if (format == HP_SITES_FORMAT && *end == 0 && depth >= 1 && depth <= HC_CTX_MAX)
        return (unsigned)depth;
    hc_say_line("heapcast place: ", "sites file ", hp_set.sites,
                " is not one this layer reads (formats 1 and 2, depth 1..16); every site is short",
                "");
    return 0;
}

/* At start (the library's constructor: dl_iterate_phdr takes the loader's lock, which a first
 * malloc inside dlopen may hold): the long sites, frozen (no learning in mode=sites), keyed at
 * the file's depth. */
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
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    unsigned depth = line ? hp_sites_depth(line) : 1;
    if (depth == 0) return;
    hp_key_depth(depth);
    if (line && line[0] == '#') line = strtok_r(NULL, "\n", &save);
    for (; line; line = strtok_r(NULL, "\n", &save)) {
        uintptr_t site;
        if (hp_depth > 1) {
            char *end;
            site = (uintptr_t)strtoull(line, &end, 16);
            if (*end != 0 || site >> 63) continue;
        } else {
            site = hp_site_named(line);
        }
        if (site) {
            hp_long_site(site);
            hp_site_word[hp_site_index(site)] = site << 1 | 1;
        }
    }
}

/* At exit (learn=FILE): the long sites, format 2 at the depth the counter keyed on. */
static void hp_write_sites(void) {
    int fd = open(hp_set.learn, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        hp_say("cannot write the learn file");
        return;
    }
    unsigned depth = hp_depth > 1 ? hp_depth : 1;
    char line[600];
    char *end = line + sizeof line - 1, *q = hc_text(line, end, HP_SITES_HEAD);
    q = hc_text_u64(hc_text(hc_text_u64(q, end, HP_SITES_FORMAT), end, " depth="), end, depth);
    *q++ = '\n';
    hc_write_all(fd, line, (size_t)(q - line));
    for (unsigned e = 0; e < HP_NSITES; e++) {
        uintptr_t w = hp_site_word[e];
        if (!(w & 1)) continue;
        q = line;
        if (depth > 1) {
            q = hc_text_hex(q, end, (uint64_t)(w >> 1));
        } else {
            struct hp_find f = {.addr = w >> 1};
            dl_iterate_phdr(hp_find_module, &f);
            if (!f.found) continue;
            q = hc_text(q, line + 500, f.name); /* the module's name, cut at 500 characters */
            q = hc_text_hex(hc_text(q, end, " "), end, (uint64_t)((w >> 1) - f.base));
        }
        *q++ = '\n';
        hc_write_all(fd, line, (size_t)(q - line));
    }
    close(fd);
}
