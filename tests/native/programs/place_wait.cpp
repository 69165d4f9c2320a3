// The placement layer's counter beginning to learn while threads allocate and free: THREADS
// threads each make ROUNDS rounds of short-lived requests (new/delete, new[]/delete[], sized and
// aligned deletes, malloc/free), keeping one long-lived entry every 64 rounds to the end. Once
// every thread is halfway, the main thread touches BALLAST_MB of memory (kept to the end) and
// lets them go on, so that the process passes the layer's learn_mb before their second halves:
// free and every delete change their path while they run. One checksum line; exit 3 on a failed
// check.
// usage: place_wait THREADS ROUNDS BALLAST_MB
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

struct alignas(64) Entry {
    uint64_t id;
    char value[56];
};

static std::atomic<int> halfway{0};
static std::atomic<bool> ballast_done{false};

__attribute__((noinline)) static Entry *new_entry(uint64_t id) {
    Entry *e = new Entry;
    e->id = id;
    memset(e->value, (int)(id & 0x7f), sizeof e->value);
    return e;
}

static uint64_t work(int t, int rounds, std::vector<Entry *> &kept) {
    uint64_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        if (r == rounds / 2) {
            halfway.fetch_add(1);
            while (!ballast_done.load()) std::this_thread::yield();
        }
        char *s = new char[32 + (r % 200)];
        s[0] = (char)r;
        sum += (unsigned char)s[0];
        delete[] s;
        uint64_t *w = new uint64_t(r);
        sum += *w;
        ::operator delete(w, sizeof *w); // sized delete
        Entry *a = new Entry;             // aligned new, aligned delete
        a->id = (uint64_t)r;
        sum += a->id & 1;
        delete a;
        void *m = malloc(48 + (r % 100));
        if (!m) exit(3);
        memset(m, 1, 48);
        sum += ((unsigned char *)m)[0];
        free(m);
        if (r % 64 == 0) kept.push_back(new_entry((uint64_t)t << 32 | (uint64_t)r));
    }
    return sum;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: place_wait THREADS ROUNDS BALLAST_MB\n");
        return 2;
    }
    int nthreads = atoi(argv[1]), rounds = atoi(argv[2]);
    size_t ballast_mb = (size_t)atoi(argv[3]);
    std::vector<std::vector<Entry *>> kept((size_t)nthreads);
    std::vector<uint64_t> sums((size_t)nthreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < nthreads; t++)
        threads.emplace_back([&, t] { sums[(size_t)t] = work(t, rounds, kept[(size_t)t]); });
    while (halfway.load() < nthreads) std::this_thread::yield();
    std::vector<char *> ballast;
    for (size_t i = 0; i < ballast_mb * 16; i++) { // 64 KiB blocks, touched
        char *b = static_cast<char *>(malloc(65536));
        if (!b) exit(3);
        memset(b, (int)i, 65536);
        ballast.push_back(b);
    }
    ballast_done.store(true);
    for (auto &th : threads) th.join();
    uint64_t total = 0;
    size_t entries = 0;
    for (int t = 0; t < nthreads; t++) {
        total += sums[(size_t)t];
        for (Entry *e : kept[(size_t)t]) {
            total += e->id & 0xff;
            delete e;
            entries++;
        }
    }
    for (char *b : ballast) total += (unsigned char)b[100], free(b);
    printf("entries=%zu sum=%llu\n", entries, (unsigned long long)total);
    return 0;
}
