"""Cost per prediction of the champion in streaming form (tasks/learning/serving/streaming.py).

    .venv/bin/python benchmarks/bench_streaming.py                       # the quick config's model
    .venv/bin/python benchmarks/bench_streaming.py --root data           # the registered champion
    .venv/bin/python benchmarks/bench_streaming.py --threads 1 8 64 256 --steps 50

The model: with --root, the champion registered under that data root; else an untrained model of
configs/train-quick.yaml's architecture, which costs the same per prediction. Measured side by side
in one process: StreamingPredictor.step, StatefulStream.step and HedgedStream.step (the network
mixed with the online counter and the majority) for B threads at once (goals, issue 23: <= 100 us
a prediction for one thread, <= 10 us over 256), and the same model scoring the same windows in
batch form. The details: docs/speeds-pipeline.md#the-streaming-benchmark. Writes
benchmarks/results/streaming.json (benchmarks/harness.py's shape).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from functools import partial
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402
from tasks.core.config import apply_embedded_defaults  # noqa: E402


def quick_model(stream: np.ndarray):
    from tasks.learning.nextcall.model import NGramTable, build_hybrid
    from tasks.learning.train_config import QUICK_CONFIG, load_train_config

    cfg = load_train_config(QUICK_CONFIG)
    pos = np.arange(len(stream))
    table = NGramTable.fit(stream, pos, cfg.model.ngram_order) if cfg.model.ngram_features else None
    _, full = build_hybrid(cfg, table)
    return full, cfg.context, "untrained quick-config model"


def champion_model(root: str):
    from tasks.core.storage import Root
    from tasks.learning.serving.streaming import StreamingPredictor
    from tasks.registry.tracking import configure, tracking_for

    tracking = tracking_for(Root.from_url(root))
    configure(tracking)
    sp = StreamingPredictor.from_registry(tracking.model_name)
    return sp.model, sp.context, f"champion of {root}"


def _rounds(ss, stream: np.ndarray, starts: np.ndarray, context: int, a) -> tuple[list, list]:
    """--rounds rounds of --steps steps of `ss`, the stream going on: per round, wall and CPU
    microseconds a prediction (the median round is reported: one round of 40 steps over 256
    threads lasts 0.1 s, and a neighbour's burst moves it)."""
    b = len(starts)
    walls, cpus = [], []
    for r in range(max(a.rounds, 1)):
        calls = [
            {t: int(stream[s + context + 1 + r * a.steps + k]) for t, s in enumerate(starts)}
            for k in range(a.steps)
        ]
        gc.collect()
        gc.disable()
        t0, c0 = time.perf_counter(), time.process_time()
        for step in calls:
            ss.step(step)
        walls.append(1e6 * (time.perf_counter() - t0) / (b * a.steps))
        # one core's CPU time: on a shared machine wall time also counts the waits for a core
        cpus.append(1e6 * (time.process_time() - c0) / (b * a.steps))
        gc.enable()
    return walls, cpus


def patterned(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    routines = [rng.integers(0, 64, rng.integers(4, 30)).astype(np.uint8) for _ in range(32)]
    out = np.concatenate([routines[i] for i in rng.integers(0, 32, n // 8)])
    return out[:n]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=None, help="a data root with a registered champion")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the stateful stream's steps")
    ap.add_argument("--out", default=str(PROJECT / "benchmarks/results/streaming.json"))
    return ap.parse_args()


def window_stream_rate(model, context: int, stream: np.ndarray, starts: np.ndarray, a) -> float:
    """The window stream (StreamingPredictor) on the threads' calls: predictions a second."""
    from tasks.learning.serving.streaming import StreamingPredictor

    sp = StreamingPredictor(model, context)
    for t, s in enumerate(starts):
        for tok in stream[s : s + context]:
            sp.observe(t, int(tok))
    sp.step({t: int(stream[s + context]) for t, s in enumerate(starts)})  # warm-up, traced
    t0 = time.perf_counter()
    for k in range(1, a.steps):
        sp.step({t: int(stream[s + context + k]) for t, s in enumerate(starts)})
    streaming_s = time.perf_counter() - t0
    return len(starts) * (a.steps - 1) / streaming_s


def batch_rate(model, context: int, stream: np.ndarray, starts: np.ndarray, a) -> float:
    """The reference: the same windows in batch form, every position scored; positions a
    second."""
    from tasks.dataset.token_runs import TokenRun
    from tasks.learning.nextcall.model import (
        online_feature_matrix,
        online_orders,
        online_ranks,
        takes_online,
    )

    windows = np.stack([stream[s : s + context] for s in starts]).astype(np.int32)
    x: object = windows
    if takes_online(model):
        online = np.stack(
            [
                online_feature_matrix(
                    TokenRun("w", "t", stream[s : s + context], np.array([0, context])),
                    online_orders(model),
                    online_ranks(model),
                )
                for s in starts
            ]
        ).astype(np.int32)
        x = {"tokens": windows, "online": online}
    whole = model.predict_on_batch  # compiled by the backend, as streaming is
    np.asarray(whole(x))  # warm-up, traced
    reps = max(1, a.steps // 4)
    t0 = time.perf_counter()
    for _ in range(reps):
        np.asarray(whole(x))
    batch_s = time.perf_counter() - t0
    return len(starts) * context * reps / batch_s


def stepped_rounds(make, context: int, stream: np.ndarray, starts: np.ndarray, a):
    """A fresh stream from `make`, warmed up on the window's calls, then --rounds rounds of
    steps: (wall us per prediction a round, CPU us a round)."""
    # TensorFlow's pool threads spin for a while after each call, on the same 2 cores: the
    # compiled stream is timed first, once they have gone idle (timed right after the window
    # stream, 8 threads showed 84 us of CPU for 47 us of wall per prediction), its warm-up
    # after the pause, and without a garbage collection of the Keras objects in the middle
    time.sleep(0.5)
    ss = make()
    for k in range(context + 1):  # the same calls as the window stream's warm-up
        ss.step({t: int(stream[s + k]) for t, s in enumerate(starts)})
    return _rounds(ss, stream, starts, context, a)


def threads_row(b: int, model, context: int, stream: np.ndarray, hedged, a) -> dict:
    """The three streams and the batch reference for `b` threads: one row, printed."""
    from tasks.learning.serving.streaming import StatefulStream

    # each thread starts `context` calls into its own stream, so windows are full
    span = context + a.steps * max(a.rounds, 1) + 1
    starts = np.random.default_rng(b).integers(0, len(stream) - span, b)
    walls, cpus = stepped_rounds(lambda: StatefulStream(model, context), context, stream, starts, a)
    stateful_us, stateful_cpu_us = float(np.median(walls)), float(np.median(cpus))
    stateful_per_s = 1e6 / stateful_us
    # the hedged stream on the same calls (the network's stream plus the counter and the mix)
    hedged_walls, hedged_cpus = stepped_rounds(hedged, context, stream, starts, a)
    hedged_us, hedged_cpu_us = float(np.median(hedged_walls)), float(np.median(hedged_cpus))
    per_s = window_stream_rate(model, context, stream, starts, a)
    batch_per_s = batch_rate(model, context, stream, starts, a)
    print(
        f"B={b:4d}: streaming {per_s:10.0f} predictions/s ({1e6 / per_s:8.1f} us each); "
        f"batch scoring {batch_per_s:10.0f} positions/s; a streamed answer costs "
        f"{batch_per_s / per_s:.1f}x a batch-scored position; stateful "
        f"{stateful_us:.2f} us each ({stateful_cpu_us:.2f} us of CPU; median of {len(walls)} "
        f"rounds, {min(walls):.2f}-{max(walls):.2f}); hedged {hedged_us:.2f} us each "
        f"({hedged_cpu_us:.2f} us of CPU; {hedged_us / stateful_us:.2f}x the stateful stream)"
    )
    return {
        "threads": b,
        "streaming_predictions_per_s": round(per_s, 1),
        "streaming_us_per_prediction": round(1e6 / per_s, 1),
        "stateful_us_per_prediction": round(stateful_us, 2),
        "stateful_us_per_prediction_rounds": [round(x, 2) for x in walls],
        "stateful_cpu_us_per_prediction": round(stateful_cpu_us, 2),
        "batch_positions_per_s": round(batch_per_s, 1),
        "streaming_cost_vs_batch": round(batch_per_s / per_s, 1),
        "stateful_cost_vs_batch": round(batch_per_s / stateful_per_s, 2),
        "hedged_us_per_prediction": round(hedged_us, 2),
        "hedged_us_per_prediction_rounds": [round(x, 2) for x in hedged_walls],
        "hedged_cpu_us_per_prediction": round(hedged_cpu_us, 2),
        "hedged_cost_vs_stateful": round(hedged_us / stateful_us, 2),
    }


def main() -> int:
    a = parse_args()
    apply_embedded_defaults()

    from tasks.learning.nextcall.backend import placement
    from tasks.learning.serving.streaming import HedgedStream, StatefulStream

    stream = patterned(200_000, 0)
    model, context, which = champion_model(a.root) if a.root else quick_model(stream)
    # the hedge's cost does not depend on the counts it holds: the stream's own stand in for the
    # training data's (a champion registered before next_hedge.json has none)
    hedged = partial(HedgedStream, model, np.bincount(stream, minlength=64), context=context)
    where = placement()
    device = f"{where.backend} on {where.device}"
    # once per process: the compiled stream's first table growth compiles its numpy block
    # (70 ms), which would otherwise land inside the first timed steps
    ss = StatefulStream(model, context)
    for tok in stream[:2000]:
        ss.step({0: int(tok)})
    rows = [threads_row(b, model, context, stream, hedged, a) for b in a.threads]
    result = {
        "model": which,
        "context": context,
        "device": device,
        "steps": a.steps,
        "stateful_rounds": a.rounds,
        "rows": rows,
    }
    write_result(
        "streaming",
        result,
        reference="the same model scoring the same windows in batch form, all positions at once",
        out=a.out,
        roots=(a.root,) if a.root else (),
    )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
