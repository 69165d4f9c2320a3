"""stack_profile: per distinct stack of a run, its calls, bytes, peak, leaks and temporaries."""

from __future__ import annotations

import numpy as np

from tasks.format.trace_reader import read_trace
from tasks.report.analysis import analyze
from tasks.report.sources import resolve
from tasks.stacks.collect import stack_profile
from tests.tasks.report import scenario
from tests.tasks.stacks import known_stacks as known
from tests.tracegen import free, malloc, synthetic_records, thread_start, write_trace


def _by_frames(profile):
    """{frames as (module, offset) tuples, innermost first: {column: value}}."""
    out = {}
    for k, s in enumerate(profile.stacks):
        key = tuple((profile.frames.module[f], int(profile.frames.offset[f])) for f in s)
        out[key] = {c: int(getattr(profile, c)[k]) for c in known.EXPECTED[known.A]}
    return out


def test_known_run_stacks_and_totals(tmp_path):
    # GIVEN two processes of one program, loaded at different addresses, with known stacks
    paths = known.write_run(tmp_path)
    # WHEN profiled
    profile = stack_profile([read_trace(p) for p in paths])
    # THEN the same frames in both processes are one stack, with exactly the known numbers
    want = {tuple((known.PROG, o) for o in s): v for s, v in known.EXPECTED.items()}
    assert _by_frames(profile) == want
    assert int(profile.peak.sum()) == known.PEAK
    # and each distinct (module, offset) is one frame, shared by the stacks holding it
    assert len(profile.frames) == len({o for s in known.EXPECTED for o in s})


def test_peak_and_totals_agree_with_the_report(tmp_path):
    # GIVEN the report's hand-made run (no stacks: callers in one trace, none in the others)
    folder = scenario.write_raw(tmp_path / "raw")
    rep = analyze(resolve(str(folder)))
    # WHEN profiled by stack
    profile = stack_profile([read_trace(p) for p in sorted(folder.glob("*.hct"))])
    # THEN its columns sum to the report's totals: peak, allocations, bytes, leaks
    assert int(profile.peak.sum()) == rep.peak_bytes == 6724
    assert int(profile.calls.sum()) == rep.allocations
    assert int(profile.bytes.sum()) == rep.allocated_bytes
    assert int(profile.leaked.sum()) == rep.leak_bytes


def test_traces_without_stacks_give_the_caller_or_no_frame(tmp_path):
    # GIVEN a caller-only trace (version 2's records) and one without callers
    with_caller = write_trace(
        tmp_path / "1-1.hct",
        [thread_start(0, tid=1), malloc(1, 10, 0x10, caller=0xAB), free(2, 0x10)],
        caller=True,
        pid=1,
    )
    bare = write_trace(tmp_path / "2-2.hct", [thread_start(0, tid=2), malloc(1, 7, 0x10)], pid=2)
    # WHEN profiled
    profile = stack_profile([read_trace(with_caller), read_trace(bare)])
    # THEN the caller is a one-frame stack (its raw address: no module map), the rest no frame
    stacks = {
        tuple(int(profile.frames.offset[f]) for f in s): k for k, s in enumerate(profile.stacks)
    }
    assert set(stacks) == {(0xAB,), ()}
    assert profile.bytes[stacks[(0xAB,)]] == 10 and profile.temporaries[stacks[(0xAB,)]] == 1
    assert profile.leaked[stacks[()]] == 7
    assert profile.frames.label(profile.stacks[stacks[(0xAB,)]][0]) == "0xab"


def test_per_event_work_scales(tmp_path):
    # GIVEN a larger trace (one stack per caller): every column sums to the trace's totals
    recs = synthetic_records(200_000, threads=2, caller=True)
    recs["caller"] = np.where(np.arange(len(recs)) % 3 == 0, 0x10, 0x20)
    path = write_trace(tmp_path / "1-1.hct", recs, caller=True, pid=1)
    rep = analyze(resolve(str(path)))
    profile = stack_profile([read_trace(path)])
    assert len(profile) == 2
    assert int(profile.calls.sum()) == rep.allocations
    assert int(profile.bytes.sum()) == rep.allocated_bytes
    assert int(profile.peak.sum()) == rep.peak_bytes
