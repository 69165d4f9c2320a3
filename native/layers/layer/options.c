/* Part of layers/layer.c (one translation unit; never compiled alone).
 * Options: HEAPCAST_LAYER=name=value,... read once at start through the one table, HL_OPTIONS
 * (layer.c: X(name, default, doc)), into hl_set; a value that cannot be parsed makes the layer a
 * pass-through, said in one line (the parser: ../../options.h). Also the layer's one line on stderr
 * (hl_say, through ../../say.h: a stack buffer and write(2), never malloc), and what the settings
 * make of the hot path (hl_active_min). */

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

/* One line "heapcast layer: <a><b><c><d>" on stderr (../../say.h: a stack buffer, write(2)). */
static void hl_say(const char *a, const char *b, const char *c, const char *d) {
    hc_say_line("heapcast layer: ", a, b, c, d);
}

/* Apply one option to the settings (struct hl_settings); 0 if its value cannot be parsed
 * (../../options.h: the numbers' rules). */
static int hl_apply(void *settings, const char *name, const char *v) {
    struct hl_settings *st = settings;
    uint64_t x;
    if (!strcmp(name, "policy")) {
        int i = hc_option_word(v, hl_policy_names, 4);
        if (i >= 0) return st->policy = (enum hl_policy)i, 1;
        for (size_t i = 0; i < sizeof hl_renamed_policies / sizeof hl_renamed_policies[0]; i++)
            if (!strcmp(v, hl_renamed_policies[i].old))
                return st->policy = hl_renamed_policies[i].policy, 1;
        return 0;
    }
    if (!strcmp(name, "min")) return hc_option_size(v, &x) && x > 0 ? (st->min = (size_t)x, 1) : 0;
    if (!strcmp(name, "cap")) return hc_option_size(v, &x) ? (st->cap = (size_t)x, 1) : 0;
    if (!strcmp(name, "n")) return hc_option_uint(v, 0, HL_MAX_N, &x) ? (st->n = (int)x, 1) : 0;
    if (!strcmp(name, "madv")) {
        if (!strcmp(v, "off")) return st->madv_ns = -1, 1;
        return hc_option_uint(v, 0, 1ull << 40, &x) ? (st->madv_ns = (int64_t)x * 1000000, 1) : 0;
    }
    if (!strcmp(name, "topk")) return hc_option_uint(v, 1, 64, &x) ? (st->topk = (int)x, 1) : 0;
    if (!strcmp(name, "horizon"))
        return hc_option_uint(v, 1, 64, &x) ? (st->horizon = (int)x, 1) : 0;
    if (!strcmp(name, "decay"))
        return hc_option_uint(v, 0, 1ull << 40, &x) ? (st->decay_ns = x * 1000000u, 1) : 0;
    if (!strcmp(name, "model"))
        return hc_option_uint(v, 0, 0x7fffffff, &x) ? (st->model = (uint32_t)x, 1) : 0;
    if (!strcmp(name, "scope")) {
        static const char *const scopes[] = {"mapped", "all"};
        int i = hc_option_word(v, scopes, 2);
        return i >= 0 ? (st->scope_all = i, 1) : 0;
    }
    if (!strcmp(name, "peak")) {
        if (!strcmp(v, "off")) return st->peak = -1, 1;
        return hc_option_uint(v, 0, 1000, &x) ? (st->peak = (int)x, 1) : 0;
    }
    if (!strcmp(name, "proof"))
        return hc_option_uint(v, 0, 1 << 20, &x) ? (st->proof = (int)x, 1) : 0;
    if (!strcmp(name, "follow"))
        return hc_option_uint(v, 0, 1, &x) ? (st->follow = (int)x, 1) : 0;
    if (!strcmp(name, "regret"))
        return hc_option_uint(v, 0, 1, &x) ? (st->regret = (int)x, 1) : 0;
    if (!strcmp(name, "predictor")) {
        if (!strcmp(v, "online")) return st->table[0] = '\0', 1;
        return !strncmp(v, "table:", 6) && v[6] &&
               hc_option_copy(st->table, sizeof st->table, v + 6);
    }
    if (!strcmp(name, "stats")) {
        if (!strcmp(v, "0")) return st->stats[0] = '\0', 1;
        return *v && hc_option_copy(st->stats, sizeof st->stats, v);
    }
    return 0;
}

/* The settings from HEAPCAST_LAYER over the table's defaults; 0 (and one stderr line) if
 * something cannot be parsed. */
static int hl_read_settings(struct hl_settings *st) {
    static const struct hc_option table[] = {HL_OPTIONS(HC_OPTION_ROW)};
    return hc_options_read("HEAPCAST_LAYER", table, sizeof table / sizeof table[0], hl_apply, st,
                           "heapcast layer: ", "; running as a pass-through");
}

/* `min` once started and caching; SIZE_MAX: every call passes through (read at every call) */
static size_t hl_active_min = SIZE_MAX;
/* The free path's pass-through test, in one compare (hooks.c free): a free whose glibc chunk
 * word (read before the block) is below this goes straight to the real free. 0 (before the
 * constructor has looked everything up, or over another allocator: the word means nothing
 * there): every free takes the full path (free.c hl_free_from). Set once, by init.c
 * (hl_set_free_small), after hc_real and hl_active_min, and never changed: below it the full
 * path would pass the free on too (free.c hl_free_from: a small block, or hl_active_min
 * SIZE_MAX), so both paths decide alike. */
static size_t hl_free_small;
static size_t hl_page = 4096;
