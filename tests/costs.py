"""What each test costs, measured: the suite's tiers and its order over the cores come from it.

`tests/costs.json` holds the seconds (setup, call and teardown) of every test that took at least
SLOW_S in the last full measured run, and the command that measured it. tests/conftest.py reads
it twice:

- the tier: a test listed there is `slow` (out of `make test-quick`) whatever its folder; so is a
  test marked `slow` or `integration` by hand (a new test that starts a server says so itself);
- the order: under pytest-xdist the tests of one module stay on one worker (their module-scoped
  fixtures are made once), and the costliest modules start first, so that no worker is left
  with a long module at the end while the other waits.

Remake it after a change that moves the costs (docs/testing.md):

    make test                                        # leaves .test-results/*.xml
    .venv/bin/python -m tests.costs write .test-results/tensorflow.xml

`make test` ends with `python -m tests.costs report`: the 15 slowest tests and the total.
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
COSTS = TESTS / "costs.json"
BUDGET_MIN = 25  # `make test` from a fresh clone, images built, both passes
SLOW_S = 1.0  # a test at or above this is `slow`: the quick tier is the edit-test loop
QUICK_S = 0.2  # what a test not in the table is counted as when the units are ordered


def load(path: Path = COSTS) -> dict[str, float]:
    """{node id: seconds} of the slow tests; empty when the file is missing."""
    if not path.is_file():
        return {}
    return {k: float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def module_of(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def _node_id(classname: str, name: str) -> str | None:
    """pytest's node id from a JUnit test case (classname "tests.a.test_b[.Class]")."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (REPO / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return None


def from_junit(paths: list[Path]) -> dict[str, float]:
    """{node id: seconds} of every test case in the JUnit files (pytest --junitxml)."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            node = _node_id(case.get("classname", ""), case.get("name", ""))
            if node is not None:
                out[node] = out.get(node, 0.0) + float(case.get("time", 0.0))
    return out


def report(paths: list[Path], wall_s: float | None = None, top: int = 15) -> str:
    """The budget, as `make test` ends with it: the `top` slowest tests over the JUnit files,
    each pass's test count and seconds, and the wall time when given."""
    lines = [f"the {top} slowest tests (setup + call + teardown, s):"]
    every: list[tuple[float, str]] = []
    for path in paths:
        measured = from_junit([path])
        every += [(s, f"{path.stem}: {n}") for n, s in measured.items()]
    for seconds, node in sorted(every, reverse=True)[:top]:
        lines.append(f"  {seconds:7.1f}  {node}")
    for path in paths:
        suite = ET.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        if suite is not None:
            lines.append(
                f"{path.stem}: {suite.get('tests')} tests, {suite.get('failures')} failed, "
                f"{suite.get('errors')} errors, {suite.get('skipped')} skipped in "
                f"{float(suite.get('time', 0)):.0f} s"
            )
    if wall_s is not None:
        lines.append(
            f"the suite took {wall_s / 60:.1f} min (budget: {BUDGET_MIN} min, docs/testing.md)"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`write JUNIT...`: remake costs.json; `report [--since EPOCH_S] JUNIT...`: the budget."""
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("write", "report"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    verb, rest = argv[0], argv[1:]
    since = None
    if verb == "report" and rest[:1] == ["--since"]:
        since, rest = float(rest[1]), rest[2:]
    missing = [a for a in rest if not Path(a).is_file()]
    if missing or not rest:
        print(
            f"tests.costs: no such JUnit file: {', '.join(missing) or '(none given)'}",
            file=sys.stderr,
        )
        return 2
    paths = [Path(a) for a in rest]
    if verb == "report":
        print(report(paths, None if since is None else time.time() - since))
        return 0
    measured = from_junit(paths)
    slow = {k: round(v, 2) for k, v in sorted(measured.items()) if v >= SLOW_S}
    doc = {
        "what": f"seconds of each test at or above {SLOW_S} s (tests/costs.py says how to remake)",
        "tests_measured": len(measured),
        "total_s": round(sum(measured.values()), 1),
        "seconds": slow,
    }
    COSTS.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{COSTS.relative_to(REPO)}: {len(slow)} of {len(measured)} tests at or above {SLOW_S} s, "
        f"{sum(slow.values()):.0f} of {sum(measured.values()):.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
