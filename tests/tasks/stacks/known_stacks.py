"""A hand-made run with call stacks whose StackProfile is known exactly: two processes of one
program (`/bin/prog`, loaded at a different address in each), written as version-3 traces
(tests.tracegen).

pid 10 (two threads): stack A allocates 100 (freed after B's allocation: not a temporary) and
50 (freed at once: a temporary, though thread 1 allocates in between), B 200, C 1000 (never
freed), D 8 on thread 1 (a temporary). pid 11: A 500, reallocated by B to 800 (the realloc is
its thread's next allocation and frees it first: A's block is a temporary), then freed (B's
last block: a temporary too). The run's peak is 2000 bytes at 65 ns (pid 10: B's 200 and C's
1000; pid 11: B's 800); pid 10's heap (C's 1000) is released after its last call at 70 ns.
"""

from __future__ import annotations

from pathlib import Path

from tasks.format.trace_reader import Op
from tests.tracegen import Rec, StackTrie, free, malloc, module, thread_start, write_trace

PROG = "/bin/prog"
# frames as offsets in /bin/prog, innermost first
A = (0x1010, 0x1100, 0x1200)
B = (0x1020, 0x1100, 0x1200)
C = (0x1010, 0x1300)
D = (0x1030,)
# per stack (A, B, C, D): what the profile must say
EXPECTED = {
    A: {"calls": 3, "bytes": 650, "peak": 0, "leaked": 0, "temporaries": 2},
    B: {"calls": 2, "bytes": 1000, "peak": 1000, "leaked": 0, "temporaries": 1},
    C: {"calls": 1, "bytes": 1000, "peak": 1000, "leaked": 1000, "temporaries": 0},
    D: {"calls": 1, "bytes": 8, "peak": 0, "leaked": 0, "temporaries": 1},
}
PEAK = 2000


def _at(frames: tuple[int, ...], base: int) -> tuple[int, ...]:
    return tuple(base + f for f in frames)


def write_run(folder: Path) -> list[Path]:
    """The run's two traces in `folder` (named as the tracer names them)."""
    base = 0x555555554000  # pid 10: a PIE, loaded here (bias = base)
    trie = StackTrie()
    a, b, c, d = (trie.id(_at(s, base)) for s in (A, B, C, D))
    p10 = [
        thread_start(0, tid=10),
        malloc(10, 100, 0x1000, caller=base + A[0], stack=a),
        malloc(20, 200, 0x2000, caller=base + B[0], stack=b),
        free(30, 0x1000),
        malloc(40, 50, 0x3000, caller=base + A[0], stack=a),
        thread_start(44, tid=12, thread=1),
        malloc(45, 8, 0x6000, thread=1, caller=base + D[0], stack=d),
        free(46, 0x6000, thread=1),
        free(50, 0x3000),
        malloc(60, 1000, 0x4000, caller=base + C[0], stack=c),
        free(70, 0x2000),
    ]
    first = write_trace(
        folder / "10-1700000000000000000.hct",
        module(0, base, base + 0x100000, base, PROG) + trie.records() + p10,
        stacks=True,
        pid=10,
    )
    base = 0x7F0000000000  # pid 11: loaded elsewhere (bias = base)
    trie = StackTrie()
    a, b = (trie.id(_at(s, base)) for s in (A, B))
    p11 = [
        thread_start(1, tid=11),
        malloc(55, 500, 0x1000, caller=base + A[0], stack=a),
        Rec(65, Op.REALLOC, 800, 0x5000, 0x1000, 0, base + B[0], b),
        free(80, 0x5000),
    ]
    second = write_trace(
        folder / "11-1700000000000000001.hct",
        module(0, base, base + 0x100000, base, PROG) + trie.records() + p11,
        stacks=True,
        pid=11,
        ppid=10,
    )
    return [first, second]
