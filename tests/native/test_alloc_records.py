"""One record per call of every hooked function, with the fields FORMAT.md gives."""

from __future__ import annotations

import numpy as np

from tasks.format.trace_reader import Op


def printed(stdout: str) -> dict[str, tuple[int, int]]:
    return {name: (int(a), int(b)) for name, a, b in (line.split() for line in stdout.splitlines())}


def test_every_allocation_function_is_recorded_exactly(program, run_traced, assert_frees_paired):
    # GIVEN a program calling each allocation function once with known sizes
    exe = program("allocs")

    # WHEN it runs traced
    run = run_traced([exe])

    # THEN the records are exactly these calls, in order, with the addresses the program saw
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    got = printed(run.proc.stdout)
    page = 4096
    expected = [
        (Op.THREAD_START, 0, trace.header.pid, 0),
        (Op.MALLOC, got["malloc"][0], 0, 100),
        (Op.CALLOC, got["calloc"][0], 0, 300),
        (Op.REALLOC, got["realloc"][0], got["malloc"][0], 5000),
        (Op.REALLOC, got["realloc_null"][0], 0, 50),  # realloc(NULL, n): old address 0
        (Op.REALLOC, 0, got["realloc_null"][0], 0),  # realloc(p, 0) frees: addr 0
        (Op.REALLOCARRAY, got["reallocarray"][0], got["calloc"][0], 800),
        (Op.POSIX_MEMALIGN, got["posix_memalign"][0], 64, 1000),
        (Op.ALIGNED_ALLOC, got["aligned_alloc"][0], 128, 1024),
        (Op.MEMALIGN, got["memalign"][0], 256, 2000),
        (Op.VALLOC, got["valloc"][0], page, 3000),
        (Op.PVALLOC, got["pvalloc"][0], page, 5000),
        (Op.MALLOC, 0, 0, (1 << 40) - 1),  # failed 2^62-byte malloc: addr 0, size saturated
        # free(NULL) is not recorded
        *[
            (Op.FREE, got[name][0], 0, 0)
            for name in (
                "realloc",
                "reallocarray",
                "posix_memalign",
                "aligned_alloc",
                "memalign",
                "valloc",
                "pvalloc",
            )
        ],
    ]
    actual = list(
        zip(trace.op.tolist(), trace.addr.tolist(), trace.arg.tolist(), trace.size.tolist())
    )
    assert actual == [(int(o), a, g, s) for o, a, g, s in expected]
    # AND the aligned forms returned aligned blocks, and malloc_usable_size passed through
    for name, align in (
        ("posix_memalign", 64),
        ("aligned_alloc", 128),
        ("memalign", 256),
        ("valloc", page),
        ("pvalloc", page),
    ):
        assert got[name][0] % align == 0
    assert got["usable"][0] >= 5000
    assert trace.header.record_size == 32 and not trace.header.has_caller
    assert np.all(trace.thread == 0)
    assert_frees_paired(trace)


def test_caller_addresses_are_recorded_on_request(program, run_traced):
    # GIVEN HEAPCAST_CALLER=1
    exe = program("allocs")

    # WHEN the program runs traced
    run = run_traced([exe], HEAPCAST_CALLER="1")

    # THEN records are 40 bytes with the caller flag, and every call's caller is an address in
    # the program's main() (all calls are made from main), THREAD_START has caller 0
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    assert trace.header.record_size == 40 and trace.header.has_caller
    main = printed(run.proc.stdout)["main"][0]
    calls = trace.op != Op.THREAD_START
    callers = trace.caller[calls]
    assert np.all(callers > main) and np.all(callers < main + 4096)
    assert trace.caller[~calls].tolist() == [0]
    assert len(trace) == 20  # as in test_every_allocation_function_is_recorded_exactly
