"""The policy core's replay speed, alone and as the what-if simulator's row, on the same events.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_policy_core.py              # 4 M events
    PYTHONPATH=. .venv/bin/python benchmarks/bench_policy_core.py --events 20000000 --reps 5

Events: one process, one thread, built with numpy (block j asked for at row 2j, freed after a
lag of 1..8 blocks, so the cache both hits and misses). Timed, best of --reps after a warm-up
call, per CPU second: tasks.whatif.policy_core.replay end to end and the C call alone, and
tasks.whatif.simulate.layer_metrics. The events and arms in full:
docs/speeds-layer.md#the-policy-core-benchmark. Target (issue 44): the core >= 10 M events/s per
core. Writes benchmarks/results/policy_core.json.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402

from benchmarks.harness import write_result  # noqa: E402
from tasks.whatif import policy_core  # noqa: E402
from tasks.whatif.events import SimInput  # noqa: E402
from tasks.whatif.policies import LargestConfig, LayerGuidedConfig, PoolsConfig  # noqa: E402
from tasks.whatif.simulate import layer_metrics  # noqa: E402

REFERENCE = "the core's C call alone, and simulate()'s layer_metrics, on the same events"
SIZES = np.array([150_000, 300_000, 310_000, 1_000_000, 2_500_000], np.int64)


def synthetic(n_events: int, seed: int = 0, window: int = 8) -> SimInput:
    """Block j asked for at row 2j, and at row 2j + 1 a block of the window of `window` blocks
    before freed, the window's blocks in a shuffled order
    (docs/speeds-layer.md#the-policy-core-benchmark)."""
    rng = np.random.default_rng(seed)
    n_blocks = n_events // 2 // window * window
    n = 2 * n_blocks
    size = SIZES[rng.integers(0, len(SIZES), n_blocks)] + rng.integers(0, 4, n_blocks) * 1000
    req = np.full(n, -1, np.int64)
    req[0::2] = size
    n_windows = n_blocks // window
    perm = rng.permuted(np.tile(np.arange(window), (n_windows, 1)), axis=1).reshape(-1)
    j = np.arange(window, n_blocks)  # the blocks whose row frees one: the window before's
    freed_block = window * (j // window - 1) + perm[j - window]
    partner = np.full(n, -1, np.int64)
    freed = np.full(n, -1, np.int64)
    partner[2 * j + 1] = 2 * freed_block
    freed[2 * j + 1] = size[freed_block]
    align = np.zeros(n, np.int64)
    align[0::2] = np.where(rng.random(n_blocks) < 0.125, 4096, 0)
    addr = np.where(align > 0, align, 16)
    return SimInput.one_thread(
        req, freed, partner, np.arange(n, dtype=np.int64) * 1000, align, addr
    )


def best(f, reps: int) -> tuple[float, object]:
    out = f()  # warm-up: compiles (numba), builds and loads (the core)
    t = []
    for _ in range(reps):
        t0 = time.process_time()
        out = f()
        t.append(time.process_time() - t0)
    return min(t), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    x = synthetic(args.events)
    n = x.n
    rows = []

    def row(name: str, seconds: float, hits: int) -> None:
        rows.append({"what": name, "cpu_s": seconds, "events_per_s": n / seconds, "hits": hits})
        print(f"{name:34s} {seconds:7.3f} s  {n / seconds / 1e6:6.1f} M events/s  hits={hits}")

    for pol in ("largest", "pools", "guided"):
        p = policy_core.LayerPolicy(policy=pol)
        s, r = best(lambda p=p: policy_core.replay(x, p), args.reps)
        row(f"core {pol} (replay, end to end)", s, r.stats["hits"])
        batch = policy_core.core_batch(x, p)
        s, out = best(lambda batch=batch: policy_core.run_batch(batch), args.reps)
        row(f"core {pol} (the C call alone)", s, out[0]["hits"])
    for name, cfg in (
        ("largest", LargestConfig()),
        ("pools", PoolsConfig()),
        ("guided", LayerGuidedConfig()),
    ):
        s, out = best(lambda cfg=cfg: layer_metrics(x, cfg), args.reps)
        row(f"simulate {name} (layer_metrics)", s, out[1]["hits"])
    result = {
        "events": n,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "rows": rows,
    }
    write_result("policy_core", result, reference=REFERENCE)


if __name__ == "__main__":
    main()
