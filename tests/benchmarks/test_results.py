"""benchmarks/results/ holds what `make bench` regenerates, and no result names a private path.

GIVEN the suite (benchmarks/suite.py) and benchmarks/results/ WHEN a newcomer reads or re-runs
them THEN every file under benchmarks/results/ is written by a maintained speed benchmark, every
benchmark and study script is in the suite, and no result names an absolute path of someone's
machine (/work, /root, /tmp, /home). The studies' own checks: tests/studies/test_studies.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.__main__ import run as run_one
from benchmarks.harness import PRIVATE_PATH
from benchmarks.suite import SPEED, STUDIES, Benchmark

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
# by-products a benchmark leaves beside its JSON, ignored by git (.gitignore)
BY_PRODUCTS = (".hct", ".html")


def _results(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix not in BY_PRODUCTS)


def test_no_result_names_a_private_path():
    found = {
        str(p.relative_to(REPO)): PRIVATE_PATH.findall(p.read_text(errors="replace"))[:3]
        for p in _results(RESULTS)
    }
    found = {k: v for k, v in found.items() if v}
    assert not found, (
        f"result files name private paths: {found}; write them relative to the repository or "
        "the data root (benchmarks/harness.py portable)"
    )


def test_the_private_path_pattern_tells_a_path_from_a_name():
    assert PRIVATE_PATH.search('"root": "/work/main/data"')
    assert PRIVATE_PATH.search("--work /tmp/rb40 --keep")
    assert not PRIVATE_PATH.search("configs/workloads.yaml")
    assert not PRIVATE_PATH.search("a `/tmp`-built library")


def test_every_result_is_written_by_a_speed_benchmark():
    written = {b.result_file for b in SPEED}
    strays = [p.name for p in _results(RESULTS) if p.name not in written]
    assert not strays, (
        f"benchmarks/results/ holds files no speed benchmark writes: {strays}; add the "
        "benchmark to benchmarks/suite.py or move the file to its study's folder studies/<name>/ "
        "with its command in that folder's README.md"
    )


def test_every_benchmark_script_is_in_the_suite():
    scripts = {b.script for b in SPEED} | {s.script for s in STUDIES if s.script}
    missing = [s for s in sorted(scripts) if not (REPO / s).is_file()]
    assert not missing, f"benchmarks/suite.py names scripts that do not exist: {missing}"
    found = {
        str(p.relative_to(REPO))
        for pattern in ("benchmarks/*.py", "studies/*/*.py")
        for p in REPO.glob(pattern)
    }
    found -= {f"benchmarks/{m}.py" for m in ("__init__", "__main__", "harness", "suite")}
    unlisted = sorted(found - scripts)
    assert not unlisted, f"benchmark or study scripts not in benchmarks/suite.py: {unlisted}"


def test_every_speed_benchmark_is_on_the_harness():
    off = [b.script for b in SPEED if "write_result" not in (REPO / b.script).read_text()]
    assert not off, f"speed benchmarks that do not write through benchmarks/harness.py: {off}"


def test_the_names_are_unique():
    names = [b.name for b in SPEED] + [s.name for s in STUDIES]
    assert len(names) == len(set(names))


# in this module, not the harness's: it writes into benchmarks/results/ for a moment, and the
# suite runs a module on one worker, so no check of the folder above reads it meanwhile
def test_the_suite_runner_finds_what_a_script_on_the_harness_writes(tmp_path):
    """GIVEN a benchmark script that writes its figures through the harness with no `out`,
    WHEN `python -m benchmarks`' runner runs it as its own process, THEN it finds the file where
    it looks for every benchmark's (benchmarks/results/<name>.json) and keeps the one shape."""
    name = "harness_selftest"
    script = tmp_path / "bench_selftest.py"
    script.write_text(
        "from benchmarks import harness\n"
        f"harness.write_result({name!r}, {{'rate': 2.0}}, reference='nothing')\n"
    )
    written = REPO / "benchmarks" / "results" / f"{name}.json"
    try:
        outcome, _ = run_one(Benchmark(name, str(script)))
        assert outcome == "ok"
        doc = json.loads(written.read_text())
        assert doc["benchmark"] == name and doc["results"] == {"rate": 2.0}
    finally:
        written.unlink(missing_ok=True)


def test_the_suite_runner_fails_a_file_not_in_the_one_shape(tmp_path):
    """GIVEN a benchmark script that writes its own JSON beside the harness, WHEN the runner runs
    it, THEN the benchmark is named failed: every file under benchmarks/results/ has one shape."""
    name = "harness_selftest_own"
    script = tmp_path / "bench_own.py"
    written = REPO / "benchmarks" / "results" / f"{name}.json"
    script.write_text(f"open({str(written)!r}, 'w').write('{{\"rate\": 2.0}}')\n")
    try:
        outcome, _ = run_one(Benchmark(name, str(script)))
        assert outcome.startswith("failed") and "shape" in outcome
    finally:
        written.unlink(missing_ok=True)
