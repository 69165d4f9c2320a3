"""The what-if stage's `layer_online` predictor is the layer's own guided decision.

GIVEN a random thread of calls on large blocks (allocations of a few classes, frees of them)
WHEN  the C predictor (native/layers/predictor.h: hcp_learn, then hcp_soon at each free) and
      tasks.whatif.guided's replica decide at every free
THEN  they agree at every free, for several (topk, horizon); and on a table the decision follows
      only the calls on blocks >= min, thread by thread, and never reads a later event.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tasks.whatif.guided import _layer_rule, layer_rule_keep
from tests.tasks.whatif.reference import random_events

PROJECT = Path(__file__).resolve().parents[3]

SOON_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include "predictor.h"
/* stdin: lines "k h", then "a CLASS" (allocation) or "f CLASS" (free); stdout: one 0/1 per free */
int main(void) {
    unsigned k, h, cls;
    char kind;
    struct hcp_counter *c = calloc(1, sizeof *c);
    if (!c || scanf("%u %u", &k, &h) != 2) return 2;
    while (scanf(" %c %u", &kind, &cls) == 2) {
        if (kind == 'a') {
            hcp_learn(c, cls);
        } else {
            hcp_learn(c, HCP_FREE + cls);
            printf("%d\n", hcp_soon(c, cls, k, h));
        }
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def soon(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.fail("this test needs gcc (apt-get install build-essential)")
    d = tmp_path_factory.mktemp("soon")
    (d / "soon.c").write_text(SOON_C)
    exe = d / "soon"
    inc = PROJECT / "native" / "layers"
    subprocess.run(["gcc", "-O1", "-I", str(inc), "-o", str(exe), str(d / "soon.c")], check=True)
    return exe


def _sequence(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """(class requested, class freed) per call, -1 where none: phases of repeated patterns."""
    rng = np.random.default_rng(seed)
    req = np.full(n, -1, np.int64)
    free = np.full(n, -1, np.int64)
    i = 0
    while i < n:
        pattern = rng.integers(17, 24, size=rng.integers(1, 4))
        for _ in range(rng.integers(5, 60)):
            for c in pattern:
                for arr in (req, free):
                    if i < n:
                        arr[i] = c if rng.random() > 0.1 else rng.integers(17, 27)
                        i += 1
    return req, free


@pytest.mark.parametrize(("k", "h"), [(2, 4), (1, 1), (3, 2), (2, 16)])
@pytest.mark.parametrize("seed", range(3))
def test_replica_equals_the_c_predictor(soon, seed, k, h):
    req, free = _sequence(seed)
    lines = [f"{k} {h}"] + [
        f"a {r}" if r >= 0 else f"f {f}" for r, f in zip(req, free, strict=True)
    ]
    out = subprocess.run(
        [str(soon)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True
    ).stdout.split()
    c_keep = np.array(out, dtype=np.int64).astype(bool)
    starts = np.zeros(len(req), bool)
    starts[0] = True
    ours = _layer_rule(starts, req, free, k, h)[free >= 0]
    assert len(c_keep) == len(ours)
    np.testing.assert_array_equal(ours, c_keep)
    assert c_keep.any() and not c_keep.all()


def test_on_a_table_it_is_causal_and_sees_only_large_blocks():
    table = random_events(5, n_proc=2, n_events=600, time_step=3, min_step=1)
    keep = layer_rule_keep(table, min_size=131072)
    freed = table.column("freed_size").to_numpy(zero_copy_only=False)
    small = np.array([f is not None and f < 131072 for f in freed])
    assert not keep[small].any()  # blocks below min: never the layer's
    assert keep.any()
    time = table.column("time_ns").to_numpy()
    # truncating the run after a free (every later event gone) leaves the decision at it
    for i in np.flatnonzero(keep)[:5].tolist() + np.flatnonzero(~keep & ~small)[:5].tolist():
        head = table.filter(time <= time[i])
        rows = np.flatnonzero(time <= time[i])
        assert layer_rule_keep(head, min_size=131072)[np.searchsorted(rows, i)] == keep[i]
