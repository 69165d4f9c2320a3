"""The simulator's largest replays heapcast's layer (native/layers/layer.c, policy=largest):
the same hits as the layer's own counters on a real program.

GIVEN bigblocks (tests/native/programs/bigblocks.c: malloc, calloc, posix_memalign, realloc
      and frees of large blocks in varying orders, small blocks between), traced with the
      tracer, and the same command run under the layer (HEAPCAST_LAYER=policy=largest,n=N,
      min=131072,madv=off,peak=4,proof=2,stats=PATH) by tasks.whatif.layer.measure_layer
WHEN  the trace is simulated with the same LargestConfig (n, and the proof: 0, 2 or 4)
THEN  the simulated hits equal the layer's `hits` and the simulated requests >= min the
      layer's hits + misses; output and exit code are unchanged under the layer.
One thread: with several, the interleaving of the threads' calls differs from run to run (two
threads of bigblocks: 62 simulated against 57 measured), so equality is a single-thread fact.
(The fault comparison is a benchmark: studies/whatif_layer/whatif_layer.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.convert import convert_trace
from tasks.format.trace_reader import read_trace
from tasks.whatif.events import prepare
from tasks.whatif.layer import STAT_KEYS, build_layer, layer_env, measure_layer
from tasks.whatif.policies import MMAP_THRESHOLD, LargestConfig
from tasks.whatif.simulate import simulate

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[3]
NATIVE = PROJECT / "native"


@pytest.fixture(scope="module")
def tools(program) -> tuple[Path, Path, Path]:
    """(the layer, the tracer, bigblocks)."""
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.fail("the layer tests need gcc and make (apt-get install build-essential)")
    layer = build_layer()
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    return layer, NATIVE / "build" / "libheapcast.so", program("bigblocks")


def _traced(argv: list[str], tracer: Path, out: Path) -> pa.Table:
    out.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(tracer), HEAPCAST_OUT=str(out))
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    env.pop("HEAPCAST_LAYER", None)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return pa.concat_tables([convert_trace(read_trace(p))[0] for p in sorted(out.glob("*.hct"))])


def test_layer_env_names_the_largest_policy():
    assert layer_env() == "policy=largest,n=4,min=131072,madv=off,peak=4,proof=2"
    policy = LargestConfig(n=2, min_size=65536, peak=None, proof=0)
    assert layer_env(policy, True, "/x/s", keep=False) == (
        "policy=largest,n=0,min=65536,madv=0,peak=off,proof=0,stats=/x/s"
    )


@pytest.mark.parametrize(
    ("n", "threads", "sizes", "proof"),
    [
        (4, 1, ["300000", "1000000", "2500000"], 4),
        (4, 1, ["300000", "1000000", "2500000"], 0),
        (1, 1, ["200000", "700000"], 4),
        (2, 1, ["150000", "300000", "1000000", "2500000"], 2),
    ],
)
def test_simulated_hits_equal_the_layers_counters(tools, tmp_path, n, threads, sizes, proof):
    layer, tracer, exe = tools
    argv = [str(exe), "25", str(threads), *sizes]
    policy = LargestConfig(n=n, proof=proof)
    measured = measure_layer(argv, policy=policy, layer=layer)
    assert measured["same_output"], measured["with"]["stderr_tail"]
    assert len(measured["with"]["stats"]) == 1 and set(STAT_KEYS) <= measured.keys()
    table = _traced(argv, tracer, tmp_path / "trace")
    sim = simulate(prepare(table), policy)
    req = table.column("size").to_numpy()
    assert measured["hits"] > 0
    assert sim["hits"] == measured["hits"], (sim["hits"], measured)
    # every request >= min asks the layer: a hit or a miss
    defined = np.asarray(table.column("addr").to_numpy() != 0)
    large = int(((req >= MMAP_THRESHOLD) & defined).sum())
    assert measured["hits"] + measured["misses"] == large, (large, measured)


@pytest.mark.parametrize("peak", [4, None])
def test_simulated_hits_equal_the_layers_counters_under_its_bound(tools, program, tmp_path, peak):
    """GIVEN phases (tests/native/programs/phases.c: 8 blocks of 2 MiB live, then 8 of 5 MiB,
    in turns), where the layer's bound gives kept blocks back at misses (hl_bound), traced, and
    run under the layer with the bound (peak=4) and without (peak=off), keeping from the first
    free (proof=0: no request of phases could reuse a block of the other phase, so its proof
    never comes)
    THEN the simulator with the same LargestConfig has the same hits and blocks kept."""
    layer, tracer, _ = tools
    argv = [str(program("phases")), "4", "8", str(2 << 20), "8", str(5 << 20)]
    policy = LargestConfig(peak=peak, proof=0)
    measured = measure_layer(argv, policy=policy, layer=layer)
    assert measured["same_output"], measured["with"]["stderr_tail"]
    (stats,) = measured["with"]["stats"]
    assert (stats["bounded"] > 0) == (peak is not None), stats
    sim = simulate(prepare(_traced(argv, tracer, tmp_path / "trace")), policy)
    assert (sim["hits"], sim["cached_frees"]) == (stats["hits"], stats["kept"]), (sim, stats)


def test_simulated_cache_gives_back_what_the_program_outgrew(tools, program, tmp_path):
    """GIVEN grow (tests/native/programs/grow.c: a buffer grown by malloc, copy and free, round
    after round), traced, and run under the layer, whose outgrown rule gives back each block
    freed just after its thread asked for a larger one
    THEN the simulator replays the rule: the same hits and the same blocks kept."""
    layer, tracer, _ = tools
    argv = [str(program("grow")), "6", "10", "300000"]
    measured = measure_layer(argv, layer=layer)
    assert measured["same_output"], measured["with"]["stderr_tail"]
    (stats,) = measured["with"]["stats"]
    assert stats["outgrown"] >= 10, stats  # the rule fired: every step of the first round
    sim = simulate(prepare(_traced(argv, tracer, tmp_path / "trace")), LargestConfig(n=4))
    assert (sim["hits"], sim["cached_frees"]) == (stats["hits"], stats["kept"]), (sim, stats)
