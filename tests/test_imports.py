"""The import graph tells the truth: stages import only earlier stages, and at the top.

GIVEN every module of tasks/, flows/ and cli/
WHEN its import statements are read (ast, nothing imported)
THEN no stage imports a stage that comes later in the map (docs/pipeline.md), and an import
inside a function is a heavy one (TensorFlow, Keras, MLflow, matplotlib, h5py, or a heapcast
module that imports one of them at its top) deferred on purpose, with a `# deferred:` comment saying so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]

# The README's map, in pipeline order; stages on one floor may not import each other.
STAGE_FLOOR = {
    "core": 0,
    "format": 0,
    "replay": 1,
    "dataset": 1,
    "learning": 2,
    "stacks": 2,
    "registry": 3,
    "report": 4,
    "whatif": 5,
    "allocators": 5,
    "nightly": 6,
}
HEAVY = {"tensorflow", "keras", "jax", "torch", "mlflow", "matplotlib", "h5py"}
DEFERRED_MARK = "# deferred:"


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (PROJECT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PROJECT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: resolve against the importing package
        base = module.split(".")[: -node.level] if not module.endswith("__init__") else module
        prefix = ".".join(base)
        return [f"{prefix}.{node.module}" if node.module else prefix]
    return [node.module or ""]


def _imports(path: Path, module: str | None = None):
    """(node, names, inside_function) for each import statement of the file."""
    tree = ast.parse(path.read_text())
    module = module or _module_name(path)
    inner: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield n, _imported(n, module), id(n) in inner


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tasks" and parts[1] in STAGE_FLOOR else None


ALL = _modules("tasks") + _modules("flows") + _modules("cli")


def _heavy_at_top() -> set[str]:
    """heapcast modules that import a heavy library at their top, directly or through another."""
    direct: dict[str, set[str]] = {}
    heavy: set[str] = set()
    for path in ALL:
        module = _module_name(path)
        deps = set()
        for _node, names, inside in _imports(path):
            if inside:
                continue
            for name in names:
                if name.split(".")[0] in HEAVY:
                    heavy.add(module)
                deps.add(name)
        direct[module] = deps
    changed = True
    while changed:
        changed = False
        for module, deps in direct.items():
            if module not in heavy and any(
                d in heavy or any(h.startswith(d + ".") or d.startswith(h + ".") for h in heavy)
                for d in deps
                if d.split(".")[0] in {"tasks", "flows"}
            ):
                heavy.add(module)
                changed = True
    return heavy


def test_the_map_knows_every_stage_package():
    packages = {p.name for p in (PROJECT / "tasks").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(STAGE_FLOOR), (
        "a new stage package belongs in the map in docs/pipeline.md and here"
    )


@pytest.mark.parametrize("path", _modules("tasks"), ids=lambda p: str(p.relative_to(PROJECT)))
def test_a_stage_imports_only_earlier_stages(path: Path):
    own = _stage(_module_name(path))
    if own is None:
        return
    later = []
    for node, names, _inside in _imports(path):
        for name in names:
            other = _stage(name)
            if other is not None and other != own and STAGE_FLOOR[other] >= STAGE_FLOOR[own]:
                later.append(f"line {node.lineno}: {name} ({other} is not above {own})")
    assert not later, f"{path.relative_to(PROJECT)} imports against the stage order: {later}"


def _said(lines: list[str], lineno: int) -> bool:
    """The deferral is said on the import's line or on the comment, import or blank lines just
    above it (one comment may head a group of deferred imports)."""
    i = lineno - 1
    while i >= 0:
        line = lines[i].strip()
        if DEFERRED_MARK in line:
            return True
        if i < lineno - 1 and line and not line.startswith(("#", "import ", "from ")):
            return False
        i -= 1
    return False


def test_imports_inside_functions_are_heavy_and_say_why():
    heavy = _heavy_at_top()
    hidden = []
    for path in ALL:
        lines = path.read_text().splitlines()
        for node, names, inside in _imports(path):
            if not inside:
                continue
            said = _said(lines, node.lineno)
            # the CLI defers what a subcommand needs, so that `heapcast trace` starts at once
            is_heavy = path.parts[-2] == "cli" or all(
                n.split(".")[0] in HEAVY or n in heavy for n in names
            )
            if not (said and is_heavy):
                why = "not heavy" if not is_heavy else f"no '{DEFERRED_MARK}' comment"
                hidden.append(f"{path.relative_to(PROJECT)}:{node.lineno} {names} ({why})")
    assert not hidden, "imports hidden in functions:\n" + "\n".join(hidden)


def test_the_checks_catch_what_they_are_for(tmp_path: Path):
    """The walkers see a later-stage import and a light import hidden in a function."""
    src = "import json\n\ndef f():\n    from tasks.nightly.night_summary import summarize\n    import os\n"
    p = tmp_path / "m.py"
    p.write_text(src)
    found = [(names, inside) for _n, names, inside in _imports(p, "tasks.whatif.m")]
    assert (["json"], False) in found
    assert (["tasks.nightly.night_summary"], True) in found and (["os"], True) in found
    assert _stage("tasks.nightly.night_summary") == "nightly"
    grouped = ["def g():", "    # deferred: start-up", "    import mlflow", "", "    import keras"]
    grouped += ["    x = 1", "    import os"]
    assert _said(grouped, 3) and _said(grouped, 5) and not _said(grouped, 7)
