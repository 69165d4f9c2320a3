"""What a trace cannot tell the simulator, measured: the policy core's replay of a multi-threaded
run against the real layer's counters from the SAME run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_whatif_threads.py

Each case runs a test program (tests/native/programs) once with the tracer and the layer both
preloaded, so the trace and the layer's stats line come from one run; the trace is checked to
hold the program's calls, then replayed by the policy core (tasks.whatif.policy_core.replay)
under the same LayerPolicy. On one thread the counters are equal; with several, what the replay
cannot know (policy_core.UNTOLD_BY_A_TRACE) shows as the difference. The details:
docs/speeds-layer.md#the-threads-benchmark. Writes benchmarks/results/whatif_threads.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks.harness import compile_c, write_result  # noqa: E402
from tasks.dataset.convert import convert_trace  # noqa: E402
from tasks.format.trace_reader import read_trace  # noqa: E402
from tasks.whatif.events import _DEFINES, prepare  # noqa: E402
from tasks.whatif.layer import build_layer, parse_stats  # noqa: E402
from tasks.whatif.policies import MMAP_THRESHOLD  # noqa: E402
from tasks.whatif.policy_core import UNTOLD_BY_A_TRACE, LayerPolicy, replay  # noqa: E402

NATIVE = PROJECT / "native"
REFERENCE = "the real layer's counters from the same multi-threaded run"
PROGRAMS = PROJECT / "tests" / "native" / "programs"
COMPARED = (
    "hits",
    "misses",
    "kept",
    "given_back",
    "bytes_kept_peak",
    "bytes_kept_at_exit",
    "passed",
)
CASES = [
    ("bigblocks 4 threads", ["bigblocks", "40", "4", "300000", "1000000", "2500000"]),
    ("fronts relay 4 threads", ["fronts", "relay", "300000", "4", "200"]),
]
POLICIES = [
    LayerPolicy(),
    LayerPolicy(policy="pools"),
    LayerPolicy(policy="guided", regret=True),
]


def _build(name: str, out: Path) -> Path:
    flags = ("-O1", "-g", "-fno-builtin", "-Wall", "-pthread", f"-I{NATIVE}")
    return compile_c(PROGRAMS / f"{name}.c", out / name, *flags)


def _run(argv: list[str], preload: list[Path], out: Path, layer_env: str | None) -> pa.Table:
    out.mkdir()
    env = dict(os.environ, LD_PRELOAD=":".join(map(str, preload)), HEAPCAST_OUT=str(out))
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    env.pop("HEAPCAST_LAYER", None)
    if layer_env:
        env["HEAPCAST_LAYER"] = layer_env
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return pa.concat_tables([convert_trace(read_trace(p))[0] for p in sorted(out.glob("*.hct"))])


def _large_requests(table: pa.Table) -> int:
    size = table.column("size").to_numpy()
    addr = table.column("addr").to_numpy()
    defines = _DEFINES[table.column("op").to_numpy()]
    return int(((size >= MMAP_THRESHOLD) & (addr != 0) & defines).sum())


def main() -> None:
    layer = build_layer()
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    tracer = NATIVE / "build" / "libheapcast.so"
    rows = []
    with tempfile.TemporaryDirectory(prefix="heapcast-threads-") as tmp:
        tmp = Path(tmp)
        for k, (case, argv) in enumerate(CASES):
            exe = _build(argv[0], tmp)
            full = [str(exe), *argv[1:]]
            alone = _run(full, [tracer], tmp / f"alone{k}", None)
            for j, policy in enumerate(POLICIES):
                stats_path = tmp / f"stats{k}_{j}"
                table = _run(
                    full, [tracer, layer], tmp / f"both{k}_{j}", policy.env(str(stats_path))
                )
                (measured,) = parse_stats(stats_path.read_text())
                large = _large_requests(table)
                got = replay(prepare(table), policy)
                core = dict(got.stats, passed=got.passed)
                row = {
                    "case": case,
                    "argv": argv,
                    "policy": policy.env(),
                    "threads": int(len(np.unique(table.column("thread").to_numpy()))),
                    "events": table.num_rows,
                    "large_requests_traced": large,
                    "large_requests_tracer_alone": _large_requests(alone),
                    "layer_asked": measured["hits"] + measured["misses"],
                    "layer": {c: measured.get(c) for c in COMPARED},
                    "core": {c: core.get(c) for c in COMPARED},
                    # the core's threads never exit (a trace has no thread exit): their fronts
                    "core_bytes_in_fronts_at_exit": core["bytes_in_fronts"],
                }
                rows.append(row)
                print(
                    f"{case:24s} {policy.policy:8s} threads={row['threads']} "
                    f"large={large}/{row['large_requests_tracer_alone']}/{row['layer_asked']}  "
                    + "  ".join(f"{c}={measured.get(c)}/{core.get(c)}" for c in COMPARED)
                    + f"  (core fronts at exit {core['bytes_in_fronts']})",
                    flush=True,
                )
    note = f"layer/core per counter; what the replay cannot know: {UNTOLD_BY_A_TRACE}"
    write_result("whatif_threads", {"note": note, "rows": rows}, reference=REFERENCE)


if __name__ == "__main__":
    main()
