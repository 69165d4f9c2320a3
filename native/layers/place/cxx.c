/* Part of layers/place.c (one translation unit; never compiled alone).
 * C++'s operator new and delete, in all their forms.
 * jemalloc exports its own (they call mallocx and sdallocx, never malloc): without these a C++
 * program's new would reach jemalloc past the layer, never placed, never sampled. Each new here
 * asks the site's class like malloc; a long site goes to the long arena, and a failure there to
 * the next operator new, which throws (or returns NULL, nothrow) as without the layer. Each
 * delete ends the block's sample, then calls the next delete of the same signature. The next
 * functions are looked up on first use (HC_NEXT, ../../real.h: jemalloc's, else libstdc++'s,
 * which call malloc and free, our hooks, again: harmless). std::align_val_t is a size_t in the
 * ABI, a nothrow_t& a pointer. */

/* X(mangled name, parameter list, argument list, the alignment argument or 0) */
#define HP_NEWS(X)                                                                                \
    X(_Znwm, (size_t n), (n), 0)                                                                  \
    X(_Znam, (size_t n), (n), 0)                                                                  \
    X(_ZnwmRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), 0)                                \
    X(_ZnamRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), 0)                                \
    X(_ZnwmSt11align_val_t, (size_t n, size_t al), (n, al), al)                                   \
    X(_ZnamSt11align_val_t, (size_t n, size_t al), (n, al), al)                                   \
    X(_ZnwmSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), al) \
    X(_ZnamSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), al)

#define HP_DELETES(X)                                                                             \
    X(_ZdlPv, (void *p), (p))                                                                     \
    X(_ZdaPv, (void *p), (p))                                                                     \
    X(_ZdlPvm, (void *p, size_t n), (p, n))                                                       \
    X(_ZdaPvm, (void *p, size_t n), (p, n))                                                       \
    X(_ZdlPvRKSt9nothrow_t, (void *p, const void *nt), (p, nt))                                   \
    X(_ZdaPvRKSt9nothrow_t, (void *p, const void *nt), (p, nt))                                   \
    X(_ZdlPvSt11align_val_t, (void *p, size_t al), (p, al))                                       \
    X(_ZdaPvSt11align_val_t, (void *p, size_t al), (p, al))                                       \
    X(_ZdlPvmSt11align_val_t, (void *p, size_t n, size_t al), (p, n, al))                         \
    X(_ZdaPvmSt11align_val_t, (void *p, size_t n, size_t al), (p, n, al))                         \
    X(_ZdlPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const void *nt), (p, al, nt))     \
    X(_ZdaPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const void *nt), (p, al, nt))

#define HP_UNPAREN_(...) __VA_ARGS__
#define HP_UNPAREN(list) HP_UNPAREN_ list
/* Each new: the short path (hp_short: the site not long, no sample due) jumps to the next new;
 * the whole path (the next function, the site, the decision) is out of line, and the rest of it
 * (long, a sample, start-up) further out. name##_next starts as name##_lazy, which looks the
 * next new up on its first call (never NULL: the short path jumps to it unasked). */
#define HP_NEW_(name, params, args, align)                                                        \
    static void *name##_lazy params;                                                              \
    static void *(*name##_next) params = name##_lazy;                                             \
    static __attribute__((noinline)) void *name##_rest(uintptr_t site, int on, int lng,           \
                                                       HP_UNPAREN(params)) {                      \
        void *p = NULL;                                                                           \
        if (HP_UNLIKELY(lng))                                                                     \
            p = hp_long_alloc(n, (align) ? HP_MALLOCX_LG_ALIGN(__builtin_ctzll(align)) : 0);     \
        if (p == NULL) {                                                                          \
            lng = 0; /* not in the long arena: jemalloc's own new serves it */                    \
            void *(*f) params = __atomic_load_n(&name##_next, __ATOMIC_ACQUIRE);                  \
            p = f args;                                                                           \
        }                                                                                         \
        if (on && hp_sampling()) hp_sample(p, site, lng);                                         \
        return p;                                                                                 \
    }                                                                                             \
    static inline __attribute__((always_inline)) void *name##_whole params {                      \
        uintptr_t site = HP_SITE;                                                                 \
        int on = 1, lng;                                                                          \
        if (HP_LIKELY(__atomic_load_n(&hp_plain, __ATOMIC_ACQUIRE)))                              \
            lng = hp_long_plain(n, site);                                                         \
        else                                                                                      \
            lng = (on = hp_on()) && hp_long(n, site);                                             \
        void *(*f) params = __atomic_load_n(&name##_next, __ATOMIC_ACQUIRE);                      \
        if (HP_LIKELY(!lng) && (!on || hp_unsampled())) return f args;                            \
        return name##_rest(site, on, lng, HP_UNPAREN(args));                                      \
    }                                                                                             \
    static __attribute__((noinline)) void *name##_slow params { return name##_whole args; }       \
    static __attribute__((noinline)) void *name##_undo params {                                   \
        hp_tls_countdown++;                                                                       \
        return name##_whole args;                                                                 \
    }                                                                                             \
    static __attribute__((noinline)) HP_SHORT_FN void *name##_gated params {                      \
        int how = hp_gated((uintptr_t)__builtin_return_address(0));                               \
        if (HP_LIKELY(how == HP_SHORT)) return HP_JUMP(name##_next) args;                        \
        if (how == HP_UNDO) return name##_undo args;                                              \
        return name##_slow args;                                                                  \
    }                                                                                             \
    HP_EXPORT void *name params;                                                                  \
    HP_SHORT_FN void *name params {                                                               \
        int how = hp_short();                                                                     \
        if (HP_LIKELY(how == HP_SHORT)) return HP_JUMP(name##_next) args;                        \
        if (how == HP_GATED) return name##_gated args;                                            \
        if (how == HP_UNDO) return name##_undo args;                                              \
        return name##_slow args;                                                                  \
    }                                                                                             \
    static void *name##_lazy params {                                                             \
        void *(*f) params = (void *(*)params)dlsym(RTLD_NEXT, #name);                             \
        if (f == NULL) return malloc(n); /* no next new: malloc's (a later call asks again) */   \
        __atomic_store_n(&name##_next, f, __ATOMIC_RELEASE);                                      \
        return f args;                                                                            \
    }
HP_NEWS(HP_NEW_)

/* Each delete: one jump through name##_now: the next delete of its signature (name##_next:
 * name##_lazy until looked up, as the news') while the counter waits to learn, name##_watch
 * (a sampled block's verdict first, out of line) once it learns (watch.c). */
#define HP_DELETE_(name, params, args)                                                            \
    static void name##_lazy params;                                                               \
    static void (*name##_next) params = name##_lazy;                                              \
    static void (*name##_now) params = name##_lazy;                                               \
    static __attribute__((noinline)) void name##_rest params {                                    \
        if (__atomic_load_n(&hp_watching, __ATOMIC_ACQUIRE)) hp_free_sampled(p);                  \
        __atomic_load_n(&name##_next, __ATOMIC_ACQUIRE) args;                                     \
    }                                                                                             \
    static void name##_watch params {                                                             \
        if (HP_UNLIKELY(hp_is_sampled(p))) {                                                      \
            name##_rest args;                                                                     \
            return;                                                                               \
        }                                                                                         \
        HP_JUMP(name##_next) args;                                                                \
    }                                                                                             \
    HP_EXPORT void name params;                                                                   \
    void name params { HP_JUMP(name##_now) args; }                                                \
    static void name##_lazy params {                                                              \
        void (*f) params = (void (*)params)dlsym(RTLD_NEXT, #name);                               \
        if (f == NULL) { /* no next delete: free (a later call asks again) */                     \
            free(p);                                                                              \
            return;                                                                               \
        }                                                                                         \
        __atomic_store_n(&name##_next, f, __ATOMIC_RELEASE);                                      \
        /* the delete jumps to it from now on, unless the counter learns meanwhile (watch) */    \
        void (*lazy) params = name##_lazy;                                                        \
        __atomic_compare_exchange_n(&name##_now, &lazy, f, 0, __ATOMIC_ACQ_REL,                   \
                                    __ATOMIC_ACQUIRE);                                            \
        f args;                                                                                   \
    }
HP_DELETES(HP_DELETE_)
