"""stack_profile: per distinct stack of a run, its calls, bytes, peak, leaks and temporaries."""

from __future__ import annotations

import numpy as np

from tasks.format.trace_reader import read_trace
from tasks.report.analysis import analyze
from tasks.report.sources import resolve
from tasks.stacks.collect import stack_profile
from tests.tasks.report import scenario
from tests.tasks.stacks import known_stacks as known
from tests.tracegen import free, malloc, records_array, thread_start, write_trace


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


def _reference(recs):
    """calls, bytes, peak, leaked, temporaries per caller by a plain loop over the calls in
    time order (malloc and free only), for comparison."""
    order = np.argsort(recs["time"], kind="stable")
    op = (recs["packed"] >> np.uint64(40)) & np.uint64(0xFF)
    thread = recs["packed"] >> np.uint64(48)
    size = recs["packed"] & np.uint64((1 << 40) - 1)
    live, out, blocks, live_bytes, best = {}, {}, [], 0, (-1, None)
    last_block = {}  # thread -> its latest block while no later allocation
    for i in order.tolist():
        o, a, t = int(op[i]), int(recs["addr"][i]), int(thread[i])
        if o == 1:
            rec = {"caller": int(recs["caller"][i]), "size": int(size[i]), "temp": False}
            blocks.append(rec)
            live[a] = rec
            last_block[t] = rec
            live_bytes += rec["size"]
        elif o == 5 and a in live:
            rec = live.pop(a)
            rec["temp"] = any(b is rec for b in last_block.values())
            live_bytes -= rec["size"]
        else:
            continue
        if live_bytes > best[0]:
            best = (live_bytes, {id(r) for r in live.values()})
    for rec in blocks:
        c = out.setdefault(
            rec["caller"], dict.fromkeys(("calls", "bytes", "peak", "leaked", "temporaries"), 0)
        )
        c["calls"] += 1
        c["bytes"] += rec["size"]
        c["peak"] += rec["size"] if id(rec) in best[1] else 0
        c["leaked"] += rec["size"] if any(r is rec for r in live.values()) else 0
        c["temporaries"] += rec["temp"]
    return out


def _random_thread(thread: int, n: int, seed: int) -> list:
    """n calls of one thread at times 2k + thread: mallocs (of random callers and sizes) and
    frees of random live blocks, some blocks never freed."""
    rng = np.random.default_rng(seed)
    recs, live = [thread_start(thread, tid=100 + thread, thread=thread)], []
    for k in range(n):
        t = 2 * k + 2 + thread
        if live and rng.random() < 0.45:
            recs.append(free(t, live.pop(int(rng.integers(len(live)))), thread=thread))
        else:
            addr = 0x10000 * (thread + 1) + 16 * k
            size, caller = int(rng.integers(1, 5000)), int(rng.choice([0x10, 0x20, 0x30]))
            recs.append(malloc(t, size, addr, thread=thread, caller=caller))
            live.append(addr)
    return recs


def test_threads_written_out_of_time_order_match_a_plain_loop(tmp_path):
    # GIVEN two threads' calls written one thread after the other (file order is not time
    # order), callers as one-frame stacks
    recs = records_array(_random_thread(0, 3000, 1) + _random_thread(1, 3000, 2), caller=True)
    path = write_trace(tmp_path / "1-1.hct", recs, caller=True, pid=1)
    # WHEN profiled
    profile = stack_profile([read_trace(path)])
    # THEN each caller's numbers are those of a plain loop over the calls in time order
    got = {
        int(profile.frames.offset[s[0]]): {
            c: int(getattr(profile, c)[k]) for c in known.EXPECTED[known.A]
        }
        for k, s in enumerate(profile.stacks)
    }
    want = _reference(recs)
    assert got == want
    assert all(
        0 < w["temporaries"] < w["calls"] and w["leaked"] and w["peak"] for w in want.values()
    )
