"""The streams' step before and after it was compiled whole (tasks/learning/serving/hedged_step.py):
the answers compared and the CPU time a prediction, side by side in one process.

    .venv/bin/python studies/stream_step_ab/stream_ab.py --ref d384faf --threads 1 8 64 256

The old streams: tasks/learning/serving/streaming.py as of --ref, loaded beside the current one
(the compiled functions it calls are still there, unchanged). The model: an untrained model of
configs/train-quick.yaml's architecture (benchmarks/bench_streaming.py's). Per thread count: both
hedged streams (and both stateful ones) fed the same 1,500 steps, every answer compared with
np.array_equal; then --rounds timed rounds, each timing old and new stateful and hedged streams in
turn (fresh streams warmed up on `context` calls), CPU time (time.process_time: the machine is
shared) per prediction; the first round is dropped (warm-up), the medians reported.
Writes studies/stream_step_ab/stream_step_ab.md.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import types
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from benchmarks.bench_streaming import patterned, quick_model  # noqa: E402
from tasks.core.config import apply_embedded_defaults  # noqa: E402


def old_streaming(ref: str) -> types.ModuleType:
    path = "tasks/learning/serving/streaming.py"
    src = subprocess.run(
        ["git", "-C", str(PROJECT), "show", f"{ref}:{path}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    mod = types.ModuleType("old_streaming")
    mod.__file__ = f"{ref}:{path}"
    sys.modules["old_streaming"] = mod  # its dataclasses look their module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def calls_at(stream: np.ndarray, starts: np.ndarray, k: int) -> dict:
    return {t: int(stream[s + k]) for t, s in enumerate(starts)}


def same_answers(make_old, make_new, stream, starts, steps: int, hedged: bool) -> bool:
    old, new = make_old(), make_new()
    for k in range(steps):
        calls = calls_at(stream, starts, k)
        a, b = old.step(calls), new.step(calls)
        if not all(np.array_equal(a[t], b[t]) for t in calls):
            return False
        if hedged and not all(np.array_equal(old.top(t), new.top(t)) for t in calls):
            return False
    return True


def cpu_us(make, stream, starts, context: int, steps: int) -> float:
    s = make()
    for k in range(context + 1):
        s.step(calls_at(stream, starts, k))
    calls = [calls_at(stream, starts, context + 1 + k) for k in range(steps)]
    gc.collect()
    gc.disable()
    c0 = time.process_time()
    for c in calls:
        s.step(c)
    us = 1e6 * (time.process_time() - c0) / (len(starts) * steps)
    gc.enable()
    return us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="d384faf", help="the revision of the old streaming.py")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).with_name("stream_step_ab.md")))
    a = ap.parse_args()
    apply_embedded_defaults()
    from tasks.learning.serving import streaming as new

    old = old_streaming(a.ref)
    stream = patterned(200_000, 0)
    model, context, _ = quick_model(stream)
    counts = np.bincount(stream, minlength=64)
    lines = [
        "# The streams' step, old and new",
        "",
        f"`python studies/stream_step_ab/stream_ab.py --ref {a.ref} --threads "
        f"{' '.join(map(str, a.threads))} --rounds {a.rounds}`; old: streaming.py at {a.ref}. "
        "CPU us a prediction, medians of the rounds (each round: old, new, in turn); answers "
        "compared over 1,500 steps with np.array_equal.",
        "",
        "| threads | stream | old us | new us | old/new | rounds old | rounds new | answers equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in a.threads:
        starts = np.random.default_rng(b).integers(0, len(stream) - 20_000, b)
        steps = max(200, 4000 // b)
        makers = {
            "stateful": {m: (lambda m=m: m.StatefulStream(model, context)) for m in (old, new)},
            "hedged": {
                m: (lambda m=m: m.HedgedStream(model, counts, context=context)) for m in (old, new)
            },
        }
        equal = {
            kind: same_answers(mk[old], mk[new], stream, starts, 1500, kind == "hedged")
            for kind, mk in makers.items()
        }
        times: dict = {}
        for r in range(a.rounds + 1):
            for kind, mk in makers.items():
                for m in (old, new):
                    us = cpu_us(mk[m], stream, starts, context, steps)
                    if r:  # the first round warms up
                        times.setdefault((kind, m), []).append(us)
        for kind in makers:
            o, n = (float(np.median(times[(kind, m)])) for m in (old, new))
            ro, rn = (", ".join(f"{x:.1f}" for x in times[(kind, m)]) for m in (old, new))
            row = (
                f"| {b} | {kind} | {o:.1f} | {n:.1f} | {o / n:.2f} | {ro} | {rn} | {equal[kind]} |"
            )
            print(row, flush=True)
            lines.append(row)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
