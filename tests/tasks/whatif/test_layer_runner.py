"""heapcast's layer as largest (native/layers/layer.c, HEAPCAST_LAYER=policy=largest,n=4,
min=131072,madv=off,proof=0) on a catalog workload through the replay runners
(tasks.whatif.layer.measure_layer_workload, the allocators stage's measured runs): output and
exit code unchanged, page faults reduced. No timing assertions: minor faults are counted.
studies/whatif_layer/whatif_layer.py compares the savings with the simulator's."""

from __future__ import annotations

import shutil

import pytest

from tasks.replay.workloads import load_catalog
from tasks.whatif.layer import ARMS, STAT_KEYS, build_layer, measure_layer_workload
from tasks.whatif.policies import LargestConfig

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

# kept from the first free (proof=0): the test counts the faults that perl's ~10 reuses save;
# under the default proof (2) the first reuses are only counted, not served
EAGER = LargestConfig(proof=0)


@pytest.fixture(scope="module")
def layer():
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.fail("the layer tests need gcc and make (apt-get install build-essential)")
    return build_layer()


@pytest.fixture(scope="module")
def perl_image(engine):
    from tasks.replay.images import build_all

    return build_all(["perl"], host=engine)[-1]


def _check(m: dict) -> None:
    assert m["same_output"], m["samples"]
    assert m["exit_codes"] == [m["expected_exit_code"]]
    assert all(s["error"] is None for s in m["samples"]), m["samples"]
    plain, disabled, cached = (m["arms"][a]["median"] for a in ARMS)
    layer_runs = [s for s in m["samples"] if s["arm"] == "layer"]
    assert all(s["hits"] > 0 and s["processes_with_layer"] >= 1 for s in layer_runs)
    # the layer's own counters: every hit took a kept block; nothing is kept when n = 0
    assert all(set(STAT_KEYS) <= s.keys() and s["kept"] >= s["hits"] for s in layer_runs)
    assert all(s["kept"] == 0 and s["processes_with_layer"] >= 1 for s in m["samples"]
               if s["arm"] == "disabled")  # fmt: skip
    assert all(s["hits"] == 0 for s in m["samples"] if s["arm"] == "disabled")
    # perl's medium input reallocs and frees strings of 130-300 KB: each reuse of a cached
    # block saves ~35-70 fresh pages (~25 hits, ~480 pages in all)
    assert cached < plain - 100 and cached < disabled - 100, m["arms"]
    assert m["fault_bytes_avoided"] > 0


def test_layer_on_perl_in_docker(layer, perl_image, tmp_path):
    from tasks.replay.runners.docker_runner import DockerRunner

    w = load_catalog().get("perl")
    m = measure_layer_workload(
        w, w.input("medium"), DockerRunner(), repetitions=2, warmup=0, layer=layer, policy=EAGER,
        scratch_parent=tmp_path,
    )  # fmt: skip
    assert m["runner"] == "docker" and m["static_threshold"]
    _check(m)


def test_layer_on_perl_locally(layer, tmp_path):
    from tasks.replay.runners.local_runner import LocalRunner

    if shutil.which("perl") is None:
        pytest.skip("no perl on this host")
    w = load_catalog().get("perl")
    m = measure_layer_workload(
        w, w.input("medium"), LocalRunner(), repetitions=1, warmup=0, layer=layer, policy=EAGER,
        scratch_parent=tmp_path,
    )  # fmt: skip
    _check(m)
