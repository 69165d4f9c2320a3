/*
 * heapcast tracer: an LD_PRELOAD library that records every malloc-family call of a process
 * into a raw trace file (format: native/FORMAT.md, mirrored in heapcast_format.h).
 *
 * The tracer is deliberately dumb: it writes one fixed-size record per call and knows nothing of
 * pairing, sizes of freed blocks or symbols. All interpretation happens offline.
 *
 * Data path (per call, no lock, no syscall):
 *   hook -> thread-local guard -> real allocator -> append one record to this thread's buffer.
 * Slow paths (rare): first call of a thread (register a buffer, THREAD_START), full buffer (one
 * write()), thread exit (pthread key destructor), fork, exec, exit.
 * With HEAPCAST_CALLER=1 the slow paths also keep the module map in the trace (hc_modules_scan:
 * at start, then whenever the loader's load/unload counters moved, checked at each buffer flush,
 * thread exit, exec and exit); the data path only stores the return address.
 *
 * Invariants the code relies on:
 *   - Only the owning thread appends to its buffer and only it moves `pos` (release store after
 *     the record's bytes are written). Other threads (exit/exec flush) only read `pos` and move
 *     `flushed`, under the buffer's lock, so a record is written to the file exactly once.
 *   - Every lock the tracer takes is taken with the thread's guard set. A signal handler that
 *     interrupts the tracer on the same thread therefore sees the guard and calls the real
 *     allocator untraced: it never waits on a lock its own thread holds (no deadlock), at the
 *     cost of not recording allocations made by a handler that interrupted a hook.
 *   - The tracer never calls the hooked functions itself; with the guard set, anything libc
 *     allocates on our behalf (dlsym, pthread_setspecific, atexit) passes through untraced.
 *
 * The parts (heapcast_*.c, one concern each) are compiled as this one translation unit
 * (mimalloc's src/static.c), so that the hooks inline the data path as in one file; they are
 * never compiled alone. The hooks (the LD_PRELOAD front end, as heaptrack's
 * heaptrack_preload.cpp) are apart from the writer (as its libheaptrack.cpp), which they use
 * through hc_enter, hc_emit, hc_leave and hc_finish:
 *   heapcast_state.c    the writer's per-thread and process-wide state
 *   heapcast_file.c     the record clock, the stderr line, the trace file and its header, the
 *                       serialised write
 *   heapcast_unwind.c   the unwinder: a frame's rule from the module's .eh_frame, cached
 *   heapcast_modules.c  the module map (HEAPCAST_CALLER=1)
 *   heapcast_writer.c   per-thread buffers (the data path, hc_emit, and its slow paths); start,
 *                       exit, fork; the guard (hc_enter, hc_leave)
 *   heapcast_stacks.c   call stacks (HEAPCAST_FRAMES): the stack trie and each thread's cache
 *   heapcast_hooks.c    the hooks: malloc family, exec family, _exit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bootstrap_pool.h"
#include "module_range.h"
#include "heapcast_format.h"
#include "say.h"
#include "options.h"

#define HC_EXPORT __attribute__((visibility("default")))
#define HC_LIKELY(x) __builtin_expect(!!(x), 1)
#define HC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HC_NOINLINE __attribute__((noinline, cold))
#define HC_SIGNAL_FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

/* Per-thread buffer: 256 KiB = 8192 records of 32 bytes (6553 of 40). Big enough that a flush
 * (one write() of 256 KiB, ~50-100 us) costs well under 1 ns per record; small enough that a
 * process with hundreds of threads stays in tens of MiB. */
#define HC_BUFFER_BYTES (256u * 1024u)
/* Records of threads whose buffer is already retired (frees made by other TLS destructors and by
 * libc after our key destructor ran) go to one shared buffer under a lock: rare by construction. */
#define HC_ORPHAN_BYTES (64u * 1024u)
/* TSC calibration window at start; refined over the whole run at exit (see hc_refine_clock). */
#define HC_CALIBRATE_NS 500000ull

/* ------------------------------------------------------------------------------------------- */
/* The hooked functions, listed once. X(name, return type, parameter list)                      */


/* Functions that replace the process image or end it: we flush before calling the real one. */
#define HC_EXIT_FUNCS(X)                                                                          \
    X(execve, int, (const char *, char *const[], char *const[]))                                 \
    X(execv, int, (const char *, char *const[]))                                                 \
    X(execvp, int, (const char *, char *const[]))                                                \
    X(execvpe, int, (const char *, char *const[], char *const[]))                                \
    X(fexecve, int, (int, char *const[], char *const[]))                                         \
    X(_exit, void, (int))                                                                        \
    X(_Exit, void, (int))

/* The real functions (real.h: hc_real, hc_resolve, HC_REAL): the exit functions first, the
 * allocator's (real.h's one list, HC_REAL_ALLOC) last. While dlsym runs, bootstrap_pool.h serves
 * its calloc. */
#define HC_REAL_FUNCS(X) HC_EXIT_FUNCS(X) HC_REAL_ALLOC(X)
#include "real.h"

/* clang-format off */
#include "heapcast_state.c"
#include "heapcast_file.c"
#include "heapcast_unwind.c"
#include "heapcast_modules.c"
#include "heapcast_writer.c"
#include "heapcast_stacks.c"
#include "heapcast_hooks.c"
/* clang-format on */
