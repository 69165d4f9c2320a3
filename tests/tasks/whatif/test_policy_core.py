"""The policy core (native/policy/core.c) replays heapcast's layer: on one thread, the same
counters as the real layer's stats line, for every policy it offers.

GIVEN a stream of large calls (malloc, calloc, posix_memalign, realloc, free, built
      with numpy) run for real by tests/native/programs/layerseq.c under the layer
      (LayerPolicy.env(), MALLOC_MMAP_THRESHOLD_=131072), and laid out as events
WHEN  the core replays the events with the same LayerPolicy (tasks.whatif.policy_core.replay)
THEN  every counter of the stats line equals the layer's (hits, misses, kept, bytes kept,
      given back, outgrown, unproven, bounded, live peak, proof, regret); on a traced bigblocks
      run, so do the core's and the simulator's hits and blocks kept; and guided by a format 3
      table, so do hits, blocks kept, passed calls and frees a site entry answered.
One thread: with several, the layer's threads meet at its locks in an order a trace does not
hold (policy_core.UNTOLD_BY_A_TRACE: what the replay cannot know).
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
from tasks.dataset.sites import SITE_VOCABULARY, call_sites
from tasks.dataset.tokens import size_class
from tasks.format.trace_reader import read_trace
from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.table.distill import ClassTable
from tasks.learning.table.layer_file import HEADER, write_layer_table
from tasks.whatif.events import SimInput, prepare
from tasks.whatif.layer import build_layer, parse_stats
from tasks.whatif.policies import (
    MMAP_THRESHOLD,
    LargestConfig,
    LayerGuidedConfig,
    PoolsConfig,
)
from tasks.whatif.policy_core import (
    STATS,
    UNTOLD_BY_A_TRACE,
    LayerPolicy,
    class_scores_of,
    layer_policy,
    replay,
)
from tasks.whatif.simulate import simulate

PROJECT = Path(__file__).resolve().parents[3]
NATIVE = PROJECT / "native"
# the core's counters held equal to the layer's stats line: all but these four
COMPARED = tuple(
    k for k in STATS if k not in ("bytes_given_back", "heap", "declined", "bytes_in_fronts")
)
SIZES = (150_000, 300_000, 310_000, 1_000_000, 2_500_000)


@pytest.fixture(scope="module")
def layer() -> Path:
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.fail("the layer tests need gcc and make (apt-get install build-essential)")
    return build_layer()


def _stream(seed: int, n_steps: int, slots: int = 6) -> list[tuple[str, int, int, int]]:
    """layerseq's steps (op, slot, alignment, size): a slot empty is filled (malloc, calloc,
    posix_memalign at a page), a full one freed or realloc'ed."""
    rng = np.random.default_rng(seed)
    live: set[int] = set()
    steps = []
    for _ in range(n_steps):
        s = int(rng.integers(slots))
        size = int(rng.choice(SIZES)) + int(rng.integers(0, 4)) * 1000
        if s in live and rng.random() < 0.7:
            steps.append(("f", s, 0, 0))
            live.discard(s)
        elif s in live:
            steps.append(("r", s, 0, size))
        else:
            op = "a" if rng.random() < 0.1 else "mc"[int(rng.integers(2))]
            steps.append((op, s, 4096 if op == "a" else 0, size))
            live.add(s)
    return steps


def _events(steps: list[tuple[str, int, int, int]]) -> SimInput:
    """The steps as the simulator's input: one process, one thread, time 0 (nothing decays)."""
    n = len(steps)
    req = np.full(n, -1, np.int64)
    freed = np.full(n, -1, np.int64)
    partner = np.full(n, -1, np.int64)
    align = np.zeros(n, np.int64)
    addr = np.full(n, 16, np.int64)  # glibc's mapped blocks: 16 past a page
    owner: dict[int, int] = {}
    for i, (op, s, al, size) in enumerate(steps):
        if op in "fr":
            partner[i] = owner.pop(s)
            freed[i] = req[partner[i]]
        if op != "f":
            req[i] = size
            owner[s] = i
            if op == "a":
                align[i] = addr[i] = al
    return SimInput.one_thread(
        req, freed, partner, np.zeros(n, np.int64), align, addr, time_basis="calls"
    )


def _argv(steps) -> list[str]:
    return [
        f"f:{s}" if op == "f" else f"a:{s}:{al}:{size}" if op == "a" else f"{op}:{s}:{size}"
        for op, s, al, size in steps
    ]


def _layer_stats(argv: list[str], policy: LayerPolicy, layer: Path, tmp: Path) -> dict[str, int]:
    stats = tmp / "stats"
    env = dict(os.environ, LD_PRELOAD=str(layer), HEAPCAST_LAYER=policy.env(str(stats)))
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    (line,) = parse_stats(stats.read_text())
    return line


POLICIES = [
    LayerPolicy(),
    LayerPolicy(n=2, proof=0),
    LayerPolicy(policy="pools"),
    LayerPolicy(policy="pools", proof=0, peak=None),
    LayerPolicy(policy="pools", madv_ms=None, cap=4 << 20),  # the cap, fronts reserving
    LayerPolicy(policy="guided"),
    LayerPolicy(policy="guided", regret=True),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.env())
@pytest.mark.parametrize("seed", [0, 1])
def test_core_counters_equal_the_layers(layer, program, tmp_path, policy, seed):
    steps = _stream(seed, 400)
    measured = _layer_stats([str(program("layerseq")), *_argv(steps)], policy, layer, tmp_path)
    core = replay(_events(steps), policy)
    assert measured["hits"] > 0
    assert {k: core.stats[k] for k in COMPARED} == {k: measured[k] for k in COMPARED}
    assert core.passed == measured["passed"]


def test_core_decisions_per_row(tmp_path):
    """GIVEN a loop of malloc and free of one size, proof=2, no bound
    THEN the first two frees are passed on unproven, the next two requests miss (each giving
    the proof a step), and from then on every free is kept and every request hits."""
    steps = [("m", 0, 0, 300_000), ("f", 0, 0, 0)] * 6
    core = replay(_events(steps), LayerPolicy(peak=None))
    assert list(core.request[0::2]) == [2, 2, 2, 1, 1, 1]
    assert list(core.fate[1::2]) == [2, 2, 1, 1, 1, 1]
    assert core.stats["proof_hits"] == 2 and core.stats["hits"] == 3


def _traced(argv: list[str], tracer: Path, out: Path, **extra: str) -> pa.Table:
    out.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(tracer), HEAPCAST_OUT=str(out), **extra)
    env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    env.pop("HEAPCAST_LAYER", None)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return pa.concat_tables([convert_trace(read_trace(p))[0] for p in sorted(out.glob("*.hct"))])


@pytest.mark.parametrize(
    "policy",
    [LayerPolicy(), LayerPolicy(policy="pools"), LayerPolicy(policy="guided", regret=True)],
    ids=lambda p: p.policy,
)
def test_core_on_a_traced_program_equals_the_layer(layer, program, tmp_path, policy):
    """GIVEN bigblocks traced (one thread), and run under the layer
    THEN the core over the trace has the layer's hits, blocks kept and passed calls, and the
    simulator's config of the same policy has the same hits and blocks kept."""
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    argv = [str(program("bigblocks")), "25", "1", "300000", "1000000", "2500000"]
    measured = _layer_stats(argv, policy, layer, tmp_path)
    x = prepare(_traced(argv, NATIVE / "build" / "libheapcast.so", tmp_path / "trace"))
    core = replay(x, policy)
    assert measured["hits"] > 0
    got = (core.stats["hits"], core.stats["kept"], core.passed)
    assert got == (measured["hits"], measured["kept"], measured["passed"]), (core.stats, measured)
    config = {
        "largest": LargestConfig(n=policy.n, proof=policy.proof, peak=policy.peak),
        "pools": PoolsConfig(decay_ns=policy.decay_ms * 10**6),
        "guided": LayerGuidedConfig(regret=policy.regret),
    }[policy.policy]
    assert layer_policy(config)[0] == policy.model_copy(update={"madv_ms": 100})
    sim = simulate(x, config)
    assert (sim["hits"], sim["cached_frees"]) == (measured["hits"], measured["kept"])


def _site_table(entries: dict[tuple[int, int], bool]) -> ClassTable:
    """A format 3 table (tests/native/test_layer_table.py's way): every class's training frees
    never reused (the class scores keep nothing), and at each (site, class) given, all reused
    within 1 call (True: the entry keeps) or never (False: it passes on)."""
    majority = np.full(REUSE_CLASSES, 1.0 / REUSE_CLASSES)
    counts = np.zeros((32, REUSE_CLASSES))
    counts[:, REUSE_CLASSES - 1] = 100.0
    sites = np.zeros((SITE_VOCABULARY, 32, REUSE_CLASSES))
    for (s, c), soon in entries.items():
        sites[s, c, 0 if soon else REUSE_CLASSES - 1] = 100.0
    return ClassTable(counts, majority, sites)


def test_core_asks_a_tables_call_sites_as_the_layer(layer, program, tmp_path):
    """GIVEN bigblocks traced with callers (one thread), its large frees' (call site, class)
    keys, and a format 3 table whose entry at the first key keeps, at the second passes on, the
    others left to the thread's counter (the class scores would keep nothing)
    WHEN the layer runs the program with that table, and the core replays the trace with it
    THEN the core has the layer's hits, blocks kept, passed calls, and frees a site entry
    answered (`table_sites`); and that is neither the counter's answer alone nor the class
    scores'."""
    subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
    argv = [str(program("bigblocks")), "25", "1", "300000", "1000000", "2500000"]
    tracer = NATIVE / "build" / "libheapcast.so"
    events = _traced(argv, tracer, tmp_path / "trace", HEAPCAST_CALLER="1")
    site = call_sites(events)
    freed = events.column("freed_size").fill_null(0).to_numpy().astype(np.uint64)
    large = freed >= MMAP_THRESHOLD
    keys = sorted({(int(s), int(c)) for s, c in zip(site[large], size_class(freed[large]))})
    assert len(keys) >= 3 and all(s >= 0 for s, _ in keys), keys
    path = write_layer_table(
        tmp_path / "sites.hcltab", _site_table({keys[0]: True, keys[1]: False}), 7
    )
    policy = LayerPolicy(policy="guided")
    stats = tmp_path / "stats"
    env = dict(os.environ, LD_PRELOAD=str(layer), MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
    env["HEAPCAST_LAYER"] = policy.env(str(stats)) + f",predictor=table:{path},model=7"
    r = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    assert r.stderr == ""
    (measured,) = parse_stats(stats.read_text())
    assert measured["table"] == 1 and measured["table_sites"] > 0
    scores = class_scores_of(path.read_bytes()[HEADER.size :])
    assert scores.sites is not None
    core = replay(events, policy, class_scores=scores)
    got = (core.stats["hits"], core.stats["kept"], core.passed, core.stats["sited"])
    want = (measured["hits"], measured["kept"], measured["passed"], measured["table_sites"])
    assert got == want, (core.stats, measured)
    counter = replay(events, policy).stats
    classes = replay(events, policy, class_scores=np.asarray(scores)).stats  # no sites
    assert (counter["hits"], counter["kept"]) != want[:2]
    assert (classes["hits"], classes["kept"]) != want[:2]


def test_what_a_trace_cannot_tell_is_named_in_one_place():
    """The replay's limits are listed once, in the C replay's opening comment, which the Python
    side points to."""
    text = (PROJECT / UNTOLD_BY_A_TRACE).read_text()
    assert "What a trace cannot tell the replay (named once, here)" in text
