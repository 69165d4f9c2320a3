"""Token sequences from an events dataset; chunks and scored positions; the split."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.config import ConfigError, load_config
from tasks.core.storage import Root
from tasks.dataset.synthetic_events import events_table, write_synthetic_events
from tasks.learning.sequences import (
    TokenRun,
    eval_chunks,
    eval_positions,
    head_rows,
    list_runs,
    load_split,
    plan_split,
    read_run,
    token_run,
    train_chunks,
    window_starts,
)
from tasks.learning.train_config import DEFAULT_CONFIG, QUICK_CONFIG, DataConfig, TrainConfig


@pytest.fixture(scope="module")
def events_root(tmp_path_factory) -> Root:
    root = Root.from_url(str(tmp_path_factory.mktemp("events")))
    write_synthetic_events(root, {"alpha": 3, "beta": 2, "gamma": 2}, tokens_per_run=2000)
    return root


def test_read_run_orders_threads_by_seq(tmp_path):
    # GIVEN a process whose rows are written shuffled
    import pyarrow.parquet as pq

    threads = [np.array([1, 2, 3, 4], np.uint8), np.array([40, 41], np.uint8)]
    table = events_table(threads, pid=7)
    table = table.take(np.array([5, 0, 3, 4, 1, 2]))
    root = Root.from_url(str(tmp_path))
    path = root.events_run("w", "r0")
    root.fs.makedirs(path)
    pq.write_table(table, f"{path}/part-0.parquet")
    # WHEN read
    run = read_run(root, "w", "r0")
    # THEN threads come back whole and in call order
    assert run.tokens.tolist() == [1, 2, 3, 4, 40, 41]
    assert run.offsets.tolist() == [0, 4, 6]
    assert list_runs(root) == {"w": ["r0"]}


def test_head_rows_are_the_rows_of_the_capped_token_run():
    # GIVEN two processes of two threads each, their rows interleaved as a trace writes them
    import pyarrow as pa

    rng = np.random.default_rng(3)
    a = events_table([rng.integers(0, 64, 50), rng.integers(0, 64, 30)], pid=7)
    b = events_table([rng.integers(0, 64, 40), rng.integers(0, 64, 20)], pid=3)
    table = pa.concat_tables([a, b]).take(rng.permutation(140))
    whole = token_run(table, "w", "r")
    for cap in (1, 39, 40, 75, 139):
        # WHEN the rows are capped as the evaluation caps the tokens
        rows = head_rows(table, cap)
        # THEN their tokens are exactly the capped run's (threads whole in order, the last cut),
        # in the table's own row order
        capped = token_run(rows, "w", "r")
        np.testing.assert_array_equal(capped.tokens, whole.head(cap).tokens)
        np.testing.assert_array_equal(capped.offsets, whole.head(cap).offsets)

        def keys(t):
            return list(zip(*(t.column(c).to_pylist() for c in ("pid", "thread", "seq"))))

        where = {k: i for i, k in enumerate(keys(table))}
        at = [where[k] for k in keys(rows)]
        assert at == sorted(at)
    assert head_rows(table, 140) is table and head_rows(table, None) is table


def test_train_chunks_cover_every_target_once():
    run = TokenRun("w", "r", np.arange(37, dtype=np.uint8), np.array([0, 5, 25, 37]))
    starts, first = train_chunks(run, 4)
    covered = np.zeros(37, int)
    for s, f in zip(starts, first):  # a handful of chunks in a test
        covered[s + 1 + f : s + 5] += 1
    # every token but each thread's first is a target exactly once
    expect = np.ones(37, int)
    expect[[0, 5, 25]] = 0
    assert covered.tolist() == expect.tolist()
    assert np.all(starts + 5 <= np.repeat(run.offsets[1:], [1, 5, 3]))


def test_short_threads_give_no_training_chunk():
    run = TokenRun("w", "r", np.zeros(8, np.uint8), np.array([0, 3, 8]))
    starts, _ = train_chunks(run, 4)
    assert starts.tolist() == [3]
    assert window_starts(run, 4).tolist() == [3]


def test_eval_chunks_score_exactly_the_eval_positions_with_full_context():
    run = TokenRun("w", "r", np.zeros(250, np.uint8), np.array([0, 1, 30, 250]))
    c = 10
    starts, lo, hi = eval_chunks(run, c)
    scored = np.concatenate([s + 1 + np.arange(a, b) for s, a, b in zip(starts, lo, hi)])
    assert scored.tolist() == eval_positions(run).tolist()
    pos_in = run.position_in_thread()
    in_view = np.concatenate([1 + np.arange(a, b) for a, b in zip(lo, hi)])
    assert np.all(in_view >= np.minimum(pos_in[scored], c))
    assert np.all(in_view <= 2 * c)


def test_split_default_rule(events_root):
    plan = plan_split(list_runs(events_root), DataConfig(heldout_workloads=["gamma"]))
    assert plan["alpha"] == {
        "train": ["r0"],
        "validation": ["r1"],
        "evaluation": ["r2"],
        "heldout": [],
        "unseen": [],
    }
    assert plan["beta"]["train"] == ["r0"] and plan["beta"]["validation"] == []
    # gamma runs a program of its own, trained nowhere: its runs are an unseen program's
    assert plan["gamma"]["unseen"] == ["r0", "r1"] and plan["gamma"]["heldout"] == []
    # the same workload as a second script of alpha's program: a held-out workload
    plan = plan_split(
        list_runs(events_root), DataConfig(heldout_workloads=["gamma"]), {"gamma": "alpha"}
    )
    assert plan["gamma"]["heldout"] == ["r0", "r1"] and plan["gamma"]["unseen"] == []


def test_heldout_programs_hold_out_every_workload_of_the_program(events_root):
    # GIVEN beta and gamma run one program, "interp"
    programs = {"alpha": "alpha", "beta": "interp", "gamma": "interp"}
    plan = plan_split(list_runs(events_root), DataConfig(heldout_programs=["interp"]), programs)
    # THEN neither is trained on, and both are scored as an unseen program
    assert plan["alpha"]["train"] and not plan["beta"]["train"] and not plan["gamma"]["train"]
    assert plan["beta"]["unseen"] and plan["gamma"]["unseen"]


def test_heldout_programs_bad_input_is_named_before_training():
    runs = {"alpha": ["a", "b"], "beta": ["a", "b"], "gamma": ["a", "b"]}
    programs = {"alpha": "alpha", "beta": "interp", "gamma": "interp"}
    # a held-out program that no workload runs
    with pytest.raises(ValueError, match=r"data.heldout_programs: \['perl'\]"):
        plan_split(runs, DataConfig(heldout_programs=["perl"]), programs)
    # a held-out program whose workload is also listed for training
    with pytest.raises(ValueError, match=r"data.workloads lists \['beta'\]"):
        plan_split(
            runs, DataConfig(workloads=["alpha", "beta"], heldout_programs=["interp"]), programs
        )
    # every program held out: nothing left to train on
    with pytest.raises(ValueError, match="no workload left to train on"):
        plan_split(runs, DataConfig(heldout_programs=["alpha", "interp"]), programs)


def test_split_refuses_a_named_single_run_workload_and_unknown_workloads():
    with pytest.raises(ValueError, match="only run"):
        plan_split({"solo": ["a"]}, DataConfig(workloads=["solo"]))
    with pytest.raises(ValueError, match="not in the events dataset"):
        plan_split({"solo": ["a", "b"]}, DataConfig(heldout_workloads=["nope"]))


def test_a_single_run_workload_chosen_automatically_is_held_out():
    # GIVEN an ad-hoc trace (one run) next to a workload with two runs
    plan = plan_split({"adhoc": ["20261122T0400"], "sqlite3": ["medium", "small"]}, DataConfig())
    # THEN the training goes on, and the single run is scored as an unseen program
    assert plan["sqlite3"]["train"] == ["medium"] and plan["sqlite3"]["evaluation"] == ["small"]
    assert plan["adhoc"] == {
        "train": [],
        "validation": [],
        "evaluation": [],
        "heldout": [],
        "unseen": ["20261122T0400"],
    }
    with pytest.raises(ValueError, match="no workload left to train on"):
        plan_split({"adhoc": ["x"]}, DataConfig())


def test_load_split_cuts_validation_from_thread_tails_and_caps(events_root):
    cfg = DataConfig(heldout_workloads=["gamma"], max_train_tokens=1500, max_eval_tokens=500)
    split = load_split(events_root, cfg)
    names = {r.name for r in split.validation}
    assert names == {"alpha/r1", "beta/r0[tail]"}
    assert split.train_tokens <= 1500
    assert all(r.n_tokens <= 500 for r in split.evaluation + split.heldout)
    assert any("only two runs" in n for n in split.notes)
    assert split.token_histogram().sum() == split.train_tokens
    assert len(split.content_hash()) == 32


def test_split_tail_keeps_time_order():
    run = TokenRun("w", "r", np.arange(30, dtype=np.uint8), np.array([0, 10, 30]))
    head, tail = run.split_tail(0.1)
    assert tail.tokens.tolist() == [9, 28, 29]
    assert head.offsets.tolist() == [0, 9, 27]


def test_train_configs_validate_and_typos_name_the_field(tmp_path):
    assert load_config(TrainConfig, DEFAULT_CONFIG).context == 100
    assert load_config(TrainConfig, QUICK_CONFIG).data.max_train_tokens
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  unit: [3]\n")
    with pytest.raises(ConfigError, match="model.unit"):
        load_config(TrainConfig, bad)
    bad.write_text("data:\n  workloads: [a]\n  heldout_workloads: [a]\n")
    with pytest.raises(ConfigError, match="both trained on and held out"):
        load_config(TrainConfig, bad)


def test_a_catalog_heldout_missing_tonight_is_noted_and_the_rest_is_evaluated(events_root):
    # GIVEN held-out names the catalog knows (perl, numpy_stack) but tonight's data lacks
    # (their replays failed), next to one that is there (gamma)
    cfg = DataConfig(heldout_programs=["perl"], heldout_workloads=["numpy_stack", "gamma"])
    split = load_split(events_root, cfg)
    # THEN the night still trains and evaluates; each missing name is said, gamma is scored
    assert {r.workload for r in split.unseen_programs} == {"gamma"}
    said = "\n".join(split.notes)
    assert "held-out program perl" in said and "held-out workload numpy_stack" in said
    # AND a name that the catalog does not know either is still an error naming it
    with pytest.raises(ValueError, match="nope"):
        load_split(events_root, DataConfig(heldout_workloads=["nope"]))
