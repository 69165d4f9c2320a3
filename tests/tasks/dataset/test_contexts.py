"""tasks.dataset.contexts: an event's context key at depth d is its first d frames, the same in
every process of a run, and depth 1 is the call site."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.dataset.contexts import NO_CONTEXT, event_contexts
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.events_schema import STACKS_SCHEMA
from tasks.dataset.stacks_table import ProcessStacks, run_stacks
from tasks.format.trace_reader import parse_trace
from tests.tasks.dataset.test_stacks_table import PROG, convert_trace_with, stack_trace

CALLS = [
    ((PROG, 0x1100), (PROG, 0x1200), (PROG, 0x1300)),
    ((PROG, 0x1100), (PROG, 0x1250), (PROG, 0x1300)),  # the same site, another caller of it
    ((PROG, 0x1100), (PROG, 0x1200), (PROG, 0x1350)),  # the same two frames, another third
    ((PROG, 0x1100),),  # the site alone
]


def contexts(pid: int, depths=(1, 2, 3, 8)):
    tr = parse_trace(stack_trace(pid, CALLS), f"{pid}.hct")
    ps = ProcessStacks.of_trace(tr)
    table, _ = convert_trace_with(tr, ps)
    frames = StackFrames.of_table(run_stacks([ps.table()]).table)
    return event_contexts(frames, table.column("stack"), depths)


def test_a_context_is_its_first_frames_and_the_same_in_every_process():
    a, b = contexts(100), contexts(200)
    # calls made twice, then one free: rows 0-3 and 4-7 are the calls, row 8 the free
    for d, keys in a.items():
        assert np.array_equal(keys, b[d])  # the modules at other bases: the same keys
        assert keys[8] == NO_CONTEXT and (keys[:8] >= 0).all()
        assert np.array_equal(keys[:4], keys[4:8])
    one, two, three, deep = a[1][:4], a[2][:4], a[3][:4], a[8][:4]
    # depth 1: one call site for all four
    assert len(set(one.tolist())) == 1
    # depth 2: the second frame tells call 1 from 0 and 2; the site alone is its own stack
    assert two[0] == two[2] != two[1] and two[3] not in two[:3]
    # depth 3: three frames tell all apart; beyond the deepest, the whole stack
    assert len(set(three.tolist())) == 4
    assert np.array_equal(deep, three)
    # AND a one-frame stack's key is the same at every depth (its whole self)
    assert a[1][3] == a[2][3] == a[3][3] == a[8][3]


def test_a_run_without_stacks_has_no_context_at_any_depth():
    # GIVEN a run recorded without stacks: an empty stacks table, every event's stack null
    frames = StackFrames.of_table(STACKS_SCHEMA.empty_table())
    got = event_contexts(frames, pa.nulls(5, pa.uint64()), (1, 4))
    # THEN every event, at every depth, has none
    assert sorted(got) == [1, 4]
    assert all((k == NO_CONTEXT).all() and len(k) == 5 for k in got.values())
