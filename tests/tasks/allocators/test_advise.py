"""Advice from the trace (tasks.allocators.trace_facts, advise, rounds) on small synthetic
traces written with tests.tracegen: GIVEN what a program did, WHEN the facts are read and the
candidates derived, THEN the settings follow from it. Quick: no program runs."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.allocators.advise import DERIVED, LAYER_LARGE, advise, heap_share_bound
from tasks.allocators.config import load_allocators_config
from tasks.allocators.trace_facts import heap_facts, mallopt_lines, small_churn_depths
from tasks.format.trace_reader import Op
from tests.tracegen import free, malloc, thread_start, write_trace

MIB = 1024 * 1024
FIXED = ["glibc", "glibc-fixed", "jemalloc", "tcmalloc", "mimalloc"]


@pytest.fixture(scope="module")
def config():
    return load_allocators_config()


def _big_blocks(path, size=40 * MIB, times=10, gap_ns=20_000_000):
    """One thread allocating a block of `size` and freeing it, `times` times."""
    recs = [thread_start(0, tid=100)]
    for i in range(times):
        t = 1_000 + i * gap_ns
        recs += [malloc(t, size, 0x7F0000000000), free(t + gap_ns // 2, 0x7F0000000000)]
    write_trace(path / "1-1.hct", recs)


def _threads(path, n=8, per=50):
    """`n` threads each allocating and freeing small blocks, interleaved in time."""
    recs = [thread_start(i, tid=100 + i, thread=i) for i in range(n)]
    t = 100
    for k in range(per):
        for i in range(n):
            a = 0x10000 + (i * per + k) * 64
            recs += [malloc(t, 48, a, thread=i), free(t + 1, a, thread=i)]
            t += 2
    write_trace(path / "2-1.hct", recs)


def test_a_program_freeing_40_mib_blocks_gets_a_threshold_above_them_and_a_trim(config, tmp_path):
    # GIVEN a program that allocates and frees a 40 MiB block ten times
    _big_blocks(tmp_path)
    # WHEN its facts are read and candidates derived
    facts = heap_facts(tmp_path, check_imports=False)
    assert [(c.size, c.count) for c in facts.large_churn] == [(40 * MIB, 10)]
    assert facts.large_live_peak_bytes == 40 * MIB and facts.allocating_threads == 1
    advice = advise(facts, config, FIXED, cpus=2, objective="time")
    # THEN glibc-derived sets the mmap threshold above 40 MiB and a trim threshold keeping the top
    (derived, layer) = advice.derived
    assert derived.name == DERIVED and layer.name == LAYER_LARGE
    knobs = dict(
        kv.removeprefix("glibc.malloc.").split("=")
        for kv in derived.env["GLIBC_TUNABLES"].split(":")
    )
    assert int(knobs["mmap_threshold"]) > 40 * MIB
    assert int(knobs["trim_threshold"]) > 40 * MIB
    assert "arena_max" not in knobs and "tcache_count" not in knobs
    assert "40.0 MiB" in advice.run[DERIVED]
    # the fixed glibc settings are not run: the derived one sets the same knobs at these values
    assert "glibc-fixed" in advice.ruled_out and "glibc-fixed" not in advice.run
    assert {"jemalloc", "tcmalloc", "mimalloc"} <= set(advice.run)
    assert any("40.0 MiB x10" in line for line in facts.lines())


def test_eight_allocating_threads_on_two_cores_get_two_arenas(config, tmp_path):
    _threads(tmp_path, n=8)
    facts = heap_facts(tmp_path, check_imports=False)
    assert facts.allocating_threads == 8 and not facts.large_churn
    advice = advise(facts, config, FIXED, cpus=2, objective="time")
    (derived,) = advice.derived
    assert derived.env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert "8 threads allocate on 2 cores" in advice.run[DERIVED]
    # as many cores as threads: no arena knob, and nothing for the fixed settings to change
    advice = advise(facts, config, FIXED, cpus=8, objective="time")
    assert advice.derived == () and "glibc-fixed" in advice.run


def test_small_sizes_reused_in_deep_bursts_get_a_deeper_tcache(config, tmp_path):
    # 100 blocks of 64 B freed, then requested again, five times over
    recs = [thread_start(0, tid=1)]
    t = 10
    for _ in range(5):
        addrs = [0x20000 + i * 80 for i in range(100)]
        for a in addrs:
            recs.append(malloc(t, 64, a))
            t += 1
        for a in addrs:
            recs.append(free(t, a))
            t += 1
    write_trace(tmp_path / "3-1.hct", recs)
    facts = heap_facts(tmp_path, check_imports=False)
    assert facts.small_churn_depth >= 90
    advice = advise(facts, config, FIXED, cpus=2, objective="time")
    assert advice.derived[0].env["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=128"
    # for memory, no deeper cache (it holds more)
    assert advise(facts, config, FIXED, cpus=2, objective="memory").derived == ()


def test_churn_depth_counts_reuses_not_a_teardown():
    # thread 0: 10 frees in a row, never reused (a teardown); then 3 frees and 3 reuses
    op = np.array([Op.FREE] * 10 + [Op.FREE] * 3 + [Op.MALLOC] * 3, dtype=np.uint8)
    size = np.full(16, 64)
    thread = np.zeros(16, dtype=np.uint16)
    # the teardown's frees are waiting too: reuses see 13, 12, 11 blocks
    assert small_churn_depths(thread, op, size).tolist() == [13, 12, 11]
    # a teardown alone: no reuse, no depth
    assert small_churn_depths(thread[:10], op[:10], size[:10]).size == 0
    # two size classes and two threads apart
    op = np.array([Op.FREE, Op.FREE, Op.MALLOC, Op.MALLOC, Op.MALLOC], dtype=np.uint8)
    size = np.array([64, 64, 64, 64, 500])
    assert small_churn_depths(np.array([0, 1, 0, 1, 0]), op, size).tolist() == [1, 1]


def test_a_program_with_little_heap_work_rules_every_candidate_out(config, tmp_path):
    # 20 small calls over 10 s: at 1 µs each, far under 1% of the time
    recs = [thread_start(0, tid=1)]
    for i in range(10):
        recs += [
            malloc(i * 1_000_000_000, 32, 0x1000 + i * 64),
            free(i * 1_000_000_000 + 5, 0x1000 + i * 64),
        ]
    write_trace(tmp_path / "4-1.hct", recs)
    facts = heap_facts(tmp_path, check_imports=False)
    assert heap_share_bound(facts) < 0.01
    advice = advise(facts, config, FIXED, cpus=2, objective="time")
    assert list(advice.run) == ["glibc"] and advice.derived == ()
    assert set(advice.ruled_out) == set(FIXED) - {"glibc"}
    assert all("cannot matter" in why for n, why in advice.ruled_out.items() if n != "glibc-fixed")


def test_a_knob_the_program_sets_itself_is_left_alone(config, tmp_path):
    _big_blocks(tmp_path)
    probe = "start\tpid=7\nmallopt\tpid=7\tmallopt.mmap_threshold=131072\n"
    calls = mallopt_lines(probe)
    assert calls == ("M_MMAP_THRESHOLD=131072 (pid 7)",)
    facts = heap_facts(tmp_path, check_imports=False, mallopt_calls=calls)
    advice = advise(facts, config, FIXED, cpus=2, objective="time")
    tunables = advice.derived[0].env["GLIBC_TUNABLES"]
    assert "mmap_threshold" not in tunables and "trim_threshold" in tunables
    assert "the program sets it with mallopt" in advice.run[DERIVED]
    assert any("calls mallopt itself" in line for line in facts.lines())


def test_an_empty_trace_folder_is_an_error_naming_it(tmp_path):
    from tasks.allocators.trace_facts import TraceFactsError

    with pytest.raises(TraceFactsError, match=str(tmp_path)):
        heap_facts(tmp_path, check_imports=False)
