"""The `trace` flow under Prefect's test harness: quick inputs through the local runner, one
workload failing on purpose while the others complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.replay.manifest import MANIFEST_NAME
from tasks.replay.workloads import TraceParams

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

CATALOG = Path(__file__).parents[1] / "tasks" / "replay" / "catalogs" / "flow.yaml"


def test_trace_flow_one_failure_does_not_stop_the_others(prefect_harness, tmp_path):
    from prefect.artifacts import Artifact

    from flows.trace import trace

    # GIVEN a catalog whose `broken` workload exits 3 where 0 is expected
    params = TraceParams(
        catalog=str(CATALOG), quick=True, runner="local", root=str(tmp_path), max_parallel=2
    )
    # WHEN the flow replays its quick inputs
    summary = trace(params)
    # THEN every quick input was replayed, the good ones published, the broken one reported
    runs = {(r.workload, r.input): r for r in summary.runs}
    assert set(runs) == {("sqlite3", "small"), ("cpython", "small"), ("broken", "small")}
    assert summary.runner == "local"
    for key in [("sqlite3", "small"), ("cpython", "small")]:
        assert runs[key].ok and runs[key].events > 0, runs[key]
        manifest = json.loads((tmp_path / "raw" / key[0] / key[1] / MANIFEST_NAME).read_text())
        assert manifest["ok"] and manifest["events"] == runs[key].events
    broken = runs[("broken", "small")]
    assert not broken.ok and "exit code 3, expected 0" in broken.error
    assert [r.workload for r in summary.failed] == ["broken"]
    assert (
        json.loads((tmp_path / "raw" / "broken" / "small" / MANIFEST_NAME).read_text())["exit_code"]
        == 3
    )
    # the non-quick input was not replayed
    assert not (tmp_path / "raw" / "sqlite3" / "large").exists()
    # AND the markdown artifact lists each run
    art = Artifact.get("trace-summary")
    assert art is not None and "broken" in art.data and "**failed**" in art.data
