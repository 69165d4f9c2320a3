"""Speed of the online counter (tasks/learning/counters/online.py): compiled vs a plain-Python dict loop.

    .venv/bin/python benchmarks/bench_online.py                  # 8 M tokens, 200 k for the loop
    .venv/bin/python benchmarks/bench_online.py --tokens 2000000 --reference-tokens 50000

On a patterned, seeded token stream (routines chosen by a Markov chain, --noise), timed in one
process on one core: OnlineCounter.predict over the whole run (the numba compile timed apart),
OnlineState.push + answer() per event, and the dict reference the tests hold the counter equal to,
its answers checked equal. Reported: positions per second of each and the ratio, top-1/top-5
accuracy, peak RSS. The details: docs/speeds-pipeline.md#the-online-counter-benchmark. Writes
benchmarks/results/online.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))
# a fresh cache: the first call compiles (set before numba is imported)
os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-online-numba-")

import numba  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402
from tasks.dataset.token_runs import TokenRun, eval_positions  # noqa: E402
from tasks.learning.counters.online import (  # noqa: E402
    DEFAULT_ORDERS,
    OnlineCounter,
    online_features,
)


def patterned_run(n_tokens: int, noise: float, seed: int) -> TokenRun:
    rng = np.random.default_rng(seed)
    n_routines = 48
    routines = [
        rng.integers(0, 64, rng.integers(4, 41)).astype(np.uint8) for _ in range(n_routines)
    ]
    succ = rng.integers(0, n_routines, (n_routines, 3))
    mean_len = np.mean([len(r) for r in routines])
    n_calls = int(n_tokens / mean_len * 1.2) + 10
    picks = np.empty(n_calls, np.int64)  # the chain over routines (vectorised by blocks)
    jump = rng.random(n_calls) < 0.1
    which = rng.integers(0, 3, n_calls)
    anyr = rng.integers(0, n_routines, n_calls)
    r = 0
    for i in range(n_calls):  # ~n_tokens / 22 steps: data generation only, not timed
        r = anyr[i] if jump[i] else succ[r, which[i]]
        picks[i] = r
    tokens = np.concatenate([routines[i] for i in picks])[:n_tokens]
    flip = rng.random(n_tokens) < noise
    tokens[flip] = rng.integers(0, 64, int(flip.sum()))
    # threads: 4 long ones (70% of the calls) and short ones of 10..5000 calls
    long_part = int(n_tokens * 0.7)
    cuts = list(np.sort(rng.choice(np.arange(1, long_part), 3, replace=False)))
    pos = long_part
    while pos < n_tokens:
        cuts.append(pos)
        pos += int(rng.integers(10, 5000))
    offsets = np.array([0] + cuts + [n_tokens], np.int64)
    return TokenRun("bench", "patterned", tokens.astype(np.uint8), offsets)


def best_of(repeat: int, fn) -> tuple[float, float, object]:
    """(best wall seconds, best CPU seconds of this process, the last result)."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8_000_000)
    ap.add_argument("--reference-tokens", type=int, default=200_000)
    ap.add_argument("--stream-tokens", type=int, default=50_000)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=PROJECT / "benchmarks/results/online.json")
    return ap.parse_args()


def compile_seconds(counter: OnlineCounter, run: TokenRun) -> dict[str, float]:
    """What the first call of each compiled path costs, on a tiny run (a fresh cache directory:
    this is the real compile); features reuse predict's compiled loop (the same signature)."""
    tiny = TokenRun("bench", "tiny", run.tokens[:50].copy(), np.array([0, 30, 50]))
    t0 = time.perf_counter()
    counter.predict(tiny, eval_positions(tiny))
    compile_predict = time.perf_counter() - t0
    t0 = time.perf_counter()
    online_features(tiny.tokens, tiny.offsets)
    compile_features = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = counter.state()
    s.push(1)
    s.answer()
    compile_stream = time.perf_counter() - t0
    return {
        "predict": round(compile_predict, 2),
        "features": round(compile_features, 2),
        "streaming": round(compile_stream, 2),
    }


def streaming_seconds(counter: OnlineCounter, run: TokenRun, n_tokens: int) -> tuple[int, float]:
    """The longest thread's first calls, push + answer per event: (events, seconds)."""
    longest = int(np.argmax(run.thread_lengths()))
    n_stream = min(n_tokens, int(run.thread_lengths()[longest]))
    start = int(run.offsets[longest])
    stream_tokens = [int(t) for t in run.tokens[start : start + n_stream]]
    state = counter.state()
    t0 = time.perf_counter()
    for tok in stream_tokens:
        state.push(tok)
        state.answer()
    return n_stream, time.perf_counter() - t0


def against_reference(counter: OnlineCounter, head: TokenRun) -> tuple[float, float, bool]:
    """The dict reference on `head`: (wall s, CPU s, whether the compiled counter's answers
    equal its own)."""
    from tests.tasks.learning.counters.test_online import reference

    t0, c0 = time.perf_counter(), time.process_time()
    ref = reference(head.tokens, head.offsets, DEFAULT_ORDERS, counter.smoothing, counter.fallback)
    t_ref, c_ref = time.perf_counter() - t0, time.process_time() - c0
    mine = counter.predict(head, np.arange(head.n_tokens))
    equal = bool(
        np.array_equal(mine.top, ref["top"].astype(np.uint8))
        and np.allclose(mine.p_true, ref["p"], rtol=1e-12, atol=0)
    )
    return t_ref, c_ref, equal


def main() -> None:
    args = parse_args()
    run = patterned_run(args.tokens, args.noise, args.seed)
    pos = eval_positions(run)
    counter = OnlineCounter.fit([run])  # the fallback ranking only
    compile_s = compile_seconds(counter, run)

    t_pred, c_pred, pred = best_of(args.repeat, lambda: counter.predict(run, pos))
    t_feat, c_feat, _ = best_of(args.repeat, lambda: online_features(run.tokens, run.offsets))
    y = run.tokens[pos]
    top1 = float((pred.top1 == y).mean())
    top5 = float((pred.top == y[:, None]).any(axis=1).mean())
    log_loss = float(-np.log(pred.p_true).mean())

    n_stream, t_stream = streaming_seconds(counter, run, args.stream_tokens)
    # the dict reference on a slice (whole threads of the run, cut at --reference-tokens)
    head = run.head(args.reference_tokens)
    t_ref, c_ref, equal = against_reference(counter, head)

    compiled_rate = len(pos) / t_pred
    ref_rate = head.n_tokens / t_ref
    compiled_cpu_rate = len(pos) / c_pred
    ref_cpu_rate = head.n_tokens / c_ref
    result = {
        "versions": {"numba": numba.__version__, "numpy": np.__version__},
        "data": {
            "tokens": run.n_tokens,
            "threads": run.n_threads,
            "longest_thread": int(run.thread_lengths().max()),
            "scored_positions": len(pos),
            "noise": args.noise,
            "seed": args.seed,
        },
        "orders": list(counter.orders),
        "compile_s": compile_s,
        "compiled": {
            "predict_s": round(t_pred, 3),
            "predict_positions_per_s": round(compiled_rate),
            "predict_positions_per_cpu_s": round(compiled_cpu_rate),
            "features_s": round(t_feat, 3),
            "features_positions_per_s": round(run.n_tokens / t_feat),
            "features_positions_per_cpu_s": round(run.n_tokens / c_feat),
        },
        "streaming": {
            "events": n_stream,
            "seconds": round(t_stream, 3),
            "events_per_s": round(n_stream / t_stream),
        },
        "reference": {
            "positions": head.n_tokens,
            "seconds": round(t_ref, 2),
            "positions_per_s": round(ref_rate),
            "positions_per_cpu_s": round(ref_cpu_rate),
            "equal_to_compiled": equal,
        },
        "speedup_compiled_over_reference": round(compiled_rate / ref_rate, 1),
        "speedup_compiled_over_reference_cpu": round(compiled_cpu_rate / ref_cpu_rate, 1),
        "accuracy": {
            "top1": round(top1, 4),
            "top5": round(top5, 4),
            "log_loss": round(log_loss, 4),
        },
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(result, indent=2))
    write_result(
        "online",
        result,
        reference="the same counter as a plain-Python dict loop (tests/tasks/learning/counters/test_online.py)",
        out=args.out,
    )
    if not equal:
        raise SystemExit("the compiled counter differs from the reference")


if __name__ == "__main__":
    main()
