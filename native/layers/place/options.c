/* Part of layers/place.c (one translation unit; never compiled alone).
 * Options: HEAPCAST_PLACE=name=value,... read once at start through the one table,
 * HP_OPTIONS (place.c: X(name, default, doc)), into hp_set; a value it cannot parse: one line
 * on stderr, and the layer passes every call through. Also the layer's one line on stderr
 * (hp_say). */

/* One line "heapcast place: <what>" on stderr (../../say.h: a stack buffer, write(2)). */
static void hp_say(const char *what) { hc_say_line("heapcast place: ", what, "", "", ""); }

/* Apply one option to the settings (struct hp_settings); 0 if its value cannot be parsed
 * (../../options.h: the numbers' rules). */
static int hp_apply(void *settings, const char *k, const char *v) {
    struct hp_settings *st = settings;
    uint64_t x;
    if (!strcmp(k, "mode")) {
        int i = hc_option_word(v, hp_mode_names, 4);
        return i >= 0 ? (st->mode = (enum hp_mode)i, 1) : 0;
    }
    if (!strcmp(k, "sample"))
        return hc_option_uint(v, 1, 65536, &x) ? (st->sample = (int)x, 1) : 0;
    if (!strcmp(k, "horizon"))
        return hc_option_uint(v, 1, HP_CLOCK_MASK / 2 - 1, &x) ? (st->horizon = x, 1) : 0;
    if (!strcmp(k, "pct")) return hc_option_uint(v, 0, 100, &x) ? (st->pct = (int)x, 1) : 0;
    if (!strcmp(k, "falls"))
        return hc_option_uint(v, 0, UINT16_MAX, &x) ? (st->falls = (int)x, 1) : 0;
    if (!strcmp(k, "big")) return hc_option_uint(v, 0, SIZE_MAX, &x) ? (st->big = (size_t)x, 1) : 0;
    if (!strcmp(k, "min_mb"))
        return hc_option_uint(v, 0, 1u << 20, &x) ? (st->min_rss = x << 20, 1) : 0;
    if (!strcmp(k, "learn_mb"))
        return hc_option_uint(v, 0, 1u << 20, &x) ? (st->learn_rss = x << 20, 1) : 0;
    if (!strcmp(k, "model"))
        return hc_option_uint(v, 0, UINT32_MAX, &x) ? (st->model = (uint32_t)x, 1) : 0;
    if (!strcmp(k, "depth"))
        return hc_option_uint(v, 1, HC_CTX_MAX, &x) ? (st->depth = (unsigned)x, 1) : 0;
    if (!strcmp(k, "sites")) return hc_option_copy(st->sites, sizeof st->sites, v);
    if (!strcmp(k, "learn")) return hc_option_copy(st->learn, sizeof st->learn, v);
    if (!strcmp(k, "table")) return hc_option_copy(st->table, sizeof st->table, v);
    if (!strcmp(k, "stats")) return hc_option_copy(st->stats, sizeof st->stats, v);
    return 0;
}

/* HEAPCAST_PLACE parsed into hp_set; 0 (with one line on stderr) on anything it cannot parse. */
static int hp_parse_options(void) {
    static const struct hc_option table[] = {HP_OPTIONS(HC_OPTION_ROW)};
    struct hp_settings st = {0};
    if (!hc_options_read("HEAPCAST_PLACE", table, sizeof table / sizeof table[0], hp_apply, &st,
                         "heapcast place: ", "; passing every call through"))
        return 0;
    if (st.mode == HP_SITES && st.sites[0] == 0) {
        hp_say("mode=sites needs sites=FILE; passing every call through");
        return 0;
    }
    if (st.table[0] && st.mode != HP_PREDICT) {
        hp_say("table=FILE needs mode=predict (the counter answers where the table does not); "
               "passing every call through");
        return 0;
    }
    /* the counter learns once the process has learn_mb resident, at most min_mb (with no floor,
     * at once), and at once where a learn file asks for its sites */
    if (st.learn_rss > st.min_rss) st.learn_rss = st.min_rss;
    if (st.learn[0]) st.learn_rss = 0;
    hp_set = st;
    return 1;
}
