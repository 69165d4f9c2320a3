"""The layer's largest policy (native/layers/layer.c, as tasks/whatif/layer.py runs it) under real
programs: the same output and exit code as without it, and far fewer page faults where large blocks are reused; its measured fault
bytes avoided next to the simulated ones (tasks/whatif)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.whatif.layer import build_layer, measure_layer, run_measured, traced_events
from tasks.whatif.policies import LargestConfig
from tests.native.tracer_harness import NATIVE

BIG = ["300000", "1000000", "2500000"]


@pytest.fixture(scope="session")
def layer() -> Path:
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.fail("the layer tests need gcc and make (apt-get install build-essential)")
    lib = build_layer(NATIVE)
    assert lib.is_file()
    return lib


def _same(m: dict) -> None:
    w, lay = m["without"], m["with"]
    assert m["same_output"], (
        w["stdout_tail"],
        lay["stdout_tail"],
        w["stderr_tail"],
        lay["stderr_tail"],
    )
    assert w["returncode"] == lay["returncode"]


def test_large_blocks_fault_far_less(layer, program):
    exe = program("bigblocks")
    m = measure_layer([exe, "40", "1", *BIG], layer=layer)
    _same(m)
    assert m["without"]["returncode"] == 0
    assert "checksum=" in m["with"]["stdout_tail"]
    assert m["hits"] > 0 and len(m["with"]["stats"]) == 1
    # each round touches ~950 pages of large blocks: without the layer all are fresh mmaps
    assert m["minor_faults_with"] < 0.3 * m["minor_faults_without"], m
    assert m["fault_bytes_avoided"] == m["minor_faults_avoided"] * m["page_size"]


def test_threads_and_madv_free(layer, program):
    exe = program("bigblocks")
    for madv in (False, True):
        m = measure_layer([exe, "15", "4", *BIG, "4000000"], layer=layer, madv_free=madv)
        _same(m)
        assert m["hits"] > 0
        assert m["minor_faults_with"] < m["minor_faults_without"]


def test_default_glibc_threshold_blocks_above_32_mib(layer, program):
    # glibc never raises its mmap threshold above 32 MiB: such blocks fault every time
    exe = program("bigblocks")
    # (20 rounds: the layer keeps none until its proof, the first few rounds' reuses)
    m = measure_layer([exe, "20", "1", str(34 << 20)], layer=layer, static_threshold=False)
    _same(m)
    assert m["minor_faults_with"] < 0.5 * m["minor_faults_without"], m


def test_disabled_and_edge_settings(layer, program):
    exe = program("bigblocks")
    m = measure_layer([exe, "5", "1", *BIG], layer=layer, keep=False)
    _same(m)
    assert m["hits"] == 0
    m = measure_layer([exe, "5", "2", *BIG], layer=layer, policy=LargestConfig(n=64, min_size=1))
    _same(m)
    env = dict(os.environ, LD_PRELOAD=str(layer), HEAPCAST_LAYER="policy=junk")
    r = run_measured([exe, "3", "1", *BIG], env)
    assert r["returncode"] == 0


def test_python_numpy_under_the_layer(layer):
    code = (
        "import numpy as np, json, subprocess, sys\n"
        "a = np.arange(300_000, dtype=np.float64)\n"
        "s = 0.0\n"
        "for i in range(40):\n"
        "    b = (a * i) ** 2 + 3\n"
        "    c = np.concatenate([b, a])\n"
        "    s += float(c[::7].sum()) + float(np.sort(b[:1000])[3])\n"
        "print(json.dumps({'s': s, 'n': len(c)}))\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout, end='')\n"
    )
    m = measure_layer([sys.executable, "-c", code], layer=layer)
    _same(m)
    assert m["without"]["returncode"] == 0 and "child" in m["with"]["stdout_tail"]
    assert m["hits"] > 0
    assert m["minor_faults_with"] < m["minor_faults_without"]


def test_layer_with_tracer_and_simulated_faults(layer, libheapcast, program, tmp_path):
    """Trace the program, simulate largest on its events, compare with the measured faults."""
    from tasks.whatif.policies import LargestConfig
    from tasks.whatif.simulate import simulate

    exe = program("bigblocks")
    argv = [str(exe), "30", "1", *BIG]
    table, env = traced_events(argv, libheapcast, tmp_path / "trace")
    sim = simulate(table, LargestConfig(n=4))
    m = measure_layer(argv, layer=layer, policy=LargestConfig(n=4))
    _same(m)
    # the simulator follows the layer's rules (usable sizes, fit, alignment, eviction): the
    # same hits; every page of the program's blocks is first touched by a write, as the fault
    # model counts them (one fault per page)
    assert sim["hits"] == m["hits"] > 0
    ratio = sim["fault_bytes_avoided"] / m["fault_bytes_avoided"]
    assert 0.9 < ratio < 1.1, (sim["fault_bytes_avoided"], m["fault_bytes_avoided"])
    # read before written (BIGBLOCKS_READ_FIRST=1), a fresh calloc'd page faults twice (the
    # zero page, then copy-on-write): the layer saves more than the model counts
    rf = measure_layer(argv, {"BIGBLOCKS_READ_FIRST": "1"}, layer=layer, policy=LargestConfig(n=4))
    _same(rf)
    assert rf["hits"] == m["hits"]
    assert rf["fault_bytes_avoided"] > 1.1 * m["fault_bytes_avoided"]
    # the layer stacks on the tracer: LD_PRELOAD="layer tracer" still runs and traces
    out2 = tmp_path / "trace2"
    out2.mkdir()
    env2 = dict(env, LD_PRELOAD=f"{layer} {libheapcast}", HEAPCAST_OUT=str(out2))
    r = subprocess.run(argv, env=env2, capture_output=True, text=True)
    assert r.returncode == 0 and "checksum=" in r.stdout
    assert list(out2.glob("*.hct"))


# A hand-made sequence: usable sizes (302000 served by the freed 300000 block: 303088 usable),
# a too-large request (303100), a fit across size classes (400000 from the 600000 block), an
# aligned request that no 16-aligned block serves, one that the freed aligned block serves, a
# realloc, calloc'd blocks, eviction of the smallest.
SEQ = (
    "m:0:300000 f:0 m:0:302000 f:0 m:1:303100 f:1 m:2:600000 f:2 m:3:400000 a:4:64:200000 f:4 "
    "a:5:64:199000 r:5:260000 c:6:1000000 f:6 c:6:900000 f:3 f:5 f:6"
).split()


@pytest.mark.parametrize("n", [1, 2, 4])
def test_simulator_holds_to_the_layer_on_a_hand_made_sequence(layer, libheapcast, program, n,
                                                              tmp_path):  # fmt: skip
    from tasks.whatif.policies import LargestConfig
    from tasks.whatif.simulate import simulate

    argv = [str(program("layerseq")), *SEQ]
    table, _ = traced_events(argv, libheapcast, tmp_path / "trace")
    # kept from the first free (proof=0): the sequence reuses a few blocks, each a rule's case
    policy = LargestConfig(n=n, proof=0)
    sim = simulate(table, policy)
    m = measure_layer(argv, layer=layer, policy=policy)
    _same(m)
    assert sim["hits"] == m["hits"] >= 4
    # the saving measured against the layer loaded but keeping nothing (n = 0), as the
    # simulator models the cache, not the loading of the library (~20 pages of its own)
    off = measure_layer(argv, layer=layer, policy=policy, keep=False)
    measured = (off["minor_faults_with"] - m["minor_faults_with"]) * m["page_size"]
    # ~450 pages saved; a few pages apart (the realloc's partly written page, page tables)
    assert abs(sim["fault_bytes_avoided"] - measured) < 0.05 * measured, (
        sim["fault_bytes_avoided"],
        measured,
    )
