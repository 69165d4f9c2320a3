"""The report's interactive flame graph of a run's call stacks: d3-flame-graph (vendored under
vendor/, inlined into the page, so it opens offline) over a compact tree built from the
StackProfile (calltree.CallTree: one node per distinct path of frames, never per event).

One graph per run, weighed by bytes allocated, bytes live at the peak, bytes leaked or calls
(a switch: the same tree, each node carrying all four); a click zooms into a frame, a search
box highlights the frames whose name holds the text and says what share of the weight they
hold. The page's address can choose both: `#weight=leaked&search=xmalloc`. For two runs, a
differential graph: B's tree, each frame coloured by how its own figure changed from A (red:
more in B, blue: less).

The tree is pruned: a node below 1/PRUNE_BELOW of every weight's total (far under a pixel) is
left out, its figures still counted in its caller's.
"""

from __future__ import annotations

import html
import json
from functools import cache
from pathlib import Path

import numpy as np

from tasks.report.calltree import COLUMNS, CallTree, call_tree, column
from tasks.stacks.profile import StackProfile

VENDOR = Path(__file__).parent / "vendor"
VENDOR_SCRIPTS = (  # (file, the notice the page keeps before it)
    ("d3.min.js", "d3 7.9.2, ISC license, (c) Mike Bostock: https://d3js.org"),
    (
        "d3-flamegraph.umd.min.js",
        "d3-flame-graph 5.0.0, Apache-2.0 license, (c) Martin Spier: "
        "https://github.com/spiermar/d3-flame-graph",
    ),
)
FLAME_JS = Path(__file__).with_name("flame.js")  # the page's own code around the library
# What a graph can be weighed by (a StackProfile column) and how the switch names it.
GRAPH_WEIGHTS = (
    ("bytes", "bytes allocated"),
    ("peak", "live at the peak"),
    ("leaked", "leaked"),
    ("calls", "calls"),
)
PRUNE_BELOW = 20_000


def tree_json(
    tree: CallTree, prune_below: int = PRUNE_BELOW, delta: CallTree | None = None
) -> dict:
    """The tree as d3-flame-graph reads it, compactly: `names` once, and nested nodes
    `{"f": name row, "v": [figures in COLUMNS order], "c": [children]}` (root: f = -1).
    With `delta` (the same frames' tree of run A; `tree` is run B's), each node also carries
    `"d"`: its own (not inclusive) figures in B minus in A."""
    totals = tree.values[0]
    graph = [column(w) for w, _ in GRAPH_WEIGHTS]
    floor = np.maximum(totals[graph], 1) / prune_below
    keep = np.any(tree.values[:, graph] >= floor, axis=1)
    keep[0] = True
    for k in range(1, len(tree)):  # a loop over tree nodes (parents come first)
        keep[k] = keep[k] and keep[tree.parent[k]]  # under a pruned node: pruned too
    own_delta = _own_delta(tree, delta, keep) if delta is not None else None
    nodes: dict[int, dict] = {}
    for k in np.flatnonzero(keep).tolist():
        node: dict = {"f": int(tree.name[k]), "v": tree.values[k].tolist()}
        if own_delta is not None:
            node["d"] = own_delta[k].tolist()
        nodes[k] = node
        if k:
            nodes[int(tree.parent[k])].setdefault("c", []).append(node)
    return {
        "names": list(tree.names),
        "modules": list(tree.modules),
        "columns": list(COLUMNS),
        "root": nodes[0],
    }


def _own_delta(b: CallTree, a: CallTree, kept: np.ndarray) -> np.ndarray:
    """Per node of b: its own figures (inclusive minus its kept children's) in b minus in a,
    the node of a being the one with the same path of names."""
    a_node = {(): 0}
    a_paths: dict[int, tuple[int, ...]] = {0: ()}
    for k in range(1, len(a)):  # loops over tree nodes
        a_paths[k] = a_paths[a.parent[k]] + (a.names[a.name[k]],)
        a_node[a_paths[k]] = k
    b_paths: dict[int, tuple] = {0: ()}
    a_values = np.zeros_like(b.values)
    for k in range(len(b)):
        if k:
            b_paths[k] = b_paths[b.parent[k]] + (b.names[b.name[k]],)
        j = a_node.get(b_paths[k])
        if j is not None:
            a_values[k] = a.values[j]
    diff = b.values - a_values
    own = diff.copy()
    child = np.flatnonzero(kept[1:]) + 1
    np.subtract.at(own, b.parent[child], diff[child])
    return own


@cache
def vendor_scripts() -> str:
    """d3 and d3-flame-graph as <script> elements, with their notices."""
    parts = []
    for name, notice in VENDOR_SCRIPTS:
        js = (VENDOR / name).read_text(encoding="utf-8")
        parts.append(f"<script>/*! {notice} */\n{js}\n</script>")
    return "\n".join(parts) + f"\n<script>{FLAME_JS.read_text(encoding='utf-8')}</script>"


def _json_script(element_id: str, data: dict) -> str:
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f"<script type='application/json' id='{element_id}'>{text}</script>"


def flame_div(element_id: str, title: str, data: dict, differential: bool = False) -> str:
    """One flame graph: its controls (weight, search, reset), the chart, its data. The page's
    script (flame.js) draws every `div.flame` once loaded."""
    switch = "".join(
        f"<label><input type='radio' name='{element_id}-weight' value='{w}'"
        f"{' checked' if i == 0 else ''}> {html.escape(label)}</label> "
        for i, (w, label) in enumerate(GRAPH_WEIGHTS)
    )
    return (
        f"<div class='flame' id='{element_id}' data-differential='{int(differential)}'>"
        f"<h3>{html.escape(title)}</h3>"
        f"<div class='flame-controls'>weigh by: {switch}"
        f"<input type='search' class='flame-search' placeholder='search a function'> "
        f"<button type='button' class='flame-reset'>reset zoom</button></div>"
        f"<div class='flame-total'></div><div class='flame-chart'></div>"
        f"<div class='flame-details note'>&nbsp;</div>"
        f"{_json_script(element_id + '-data', data)}</div>"
    )


def flame_graphs(profiles: list[StackProfile | None], labels: list[str]) -> list[str]:
    """The flame graph of each run that has stacks and, for two runs that both have them, the
    differential graph of B against A."""
    trees = [call_tree(p) if p is not None else None for p in profiles]
    out = []
    for i, (tree, label) in enumerate(zip(trees, labels)):
        if tree is not None:
            tag = f"{'AB'[i]}: " if len(profiles) > 1 else ""
            out.append(flame_div(f"flame-{'ab'[i]}", f"{tag}{label}", tree_json(tree)))
    if len(trees) == 2 and trees[0] is not None and trees[1] is not None:
        out.append(
            flame_div(
                "flame-diff",
                "B against A: B's stacks, each frame coloured by its own change from A "
                "(red: more in B, blue: less; frames only in A are not drawn: the table below "
                "lists them)",
                tree_json(trees[1], delta=trees[0]),
                differential=True,
            )
        )
    return out
