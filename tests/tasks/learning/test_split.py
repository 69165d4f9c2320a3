"""The split: which runs train, which validate, which are scored, by the config's rule."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.config import ConfigError, load_config
from tasks.dataset.token_runs import (
    TokenRun,
    list_runs,
    read_run,
    thread_key,
)
from tasks.learning.split import load_split, plan_split, read_training_data
from tasks.learning.train_config import DEFAULT_CONFIG, QUICK_CONFIG, DataConfig, TrainConfig
from tasks.replay.workloads import load_catalog


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


def test_a_training_reads_the_questions_events_of_its_trained_and_scored_runs(events_root):
    # GIVEN a split with a validation run (alpha/r1), a cut one (beta/r0) and capped scored runs
    cfg = DataConfig(heldout_workloads=["gamma"], max_train_tokens=1500, max_eval_tokens=500)
    # WHEN a training reads all it needs at once
    data = read_training_data(events_root, cfg, load_catalog(cfg.catalog))
    # THEN the split is load_split's, and the events are those of each run the questions learn
    # from or are scored on (never a validation run), whole runs cut to max_eval_tokens calls
    assert data.split.content_hash() == load_split(events_root, cfg).content_hash()
    assert sorted(data.events) == data.split.question_runs()
    assert ("alpha", "r1") not in data.events and ("beta", "r0") in data.events
    for (w, r), t in data.events.items():
        assert t.num_rows == min(500, read_run(events_root, w, r).n_tokens)
    # AND a scored run's events are the calls its tokens are: as many in each thread
    for run in data.split.evaluation + data.split.unseen_programs:
        _, per_thread = np.unique(
            thread_key(data.events[(run.workload, run.run)]), return_counts=True
        )
        assert per_thread.tolist() == run.thread_lengths().tolist()


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


def test_a_split_read_with_stacks_holds_each_runs_calls_stacks_beside_its_tokens(events_root):
    # GIVEN the split of the test above, read with each call's stack
    cfg = DataConfig(heldout_workloads=["gamma"], max_train_tokens=1500, max_eval_tokens=500)
    split = load_split(events_root, cfg.model_copy(update={"call_stacks": True}))
    # THEN every run, the cut ones too, holds its stacks, one row a call
    runs = split.train + split.validation + split.evaluation + split.heldout + split.unseen_programs
    assert runs and all(r.stacks is not None and len(r.stacks.rows) == r.n_tokens for r in runs)
    # and the tokens are the split's without them; a split read without holds none
    plain = load_split(events_root, cfg)
    every = plain.train + plain.validation + plain.evaluation + plain.heldout
    assert all(r.stacks is None for r in every) and plain.content_hash() == split.content_hash()


def test_a_config_without_the_stack_keeps_its_fingerprint():
    # the checkpoints of a config from before model.frame_depth still resume: frame_depth 0
    # is not in what is hashed
    import hashlib
    import json

    cfg = TrainConfig()
    payload = cfg.model_dump(mode="json", exclude={"checkpoint_dir"})
    del payload["model"]["frame_depth"], payload["data"]["call_stacks"]
    before = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert cfg.fingerprint() == before
    stack = TrainConfig.model_validate({"model": {"frame_depth": 8}})
    assert stack.fingerprint() != before
    # and a network that reads the stack gets its runs read with their stacks, unasked
    assert stack.data.call_stacks and not cfg.data.call_stacks
