/*
 * The option parser of every heapcast LD_PRELOAD library: the layers' one variable of
 * name=value items (HEAPCAST_LAYER, HEAPCAST_PLACE) read through their table of options, and the
 * values of the tracer's own variables (HEAPCAST_OUT, HEAPCAST_CLOCK, HEAPCAST_CALLER). One copy,
 * included once per library, after say.h.
 *
 * A library lists its options once, X(name, default, doc), and hands the table to
 * hc_options_read with a function that applies one value to its settings:
 *
 *     static const struct hc_option table[] = {HL_OPTIONS(HC_OPTION_ROW)};
 *     hc_options_read("HEAPCAST_LAYER", table, n, hl_apply, &settings, "heapcast layer: ",
 *                     "; running as a pass-through");
 *
 * Rules, the same for every library: the defaults are applied first, from the table; then the
 * variable's items, separated by commas (empty items skipped), in order (a name given twice: the
 * last wins). An item that is not name=value, names no option of the table, or whose value the
 * library refuses: one line on stderr naming it and the options, and 0 (the library then steps
 * aside, the program runs on). Numbers are decimal digits only (a size may end in K, M or G), no
 * sign, no space.
 *
 * Read once at start, inside the first hooked call or a constructor: no allocation (getenv, a
 * stack copy of the variable), no stdio (say.h's stack buffer).
 */
#ifndef HEAPCAST_OPTIONS_H
#define HEAPCAST_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HEAPCAST_SAY_H
#error "include say.h before options.h"
#endif

struct hc_option {
    const char *name, *dflt;
};
/* A row of a library's X(name, default, doc) table */
#define HC_OPTION_ROW(name, dflt, doc) {#name, dflt},

/* Applies one option's value to the library's settings; 0: the value is refused. */
typedef int (*hc_option_apply)(void *settings, const char *name, const char *value);

/* The variable's value as at most 2047 characters (HC_OPTIONS_MAX - 1) */
#define HC_OPTIONS_MAX 2048

/* "123" -> 123, within [lo, hi]; 0 on anything else (empty, a sign, a space, a suffix, too
 * large). */
static inline int hc_option_uint(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!*s) return 0;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (*s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* "123", "64K", "1M", "2G" (or k, m, g) -> bytes; 0 on anything else. */
static inline int hc_option_size(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return 0;
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
    *out = v << shift;
    return 1;
}

/* The index of v among words[0..n), or -1 (v NULL, or none of them). */
static inline int hc_option_word(const char *v, const char *const *words, int n) {
    if (v == NULL) return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, words[i])) return i;
    return -1;
}

/* v copied into dst (cap bytes, the terminating 0 included); 0 if it does not fit. */
static inline int hc_option_copy(char *dst, size_t cap, const char *v) {
    size_t len = strlen(v);
    if (len >= cap) return 0;
    memcpy(dst, v, len + 1);
    return 1;
}

/* The line for an item that cannot be parsed: "<who>cannot parse VAR item 'ITEM' (options: a b
 * c)<fallback>" (the item cut at 200 characters). */
static inline void hc_options_refuse(const char *var, const struct hc_option *table, size_t n,
                              const char *item, const char *who, const char *fallback) {
    char line[1024];
    char *end = line + sizeof line - 1, *p = line;
    p = hc_text(p, end, who);
    p = hc_text(p, end, "cannot parse ");
    p = hc_text(p, end, var);
    p = hc_text(p, end, " item '");
    p = hc_text(p, p + 200 < end ? p + 200 : end, item);
    p = hc_text(p, end, "' (options:");
    for (size_t i = 0; i < n; i++) p = hc_text(hc_text(p, end, " "), end, table[i].name);
    p = hc_text(p, end, ")");
    p = hc_text(p, end, fallback);
    *p++ = '\n';
    hc_write_all(2, line, (size_t)(p - line));
}

/* The settings from the table's defaults and the variable `var` (see the rules above); 1, or 0
 * after one line on stderr ("<who>...<fallback>") when something cannot be parsed. */
static inline int hc_options_read(const char *var, const struct hc_option *table, size_t n,
                           hc_option_apply apply, void *settings, const char *who,
                           const char *fallback) {
    for (size_t i = 0; i < n; i++)
        if (!apply(settings, table[i].name, table[i].dflt)) { /* a default refused: a bug */
            hc_say_line(who, "the default of ", table[i].name, " is refused", fallback);
            return 0;
        }
    const char *env = getenv(var);
    if (env == NULL) return 1;
    char buf[HC_OPTIONS_MAX];
    if (!hc_option_copy(buf, sizeof buf, env)) {
        hc_say_line(who, var, " is too long", fallback, "");
        return 0;
    }
    for (char *item = buf, *next; item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        if (!*item) continue;
        char *eq = strchr(item, '=');
        int ok = 0;
        if (eq) {
            *eq = '\0';
            for (size_t i = 0; i < n && !ok; i++) ok = !strcmp(item, table[i].name);
            ok = ok && apply(settings, item, eq + 1);
            *eq = '=';
        }
        if (!ok) {
            hc_options_refuse(var, table, n, item, who, fallback);
            return 0;
        }
    }
    return 1;
}

#endif
