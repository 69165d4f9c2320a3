"""The workload catalog: the shipped one is valid and complete; bad ones name workload + field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.core.config import ConfigError
from tasks.replay.workloads import CATALOG_PATH, load_catalog, parse_catalog

INVALID = sorted((Path(__file__).parent / "catalogs" / "invalid").glob("*.yaml"))


def test_shipped_catalog_has_six_real_programs_with_two_inputs_each():
    catalog = load_catalog(CATALOG_PATH)
    names = set(catalog.names())
    assert {"sqlite3", "cpython", "gcc", "git", "redis", "freeciv"} <= names
    for w in catalog.workloads:
        assert len(w.inputs) >= 2, w.name
        assert w.time_limit_s > 0 and w.command and w.image


def test_quick_subset_trains_on_one_input_and_evaluates_on_another():
    catalog = load_catalog()
    quick = catalog.select(quick=True)
    by_workload: dict[str, list[str]] = {}
    for w, i in quick:
        by_workload.setdefault(w.name, []).append(i.name)
    assert len(by_workload["sqlite3"]) >= 2 and len(by_workload["cpython"]) >= 2
    assert all(i.quick for _, i in quick)


def test_select_by_name_and_unknown_name():
    catalog = load_catalog()
    assert {w.name for w, _ in catalog.select(["git"])} == {"git"}
    assert catalog.images(["sqlite3", "cpython"], quick=True) == ["sqlite3", "cpython"]
    with pytest.raises(KeyError, match="nosuch"):
        catalog.select(["nosuch"])


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_catalog_names_workload_and_field(path: Path):
    # GIVEN a catalog with one known mistake, declared in its first line
    expect = re.search(r"# expect: workload=(\S+) field=(\S+)", path.read_text())
    assert expect, f"{path} must declare '# expect: workload=NAME field=FIELD'"
    workload, field = expect.groups()
    # WHEN it is loaded THEN the error names the file, the workload and the field
    with pytest.raises(ConfigError) as err:
        load_catalog(path)
    msg = str(err.value)
    assert str(path) in msg
    line = next((ln for ln in msg.splitlines() if f"workload {workload!r}" in ln), None)
    assert line is not None, msg
    assert f"field {field!r}" in line or f"field '{field}" in line, msg


def test_top_level_mistakes():
    with pytest.raises(ConfigError, match="workloads"):
        parse_catalog({"workload": []}, "x.yaml")
    with pytest.raises(ConfigError, match="non-empty"):
        parse_catalog({"workloads": []}, "x.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_catalog("/nonexistent/workloads.yaml")


def test_replays_record_stacks_by_default_and_a_workload_caps_their_depth():
    from pydantic import ValidationError

    from tasks.format.stack_depth import DEFAULT_FRAMES
    from tasks.replay.workloads import TraceParams

    # GIVEN the trace flow's parameters: stacks by default, none without the caller
    assert TraceParams().stack_frames == DEFAULT_FRAMES == 32
    assert TraceParams(caller=False).stack_frames == 0
    assert TraceParams(frames=8).stack_frames == 8
    assert TraceParams(frames=0).stack_frames == 0
    # stacks without the caller, or deeper than the tracer goes, are refused by name
    with pytest.raises(ValidationError, match="turn caller on, or set frames to 0"):
        TraceParams(caller=False, frames=4)
    with pytest.raises(ValidationError, match="frames"):
        TraceParams(frames=129)
    # WHEN a workload caps its depth THEN its replays go no deeper, and shallower when asked
    w = load_catalog().get("sqlite3").model_copy(update={"frames": 4})
    assert (w.frames_for(32), w.frames_for(2), w.frames_for(0)) == (4, 2, 0)
    assert load_catalog().get("sqlite3").frames_for(32) == 32
