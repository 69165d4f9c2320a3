/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Options: HEAPCAST_LAYER=name=value,... read once at start through the one table, HL_OPTIONS
 * (layer.c: X(name, default, doc)), into hl_set; a value that cannot be parsed makes the layer a
 * pass-through, said in one line. Also the
 * layer's one output path (hl_write, hl_say: stack buffers and write(2), never malloc), and what
 * the settings make of the hot path (hl_active_min). */

struct hl_settings {
    enum hl_policy policy;
    size_t min, cap;
    int n, topk, horizon;
    int64_t madv_ns; /* -1: never */
    uint64_t decay_ns;
    uint32_t model;
    int follow;      /* raise glibc's mmap threshold as glibc would (hl_follow) */
    int scope_all;   /* keep blocks from glibc's heap too (scope=all) */
    int peak;        /* hl_bound's headroom in % of the live blocks' peak; -1: no bound */
    int proof;       /* hl_ghost_hit: reuses seen before anything is kept */
    int regret;      /* guided: the process's regrets overrule the thread's counter (hl_regret) */
    char table[512]; /* table file path ("" = online counter) */
    char stats[512]; /* "" none, "1" stderr, else a path */
};
static struct hl_settings hl_set = {.policy = HL_OFF, .min = SIZE_MAX, .peak = -1};

/* The one output path (stats, refusals): write(2) of a stack buffer, EINTR and partial writes
 * handled, errno kept. Never mallocs. */
static void hl_write(int fd, const char *s, size_t len) {
    int saved = errno;
    while (len > 0) {
        ssize_t w = write(fd, s, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        s += w;
        len -= (size_t)w;
    }
    errno = saved;
}

static char *hl_cat(char *p, char *end, const char *s) {
    while (*s && p < end) *p++ = *s++;
    return p;
}

static char *hl_num(char *p, char *end, uint64_t v) {
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n && p < end) *p++ = d[--n];
    return p;
}

/* One line "heapcast layer: <a><b><c><d>\n" on stderr. */
static void hl_say(const char *a, const char *b, const char *c, const char *d) {
    char line[768];
    char *end = line + sizeof line - 1, *p = line;
    p = hl_cat(p, end, "heapcast layer: ");
    p = hl_cat(p, end, a);
    p = hl_cat(p, end, b);
    p = hl_cat(p, end, c);
    p = hl_cat(p, end, d);
    *p++ = '\n';
    hl_write(2, line, (size_t)(p - line));
}

/* "123", "64K", "1M", "2G" -> bytes; 0 on a bad value. */
static int hl_parse_size(const char *s, size_t *out) {
    if (!*s) return 0;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    int shift = 0;
    if (*s == 'K' || *s == 'k') shift = 10, s++;
    else if (*s == 'M' || *s == 'm') shift = 20, s++;
    else if (*s == 'G' || *s == 'g') shift = 30, s++;
    if (*s || v > (UINT64_MAX >> shift)) return 0;
    *out = (size_t)(v << shift);
    return 1;
}

static int hl_parse_int(const char *s, long lo, long hi, long *out) {
    size_t v;
    if (!hl_parse_size(s, &v) || strpbrk(s, "KkMmGg") || (long)v < lo || (long)v > hi) return 0;
    *out = (long)v;
    return 1;
}

/* Apply one option; 0 if its value cannot be parsed. */
static int hl_apply(struct hl_settings *st, const char *name, const char *v) {
    long x;
    if (!strcmp(name, "policy")) {
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, hl_policy_names[i])) return st->policy = (enum hl_policy)i, 1;
        for (size_t i = 0; i < sizeof hl_renamed_policies / sizeof hl_renamed_policies[0]; i++)
            if (!strcmp(v, hl_renamed_policies[i].old))
                return st->policy = hl_renamed_policies[i].policy, 1;
        return 0;
    }
    if (!strcmp(name, "min")) return hl_parse_size(v, &st->min) && st->min > 0;
    if (!strcmp(name, "cap")) return hl_parse_size(v, &st->cap);
    if (!strcmp(name, "n")) return hl_parse_int(v, 0, HL_MAX_N, &x) ? (st->n = (int)x, 1) : 0;
    if (!strcmp(name, "madv")) {
        if (!strcmp(v, "off")) return st->madv_ns = -1, 1;
        return hl_parse_int(v, 0, 1L << 40, &x) ? (st->madv_ns = (int64_t)x * 1000000, 1) : 0;
    }
    if (!strcmp(name, "topk")) return hl_parse_int(v, 1, 64, &x) ? (st->topk = (int)x, 1) : 0;
    if (!strcmp(name, "horizon"))
        return hl_parse_int(v, 1, 64, &x) ? (st->horizon = (int)x, 1) : 0;
    if (!strcmp(name, "decay"))
        return hl_parse_int(v, 0, 1L << 40, &x) ? (st->decay_ns = (uint64_t)x * 1000000u, 1) : 0;
    if (!strcmp(name, "model"))
        return hl_parse_int(v, 0, 0x7fffffff, &x) ? (st->model = (uint32_t)x, 1) : 0;
    if (!strcmp(name, "scope")) {
        if (!strcmp(v, "mapped") || !strcmp(v, "all")) return st->scope_all = v[0] == 'a', 1;
        return 0;
    }
    if (!strcmp(name, "peak")) {
        if (!strcmp(v, "off")) return st->peak = -1, 1;
        return hl_parse_int(v, 0, 1000, &x) ? (st->peak = (int)x, 1) : 0;
    }
    if (!strcmp(name, "proof"))
        return hl_parse_int(v, 0, 1 << 20, &x) ? (st->proof = (int)x, 1) : 0;
    if (!strcmp(name, "follow")) return hl_parse_int(v, 0, 1, &x) ? (st->follow = (int)x, 1) : 0;
    if (!strcmp(name, "regret")) return hl_parse_int(v, 0, 1, &x) ? (st->regret = (int)x, 1) : 0;
    if (!strcmp(name, "predictor")) {
        if (!strcmp(v, "online")) return st->table[0] = '\0', 1;
        if (strncmp(v, "table:", 6) || !v[6] || strlen(v + 6) >= sizeof st->table) return 0;
        strcpy(st->table, v + 6);
        return 1;
    }
    if (!strcmp(name, "stats")) {
        if (!strcmp(v, "0")) return st->stats[0] = '\0', 1;
        if (!*v || strlen(v) >= sizeof st->stats) return 0;
        strcpy(st->stats, v);
        return 1;
    }
    return 0;
}

/* The settings from HEAPCAST_LAYER over the table's defaults; 0 (and one stderr line) if
 * something cannot be parsed. */
static int hl_read_settings(struct hl_settings *st) {
#define X(name, dflt, doc) {#name, dflt},
    static const struct {
        const char *name, *dflt;
    } defaults[] = {HL_OPTIONS(X)};
#undef X
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!hl_apply(st, defaults[i].name, defaults[i].dflt)) return 0; /* cannot happen */
    const char *env = getenv("HEAPCAST_LAYER");
    if (env == NULL) return 1;
    char buf[2048];
    if (strlen(env) >= sizeof buf) {
        hl_say("HEAPCAST_LAYER is too long", "", "", "; running as a pass-through");
        return 0;
    }
    strcpy(buf, env);
    for (char *item = buf, *next; item && *item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        char *eq = strchr(item, '=');
        int known = 0;
        if (eq) {
            *eq = '\0';
#define X(name, dflt, doc) known |= !strcmp(item, #name);
            HL_OPTIONS(X)
#undef X
        }
        if (!eq || !known || !hl_apply(st, item, eq + 1)) {
            if (eq) *eq = '=';
#define X(name, dflt, doc) " " #name
            hl_say("cannot parse HEAPCAST_LAYER item '", item, "' (options:" HL_OPTIONS(X) ")",
                   "; running as a pass-through");
#undef X
            return 0;
        }
    }
    return 1;
}

/* `min` once started and caching; SIZE_MAX: every call passes through (read at every call) */
static size_t hl_active_min = SIZE_MAX;
static size_t hl_page = 4096;
