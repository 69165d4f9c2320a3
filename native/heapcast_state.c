/* Part of heapcast.c (one translation unit; never compiled alone): the writer's state.
 * Per thread: its buffer and its guard (initial-exec TLS). Process-wide: the trace file, the
 * clock, the registry of live buffers, the orphan buffer. */

/* Per-thread state */

struct hc_stack_slot { /* heapcast_stacks.c: a thread's cache of stack hash -> stack id */
    uint64_t hash, id;
};
struct hc_walk; /* heapcast_stacks.c */

struct hc_buffer {
    size_t pos;     /* bytes appended; written only by the owner (release), reset under lock */
    size_t cap;     /* data capacity; 0 for the two sentinels below (forces the slow path) */
    size_t flushed; /* bytes already written to the file; under lock */
    int retired;    /* under lock: no more writes from this buffer */
    pthread_mutex_t lock;
    struct hc_buffer *prev, *next; /* registry, under hc_registry_lock */
    size_t map_bytes;              /* mmap length, 0 for static buffers */
    unsigned char *data;
    struct hc_stack_slot *stack_cache; /* with stacks: HC_STACK_CACHE slots in the mapping */
    struct hc_walk *walk;              /* with stacks: the thread's last walk, in the mapping */
};

/* Sentinels: a thread that has not allocated yet points at hc_unregistered, a thread whose key
 * destructor already ran points at hc_retired. Both have cap 0, so the single bounds check of the
 * data path routes them to the slow path without an extra branch. */
static struct hc_buffer hc_unregistered = {.cap = 0};
static struct hc_buffer hc_retired = {.cap = 0};

struct hc_tls {
    int guard;            /* nonzero while inside the tracer: nested calls pass through */
    struct hc_buffer *buf; /* this thread's buffer or a sentinel */
    uint64_t thread_bits; /* thread number << 48, ready to OR into `packed` */
};

/* initial-exec TLS model, on purpose:
 *   - Why: the default (global-dynamic) model for a shared library reaches TLS through
 *     __tls_get_addr, which may allocate the thread's TLS block lazily with malloc -> our malloc
 *     -> __tls_get_addr -> ... infinite recursion before the guard can even be read. initial-exec
 *     is a fixed offset from the thread pointer: no call, no allocation, and 1-2 ns faster.
 *   - Risk: initial-exec TLS must live in the static TLS area reserved at program start. That
 *     is always fine for LD_PRELOAD (the library is loaded before the area is sized), but a
 *     dlopen() of libheapcast.so can fail with "cannot allocate memory in static TLS block".
 *   - Escape hatch: load it with LD_PRELOAD (the only supported way), or reserve surplus with
 *     GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096. */
static __thread struct hc_tls hc_tls __attribute__((tls_model("initial-exec"))) = {
    .guard = 0, .buf = &hc_unregistered, .thread_bits = 0};

/* Process-wide state */

enum { HC_UNINIT = 0, HC_INITING = 1, HC_READY = 2 };
static int hc_state = HC_UNINIT;
static int hc_tracing; /* 1 while records are written; read relaxed on every call */
static int hc_fd = -1; /* O_APPEND trace file */
static dev_t hc_fd_dev;
static ino_t hc_fd_ino;
static uint32_t hc_record_size = sizeof(struct hc_record);
static uint32_t hc_flags;
static unsigned hc_frames; /* HEAPCAST_FRAMES: frames recorded per allocation, 0 = no stacks */
static uint32_t hc_clock = HC_CLOCK_MONOTONIC;
static uint64_t hc_start_ticks;
static uint64_t hc_start_mono_ns;
static double hc_ns_per_tick = 1.0;
static uint64_t hc_pagesize = 4096;
static char hc_out_dir[PATH_MAX];
static char hc_path[PATH_MAX];
static pthread_key_t hc_key;
static int hc_key_ok;
static int hc_told; /* the one stderr line of this process was printed */

static pthread_mutex_t hc_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t hc_file_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hc_buffer *hc_registry; /* live thread buffers */
static uint32_t hc_next_thread;       /* next thread number, atomic */

/* The stack trie (heapcast_stacks.c): nodes by id, and an open-addressing index of them by
 * (parent, address), under hc_trie_lock. */
#define HC_STACK_CACHE 4096u /* slots of a thread's stack cache: 64 KiB */
struct hc_node {
    uint64_t parent, addr;
    uint32_t depth;
};
static pthread_mutex_t hc_trie_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hc_node *hc_nodes; /* by id; [0] unused */
static uint64_t hc_node_count, hc_node_cap;
static uint32_t *hc_trie_index; /* node ids, 0 = empty */
static uint64_t hc_trie_cap;
static void hc_stacks_replay(void);

static unsigned char hc_orphan_data[HC_ORPHAN_BYTES] __attribute__((aligned(64)));
static struct hc_buffer hc_orphan = {
    .cap = HC_ORPHAN_BYTES, .lock = PTHREAD_MUTEX_INITIALIZER, .data = hc_orphan_data};
