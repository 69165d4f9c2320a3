"""The context counters of a commit (--old) against the working tree's, side by side in one
process: their answers must be equal exactly (lifetime_answers' and reuse_answers' every
predictor, the training prior, the frames and the contexts of the stacks), and the CPU time of
lifetime_answers (with the context counters), of StackFrames.of_table and of context_priors
(alternating, `--rounds` each; min and median). On synthetic runs (the tests' random events,
`--events` rows, with a stacks table of `--stacks` stacks sharing their inner frames), since
the figures are relative. Usage:

    .venv/bin/python studies/context_speed/context_speed.py --old 0b5056f [--events 1200000]
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tasks.dataset.events_schema import STACKS_SCHEMA  # noqa: E402
from tasks.format.trace_reader import Op  # noqa: E402
from tests.tasks.learning.questions.test_reuse import _with_callers  # noqa: E402
from tests.tasks.learning.test_labels import _events  # noqa: E402

# the modules the speed-up changed, as the old commit's copies import one another
CHANGED = {
    "tasks/learning/counters/by_context.py": "by_context",
    "tasks/learning/questions/context.py": "context",
    "tasks/learning/questions/lifetime.py": "lifetime",
    "tasks/learning/questions/reuse.py": "reuse",
    "tasks/dataset/events_reader.py": "events_reader",
}


def old_modules(commit: str, into: Path) -> dict[str, object]:
    """{name: module}: CHANGED at `commit`, importable beside the working tree's as oldctx.*"""
    pkg = into / "oldctx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for path, name in CHANGED.items():
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        for other_path, other in CHANGED.items():
            dotted = other_path.removesuffix(".py").replace("/", ".")
            if other != "events_reader":  # the unchanged modules import the new one
                text = text.replace(dotted, f"oldctx.{other}")
        (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(into))
    return {name: importlib.import_module(f"oldctx.{name}") for name in CHANGED.values()}


def new_modules() -> dict[str, object]:
    return {
        name: importlib.import_module(path.removesuffix(".py").replace("/", "."))
        for path, name in CHANGED.items()
    }


def synthetic(n: int, n_stacks: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """(events with callers and a stack per allocation, its stacks table): stacks of 1-40
    frames, frame k drawn (skewed) from 30 * (k + 1) of 40,000 frames, so that shallow
    contexts are shared and deep ones mostly not; events' stacks skewed too."""
    rng = np.random.default_rng(seed)
    t = _with_callers(_events(seed, n), seed)
    depth = rng.integers(1, 41, n_stacks)
    stack = np.repeat(np.arange(n_stacks, dtype=np.uint64) * 7919 + 11, depth)
    k = np.arange(len(stack)) - np.repeat(np.cumsum(depth) - depth, depth)
    frame = (rng.pareto(1.2, len(stack)) * 3).astype(np.int64) % (30 * (k + 1))
    frame = (frame * 40_009 + k * 131) % 40_000
    modules = [f"/usr/lib/lib{i}.so" for i in range(40)]
    stacks = pa.table(
        {
            "stack": pa.array(stack, pa.uint64()),
            "depth": pa.array(k.astype(np.uint16)),
            "module": pa.DictionaryArray.from_arrays(
                pa.array((frame % 40).astype(np.int32), mask=frame % 97 == 0), modules
            ),
            "offset": pa.array((frame * 16).astype(np.uint64)),
            "function": pa.DictionaryArray.from_arrays(
                pa.array((frame % 5000).astype(np.int32)), [f"fn{i}" for i in range(5000)]
            ),
        },
        schema=STACKS_SCHEMA,
    )
    ops = t.column("op").to_numpy()
    which = (rng.pareto(1.0, n) * 50).astype(np.int64) % n_stacks
    none = (ops == int(Op.FREE)) | (rng.random(n) < 0.05)  # frees and some calls: no stack
    return t.append_column("stack", pa.array(which * 7919 + 11, pa.uint64(), mask=none)), stacks


def _equal(a, b, what: str) -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), what
        for key in a:
            _equal(a[key], b[key], f"{what}[{key}]")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{what}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape and np.array_equal(a, b), what  # exactly: rtol=atol=0
    else:
        assert a == b, what


def _answers(a) -> dict:
    return {"rows": a.rows, "labels": a.labels, "probs": a.probs, "without": a.without_site}


def run_both(mods: dict, t: pa.Table, stacks: pa.Table, train: tuple) -> dict:
    """Every compared output of one implementation on one run (`train`: another run)."""
    ctx_mod, life, reuse = mods["context"], mods["lifetime"], mods["reuse"]
    frames = mods["events_reader"].StackFrames.of_table(stacks)
    ctx = ctx_mod.run_contexts(frames, t)
    t_ctx = ctx_mod.run_contexts(mods["events_reader"].StackFrames.of_table(train[1]), train[0])
    priors = ctx_mod.context_priors([train[0]], [t_ctx])
    life_maj = life.lifetime_majority([train[0]])
    got_life = life.lifetime_answers(t, life_maj, contexts=ctx, priors=priors)
    got_reuse = reuse.reuse_answers(
        t, reuse.majority_of([train[0]]), contexts=ctx, prior=priors["reuse"]
    )
    return {
        "frames": [frames.frames.function, frames.frames.module, frames.frames.offset],
        "frame_rows": [frames.ids, frames.start, frames.frame_rows],
        "contexts": ctx,
        "priors": {q: [list(p.keys), p.offset, p.counts] for q, p in priors.items()},
        "lifetime": {q: _answers(a) for q, a in got_life.items()},
        "reuse": _answers(got_reuse),
    }


def timed(fns: dict, rounds: int) -> dict:
    """{name: CPU seconds per round}: `fns` called in turn, `rounds` times."""
    got: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            got[name].append(time.process_time() - t0)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the commit to compare against")
    ap.add_argument("--events", type=int, default=1_200_000)
    ap.add_argument("--stacks", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old, new = old_modules(args.old, Path(tmp)), new_modules()
        # exactness: small runs as the tests', then the large one
        for n, seed in ((400, 8), (3000, 9), (50_000, 10), (args.events, 11)):
            t, stacks = synthetic(n, min(args.stacks, max(n // 10, 50)), seed)
            train = synthetic(n, min(args.stacks, max(n // 10, 50)), seed + 100)
            _equal(run_both(old, t, stacks, train), run_both(new, t, stacks, train), f"n={n}")
            print(f"n={n}: old and new answers equal", flush=True)
        ctx = new["context"].run_contexts(new["events_reader"].StackFrames.of_table(stacks), t)
        fns = {}
        for name, m in (("old", old), ("new", new)):
            priors = m["context"].context_priors([train[0]], [ctx])
            maj = m["lifetime"].lifetime_majority([train[0]])
            life = m["lifetime"].lifetime_answers
            fns[f"lifetime_answers {name}"] = partial(life, t, maj, contexts=ctx, priors=priors)
            fns[f"StackFrames.of_table {name}"] = partial(
                m["events_reader"].StackFrames.of_table, stacks
            )
            fns[f"context_priors {name}"] = partial(m["context"].context_priors, [t], [ctx])
        got = timed(fns, args.rounds)
    print(f"{args.events:,} events, {stacks.num_rows:,} stack rows, {args.rounds} rounds each")
    print("| CPU seconds | old min | new min | new/old (min) | old median | new median |")
    print("|---|---|---|---|---|---|")
    for what in ("lifetime_answers", "StackFrames.of_table", "context_priors"):
        o, w = got[f"{what} old"], got[f"{what} new"]
        print(
            f"| {what} | {min(o):.3f} | {min(w):.3f} | {min(w) / min(o):.2f} "
            f"| {np.median(o):.3f} | {np.median(w):.3f} |"
        )


if __name__ == "__main__":
    main()
