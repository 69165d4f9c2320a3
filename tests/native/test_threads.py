"""Threads: per-thread numbering, buffers and exact per-thread records."""

from __future__ import annotations

from collections import Counter

import numpy as np

from tasks.format.trace_reader import Op


def thread_of_tid(trace) -> dict[int, int]:
    """OS tid -> trace thread number, from the THREAD_START records."""
    starts = trace.op == Op.THREAD_START
    return dict(zip(trace.arg[starts].tolist(), trace.thread[starts].tolist()))


def test_eight_threads_have_exact_per_thread_records(program, run_traced, assert_frees_paired):
    # GIVEN 8 threads; worker i makes 100*(i+1) mallocs of sizes 1000*(i+1)+j, then frees them
    exe = program("threads")

    # WHEN it runs traced
    run = run_traced([exe])

    # THEN it behaves as untraced, and writes one trace
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stderr == ""
    assert len(run.traces) == 1
    trace = run.traces[0]
    workers = {
        int(w): int(tid) for _, w, tid in (line.split() for line in run.proc.stdout.splitlines())
    }
    assert len(workers) == 8

    # AND thread numbers are 0..8, the main thread (first to allocate) being 0, one THREAD_START each
    tids = thread_of_tid(trace)
    assert sorted(tids.values()) == list(range(9))
    assert tids[trace.header.pid] == 0
    assert set(workers.values()) <= set(tids)

    # AND each worker's records are exactly its THREAD_START, its mallocs and its frees
    for i, tid in workers.items():
        mine = trace.thread == tids[tid]
        ops = trace.op[mine]
        count = 100 * (i + 1)
        assert Counter(ops.tolist()) == {Op.THREAD_START: 1, Op.MALLOC: count, Op.FREE: count}
        assert ops[0] == Op.THREAD_START
        sizes = trace.size[mine][ops == Op.MALLOC]
        # in call order within the thread: the file is ordered per thread
        assert sizes.tolist() == [1000 * (i + 1) + j for j in range(count)]
        mallocs = trace.addr[mine][ops == Op.MALLOC]
        frees = trace.addr[mine][ops == Op.FREE]
        assert frees.tolist() == mallocs[::-1].tolist()
        # per-thread time never goes backwards
        assert np.all(np.diff(trace.records["time"][mine].astype(np.int64)) >= 0)

    assert_frees_paired(trace)


def test_threads_exiting_while_others_allocate(program, run_traced, assert_frees_paired):
    # GIVEN 2 long-lived threads looping malloc(777)/free while 50 short threads are created and
    # joined one after another, short thread k doing 10 mallocs of 5000+k then 10 frees
    exe = program("thread_churn")

    # WHEN it runs traced
    run = run_traced([exe])

    # THEN every exited thread's buffer was flushed: each short thread's records are exact
    assert run.proc.returncode == 0, run.proc.stderr
    (trace,) = run.traces
    tids = thread_of_tid(trace)
    assert len(tids) == 1 + 2 + 50
    longs, shorts = {}, {}
    for line in run.proc.stdout.splitlines():
        kind, a, b = line.split()
        if kind == "long":
            longs[int(a)] = int(b)
        else:
            shorts[int(a)] = int(b)
    for k, tid in shorts.items():
        mine = trace.thread == tids[tid]
        assert trace.op[mine].tolist() == [Op.THREAD_START] + [Op.MALLOC] * 10 + [Op.FREE] * 10
        assert trace.size[mine][1:11].tolist() == [5000 + k] * 10
    # AND the long threads' records are exact too: one malloc(777) and one free per iteration
    for tid, iterations in longs.items():
        mine = trace.thread == tids[tid]
        ops = trace.op[mine]
        assert ops[0] == Op.THREAD_START
        assert Counter(ops.tolist()) == {
            Op.THREAD_START: 1,
            Op.MALLOC: iterations,
            Op.FREE: iterations,
        }
        assert np.all(trace.size[mine][ops == Op.MALLOC] == 777)
    assert_frees_paired(trace)
