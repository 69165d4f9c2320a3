"""The call trees and per-function sums the flame graphs and stack tables draw from."""

from __future__ import annotations

import numpy as np

from tasks.report.calltree import COLUMNS, NO_STACK, call_tree, function_sums, has_stacks
from tasks.report.flame import tree_json
from tests.tasks.report import stack_scenario as sc


def _paths(tree) -> dict[tuple[str, ...], dict[str, int]]:
    """{path of labels from the root: {column: value}} of every node but the root."""
    path = {0: ()}
    out = {}
    for k in range(1, len(tree)):
        path[k] = path[int(tree.parent[k])] + (tree.label(k),)
        out[path[k]] = dict(zip(COLUMNS, tree.values[k].tolist()))
    return out


def _v(calls, nbytes, peak, leaked, temps) -> dict[str, int]:
    return dict(zip(COLUMNS, (calls, nbytes, peak, leaked, temps)))


def test_top_down_tree_merges_stacks_from_the_outermost_frame():
    tree = call_tree(sc.PROFILE)
    assert dict(zip(COLUMNS, tree.values[0].tolist())) == sc.TOTAL
    assert _paths(tree) == {
        ("main",): _v(18, 5564, 4164, 4064, 4),
        ("main", "parse"): _v(10, 1000, 100, 0, 3),
        ("main", "parse", "xmalloc"): _v(10, 1000, 100, 0, 3),
        ("main", "render"): _v(6, 4500, 4000, 4000, 1),
        # two call sites in xmalloc are one frame; a frame without a symbol is module+offset
        ("main", "render", "xmalloc"): _v(5, 500, 0, 0, 1),
        ("main", "render", "libx.so+0x44"): _v(1, 4000, 4000, 4000, 0),
        ("main", "eval"): _v(2, 64, 64, 64, 0),
        ("main", "eval", "eval"): _v(2, 64, 64, 64, 0),
        ("main", "eval", "eval", "xmalloc"): _v(2, 64, 64, 64, 0),
        (NO_STACK,): _v(2, 8, 0, 0, 0),
    }


def test_bottom_up_tree_starts_at_the_allocating_function():
    tree = call_tree(sc.PROFILE, inverted=True)
    paths = _paths(tree)
    assert paths[("xmalloc",)] == _v(17, 1564, 164, 64, 4)
    assert paths[("xmalloc", "render", "main")] == _v(5, 500, 0, 0, 1)
    assert paths[("xmalloc", "eval", "eval", "main")] == _v(2, 64, 64, 64, 0)
    assert paths[("libx.so+0x44",)] == _v(1, 4000, 4000, 4000, 0)
    assert {p[0] for p in paths} == {"xmalloc", "libx.so+0x44", NO_STACK}


def test_function_sums_count_a_recursive_function_once_per_stack():
    f = function_sums(sc.PROFILE)
    row = {n: i for i, n in enumerate(f.names)}
    inc = {n: dict(zip(COLUMNS, f.inclusive[i].tolist())) for n, i in row.items()}
    own = {n: dict(zip(COLUMNS, f.self_[i].tolist())) for n, i in row.items()}
    assert inc["eval"] == _v(2, 64, 64, 64, 0)  # not twice: eval is in the stack twice
    assert inc["main"] == _v(18, 5564, 4164, 4064, 4)
    assert own["main"] == _v(0, 0, 0, 0, 0)
    assert own["xmalloc"] == inc["xmalloc"] == _v(17, 1564, 164, 64, 4)
    assert own[NO_STACK] == _v(2, 8, 0, 0, 0)
    assert f.modules[row["xmalloc"]] == "/lib/libx.so"


def test_a_profile_without_frames_has_no_stacks():
    assert has_stacks(sc.PROFILE)
    assert not has_stacks(sc.without_frames(sc.PROFILE)) and not has_stacks(None)


def _nodes(node, names, path=()):
    here = path + (names[node["f"]] if node["f"] >= 0 else "all",)
    yield here, node
    for c in node.get("c", []):
        yield from _nodes(c, names, here)


def test_flame_json_is_the_tree_pruned_below_a_share_of_every_weight():
    tree = call_tree(sc.PROFILE)
    # GIVEN a floor of 1/100 of each weight: every frame holds more of some weight (the
    # stack-less 8 of 5572 bytes by its 2 of 20 calls), so all stay
    data = tree_json(tree, prune_below=100)
    nodes = dict(_nodes(data["root"], data["names"]))
    assert len(nodes) == len(tree)
    assert nodes[("all", "main", "render")]["v"] == [6, 4500, 4000, 4000, 1]
    # WHEN the floor is 1/2: only frames holding half of some weight remain, and a kept
    # node's figures still count what was pruned under it
    data = tree_json(tree, prune_below=2)
    nodes = dict(_nodes(data["root"], data["names"]))
    assert set(nodes) == {
        ("all",),
        ("all", "main"),
        ("all", "main", "parse"),  # by its calls: 10 of 20
        ("all", "main", "parse", "xmalloc"),
        ("all", "main", "render"),
        ("all", "main", "render", "libx.so+0x44"),
    }
    assert nodes[("all", "main")]["v"][1] == 5564


def test_differential_json_carries_each_frames_own_change():
    a, b = call_tree(sc.PROFILE), call_tree(sc.LATER)
    data = tree_json(b, prune_below=10**9, delta=a)
    nodes = dict(_nodes(data["root"], data["names"]))
    byte = COLUMNS.index("bytes")
    own = {p: n["d"][byte] for p, n in nodes.items()}
    assert own[("all", "main", "render", "xmalloc")] == 900 - 500
    assert own[("all", "main", "render", "libx.so+0x44")] == 2000 - 4000
    assert own[("all", "main", "xmalloc")] == 700  # new in B
    assert own[("all", "main", "render")] == 0  # its own bytes: none in either run
    # a frame only in A (parse) is not drawn: its change counts in its caller's own
    assert own[("all", "main")] == -1000 and own[("all",)] == -8
    # so the frames' own changes add up to the run's change
    assert sum(own.values()) == int(sc.LATER.bytes.sum() - sc.PROFILE.bytes.sum())
    assert np.all(np.array([n["v"][byte] for n in nodes.values()]) >= 0)
