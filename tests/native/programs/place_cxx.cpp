// C++'s operator new and delete under the placement layer: bursts of short-lived requests (a ring
// of 64, strings and maps) beside long-lived entries from another call site, kept to the end;
// array, aligned (alignas(64)), nothrow and sized forms; a request too large to serve, whose
// std::bad_alloc is caught. One checksum line; exit 3 on a failed check.
// usage: place_cxx BURSTS REQUESTS EVERY
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

struct Request {
    std::string key;
    std::map<int, std::string> fields;
    char body[96];
};

struct alignas(64) Entry {
    uint64_t id;
    char value[120];
};

__attribute__((noinline)) static Request *new_request(int i) {
    Request *r = new Request;
    r->key = "request-" + std::to_string(i);
    r->fields[i % 7] = r->key;
    r->body[0] = (char)i;
    return r;
}

__attribute__((noinline)) static Entry *new_entry(uint64_t id) {
    Entry *e = new Entry;
    if ((uintptr_t)e % 64 != 0) std::exit(3);
    e->id = id;
    e->value[0] = (char)id;
    return e;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int bursts = std::atoi(argv[1]), requests = std::atoi(argv[2]), every = std::atoi(argv[3]);
    std::vector<Entry *> entries;
    Request *ring[64] = {};
    uint64_t sum = 0;
    for (int b = 0; b < bursts; b++) {
        for (int i = 0; i < requests; i++) {
            Request *&slot = ring[i % 64];
            if (slot) {
                sum += slot->key.size() + (unsigned char)slot->body[0];
                delete slot;
            }
            slot = new_request(i);
            if (i % every == 0) entries.push_back(new_entry(entries.size()));
            int *arr = new int[16 + i % 32];
            arr[0] = i;
            sum += (unsigned)arr[0] & 1;
            delete[] arr;
            char *nt = new (std::nothrow) char[200];
            if (!nt) return 3;
            delete[] nt;
        }
    }
    for (Request *&r : ring) delete r;
    try {
        char *huge = new char[(size_t)1 << 60];
        huge[0] = 1;
        std::puts("huge served");
    } catch (const std::bad_alloc &) {
        std::puts("bad_alloc");
    }
    if (new (std::nothrow) char[(size_t)1 << 60] != nullptr) return 3;
    for (Entry *e : entries) sum += e->id + (unsigned char)e->value[0], delete e;
    std::printf("entries=%zu sum=%llu\n", entries.size(), (unsigned long long)sum);
    return 0;
}
