"""whatif's layer_guided(table=true) with a format 4 table (native/TABLE.md "Format 4"): a free
asks its block's allocation context first, then its call site, then the thread's counter, as
the layer (layers/layer/policy.c hl_keep_at_free) and ClassTable.answer do."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.dataset.contexts import event_contexts
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.sites import SITE_VOCABULARY, call_sites
from tasks.dataset.token_runs import ScoredRun
from tasks.learning.labels import REUSE_CLASSES
from tasks.learning.table.distill import (
    CONTEXT_DEPTH,
    ClassTable,
    ContextCounts,
    allocation_contexts,
    keep_soon,
    soon_of_reuse,
)
from tasks.learning.table.layer_file import HEADER, write_layer_table
from tasks.whatif import policies
from tasks.whatif.night import Predictor, replay_events, table_file_scores
from tasks.whatif.policy_core import LayerPolicy, replay
from tests.tasks.dataset.test_frame_tokens import stacks_table
from tests.tasks.whatif.test_simulate import FREE, MALLOC, _events, _with_callers

# two allocation contexts: one wrapper called from two callers (the same first frame)
FRAMES = StackFrames.of_table(
    stacks_table(
        {
            1: [("/bin/p", 0x10, "xmalloc"), ("/bin/p", 0x400, "read_rows"), ("/bin/p", 0x80, "")],
            2: [("/bin/p", 0x10, "xmalloc"), ("/bin/p", 0x900, "load_blob"), ("/bin/p", 0x80, "")],
        }
    )
)
SIZE = 300_000  # class 19: a block the layer maps and may keep
CLS = 19
KEPT, DECLINED = 1, 4  # policy_core.FATE_NAMES


def _run() -> tuple[pa.Table, np.ndarray]:
    """Rounds of malloc and free of SIZE, allocated in context 1 and 2 in turn, every free from
    one call site; the stack of each row's call (frees: none) and which context each free's
    block had."""
    rows, offsets, stack = [], [], []
    for k in range(12):
        rows += [(MALLOC, SIZE, 0x10 + k * 0x1000000, None), (FREE, 0, 0x10 + k * 0x1000000, SIZE)]
        offsets += [0x50, 0x200]
        stack += [1 + k % 2, None]
    t = _with_callers(_events(rows), offsets)
    t = t.set_column(t.schema.get_field_index("stack"), "stack", pa.array(stack, pa.uint64()))
    return t, np.array([1 + k % 2 for k in range(12)])


def _tables(t: pa.Table) -> tuple[ClassTable, ClassTable, int, int]:
    """A format 4 table whose (context, class) entries say: context 1's blocks come back soon
    (reuse class 0), context 2's never (the last class); its one (site, class) entry, at the
    frees' shared site, says keep (what the two contexts' frees together had); and the same
    table without the contexts (format 3). Also the two contexts' keys."""
    ctx = event_contexts(FRAMES, t.column("stack"), (CONTEXT_DEPTH,))[CONTEXT_DEPTH]
    soon_key, never_key = int(ctx[0]), int(ctx[2])
    assert soon_key != never_key and min(soon_key, never_key) >= 0
    site = int(call_sites(t)[1])
    assert len(set(call_sites(t)[1::2].tolist())) == 1
    by_site = np.zeros((SITE_VOCABULARY, 32, REUSE_CLASSES))
    by_site[site, CLS, 0] = 6  # the site: six frees back soon, ...
    by_site[site, CLS, REUSE_CLASSES - 1] = 4  # ... four not
    keys = sorted([(soon_key, 0), (never_key, REUSE_CLASSES - 1)])
    counts = ContextCounts(
        CONTEXT_DEPTH,
        np.array([k for k, _ in keys]),
        np.full(2, CLS),
        np.stack([np.eye(REUSE_CLASSES)[c] * 10 for _, c in keys]),
    )
    v4 = ClassTable(np.ones((32, REUSE_CLASSES)), np.full(REUSE_CLASSES, 0.2), by_site, counts)
    v3 = ClassTable(v4.reuse_counts, v4.majority, by_site)
    return v4, v3, soon_key, never_key


def test_a_format_4_table_keeps_one_allocation_contexts_blocks_and_not_the_others(tmp_path):
    """GIVEN a run whose blocks come from two allocation contexts and are all freed from one
    call site, and the night's format 4 file whose context entries say keep for one context
    and pass on for the other, whose site entry says keep
    THEN the night's layer_guided_table replay (the file as _fetch_class_scores reads it, the
    run's stacks as the whatif stage reads them) keeps every free of the first context's blocks
    and declines every free of the other's; each free was answered by a context entry (the
    layer's table_contexts), none by the site; the keep decisions are the table's answer as the
    evaluation asks it (ClassTable.answer at distill.allocation_contexts); and the same table
    in format 3, or the format 4 file over the run without its stacks, asks the site entry and
    keeps every block: contexts ignored, the replay keeps the second context's too."""
    t, ctx_of_free = _run()
    v4, v3, _, _ = _tables(t)
    f4 = write_layer_table(tmp_path / "v4.hcltab", v4, 1)
    f3 = write_layer_table(tmp_path / "v3.hcltab", v3, 1)
    assert [HEADER.unpack_from(f.read_bytes())[1] for f in (f4, f3)] == [4, 3]
    s4, s3 = table_file_scores(f4), table_file_scores(f3)
    assert s4.contexts is not None and s4.contexts.depth == CONTEXT_DEPTH
    assert s3.contexts is None

    policy = LayerPolicy(policy="guided", proof=0, peak=None)
    core = replay(t, policy, class_scores=s4, frames=FRAMES)
    fate = core.fate[1::2]
    assert np.all(fate[ctx_of_free == 1] == KEPT)
    assert np.all(fate[ctx_of_free == 2] == DECLINED)
    assert (core.stats["contexted"], core.stats["sited"]) == (12, 0)
    # the evaluation's answer at the same frees (its counter: unused, every free has a key)
    rows = np.arange(1, t.num_rows, 2)
    ctx = event_contexts(FRAMES, t.column("stack"), (CONTEXT_DEPTH,))[CONTEXT_DEPTH]
    alloc = allocation_contexts(t, ctx)[rows]
    probs, at_site, at_context = v4.answer(
        call_sites(t)[rows], np.full(len(rows), CLS), counter=None, alloc_context=alloc
    )
    assert at_context.all() and not at_site.any()
    assert np.array_equal(keep_soon(soon_of_reuse(probs)), fate == KEPT)
    # contexts ignored: the site entry keeps every block
    for other in (
        replay(t, policy, class_scores=s3, frames=FRAMES),
        replay(t, policy, class_scores=s4, frames=None),
    ):
        assert np.all(other.fate[1::2] == KEPT)
        assert (other.stats["contexted"], other.stats["sited"]) == (0, 12)

    # the night's row: the file's scores on the predictor, the run read with its stacks
    config = policies.LayerGuidedConfig(table=True, proof=0, peak=None)
    hits = {}
    for name, scores, frames in (
        ("v4", s4, FRAMES),
        ("v3", s3, FRAMES),
        ("v4 without stacks", s4, None),
    ):
        run = ScoredRun.of(t, "w", "r", frames)
        frame, notes = replay_events(run, [config], Predictor(class_scores=scores), horizon=1)
        hits[name] = int(frame["hits"].iloc[0])
        assert any("no stacks" in n for n in notes) == (name == "v4 without stacks")
    # kept context-1 blocks serve the next (context 2) request; context 2's are never kept
    assert hits["v4"] == core.stats["hits"] == 6
    assert hits["v3"] == hits["v4 without stacks"] == 11


def test_a_format_3_table_replays_as_before_with_or_without_stacks(tmp_path):
    """GIVEN the same run and table in format 3 (no context entries) THEN the night's replay
    is the same with the run's stacks as without them, and is the replay of the site entries
    alone (every free answered by its site: kept)."""
    t, _ = _run()
    _, v3, _, _ = _tables(t)
    s3 = table_file_scores(write_layer_table(tmp_path / "v3.hcltab", v3, 1))
    config = policies.LayerGuidedConfig(table=True, proof=0, peak=None)
    with_stacks, _ = replay_events(
        ScoredRun.of(t, "w", "r", FRAMES), [config], Predictor(class_scores=s3), horizon=1
    )
    without, _ = replay_events(
        ScoredRun.of(t, "w", "r"), [config], Predictor(class_scores=s3), horizon=1
    )
    assert with_stacks.equals(without)
    core = replay(t, LayerPolicy(policy="guided", proof=0, peak=None), class_scores=s3)
    assert (core.stats["sited"], core.stats["contexted"]) == (12, 0)
    assert int(with_stacks["hits"].iloc[0]) == core.stats["hits"]
