// The C++ part of the known call tree (calltree.c execs it; tests/native/test_call_stacks.py
// holds the stacks it expects): `new` of a block of a size of its own (7401 and up) on paths
// an exception is thrown through, during its unwinding and after it is caught.
//
//   7401  exception_case -> throw_outer -> throw_middle -> throw_leaf -> operator new; then
//         throw_leaf throws (__cxa_allocate_exception mallocs the exception) through
//         throw_middle and throw_outer to exception_case's catch
//   7405  during the unwinding: throw_middle's Guard destructor -> operator new
//   7403  after the catch: exception_case -> after_catch -> operator new
//   7404  after the catch, the same nested path again, no throw this time
//
// Every function on a path is noipa and does work after each call (no tail calls). Prints what
// it caught and exits 4.
#include <cstddef>
#include <cstdio>

#define NOIPA __attribute__((noipa))
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

template <std::size_t N>
struct Blob {
    char bytes[N];
};

struct Thrown {
    int tag;
};

static void *unwound_block;

struct Guard {
    NOIPA ~Guard() {
        if (armed) unwound_block = new Blob<7405>;
    }
    bool armed;
};

NOIPA void *throw_leaf(bool fail) {
    Blob<7401> *first = new Blob<7401>;
    KEEP(first);
    delete first;
    if (fail) throw Thrown{7402};
    void *p = new Blob<7404>;
    KEEP(p);
    return p;
}

NOIPA void *throw_middle(bool fail) {
    Guard guard{fail};
    void *p = throw_leaf(fail);
    KEEP(p);
    return p;
}

NOIPA void *throw_outer(bool fail) {
    void *p = throw_middle(fail);
    KEEP(p);
    return p;
}

NOIPA void *after_catch() {
    void *p = new Blob<7403>;
    KEEP(p);
    return p;
}

NOIPA int exception_case() {
    int caught = 0;
    try {
        throw_outer(true);
    } catch (const Thrown &t) {
        caught = t.tag;
    }
    delete static_cast<Blob<7405> *>(unwound_block);
    delete static_cast<Blob<7403> *>(after_catch());
    // the same path, not thrown: 7401 is made and freed again, 7404 returned
    delete static_cast<Blob<7404> *>(throw_outer(false));
    return caught;
}

int main() {
    std::printf("caught %d\n", exception_case());
    return 4;
}
