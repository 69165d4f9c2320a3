"""Training and evaluation end to end on a small synthetic events dataset (tiny model)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("keras")

from tasks.learning.nextcall.training import checkpoint_dir, fit_model  # noqa: E402
from tasks.learning.outcome import TrainOutcome  # noqa: E402
from tasks.learning.questions.hedge import HEDGED  # noqa: E402
from tasks.learning.questions.lifetime import NETWORK_SURVIVAL, SURVIVAL  # noqa: E402
from tasks.learning.scores import BASELINES, MODEL, MODELS, OVERALL
from tasks.learning.split import load_split  # noqa: E402
from tasks.learning.train import evaluate, train  # noqa: E402
from tasks.replay.workloads import load_catalog  # noqa: E402
from tests.tasks.learning.tiny_training import tiny_train_config  # noqa: E402

# the tests marked `backends` (a model trained, scored, resumed) run under every Keras backend
# (`make test`: TensorFlow, then JAX); the two that check backend-free code (the counters without
# the questions' network, the cross-fitted tables in numpy) run once
pytestmark = pytest.mark.slow


@pytest.mark.backends
def test_train_and_evaluate_give_a_complete_outcome(events_root, tmp_path):
    cfg = tiny_train_config(tmp_path / "ckpt")
    trained = train.fn(events_root, cfg, load_catalog(cfg.data.catalog))
    outcome = evaluate.fn(trained)
    assert isinstance(outcome, TrainOutcome)
    ev = outcome.evaluation
    for table, slices in (
        ("unseen_runs", ["alpha", "beta", OVERALL]),
        # gamma is held out and runs a program no training run comes from (the synthetic
        # workloads are not in the catalog: each is its own program)
        ("unseen_programs", ["gamma", OVERALL]),
    ):
        for s in slices:
            n = {ev.get(p, s, table).positions for p in (*MODELS, *BASELINES)}
            assert len(n) == 1 and n.pop() > 0  # the same positions for every predictor
    assert 1 <= ev.get("ngram").detail["order"] <= 4
    assert np.isfinite(ev.margin_over_best_baseline())
    assert outcome.dataset.eval_runs == (("alpha", "r2"), ("beta", "r1"))
    assert outcome.dataset.unseen_program_runs == (("gamma", "r0"), ("gamma", "r1"))
    assert outcome.dataset.heldout_runs == ()
    assert not any(s.table == "heldout_workloads" for s in ev.scores)
    assert ("beta", "r0") in outcome.dataset.validation_runs  # the thread tails of its train run
    assert outcome.dataset.token_histogram.sum() == outcome.dataset.train_tokens
    assert len(outcome.history["loss"]) == 2 and "val_loss" in outcome.history
    assert outcome.predictions_per_second > 0
    assert outcome.input_example.shape == (1, 10) and outcome.input_example.dtype == np.int32
    assert any("only two runs" in n for n in outcome.notes)
    # the allocator's questions: three baselines each, on the same positions of the same tables
    q: dict[tuple[str, str, str], set] = {}
    for s in outcome.question_scores:
        q.setdefault((s.question, s.table, s.slice), set()).add(
            (s.positions, s.positions_without_site)
        )
        assert 0.0 <= s.top1 <= 1.0 and np.isfinite(s.log_loss)
    assert set(q) == {
        (question, table, sl)
        for question in ("reuse", "lifetime_calls", "lifetime_time")
        for table, sl in (
            ("unseen_runs", "alpha"), ("unseen_runs", "beta"), ("unseen_runs", OVERALL),
            ("unseen_programs", "gamma"), ("unseen_programs", OVERALL),
        )
    }  # fmt: skip
    for facts in q.values():
        ((frees, no_site),) = facts  # one count per question, table and slice
        assert frees > 0 and no_site == frees  # synthetic traces have no callers
    # the questions' network answers all three, and the layer's table distilled from it answers
    # the reuse question
    by_question = {}
    for s in outcome.question_scores:
        by_question.setdefault(s.question, set()).add(s.predictor)
    # the counters on the calling context too (here without stacks: as the call-site ones)
    context = {"context_online", "context_table"}
    assert by_question["reuse"] == {
        "majority",
        "class_online",
        "site_online",
        "table",
        "network",
        HEDGED,
        *context,
    }
    for q in ("lifetime_calls", "lifetime_time"):
        # and the lifetime's censoring-aware counter, alone and from the network's answer
        assert by_question[q] == {
            "majority", "class_online", "site_online", SURVIVAL, "network", NETWORK_SURVIVAL,
            HEDGED, *context, "context_survival",
        }  # fmt: skip
    assert all(np.isfinite(s.log_loss) for s in outcome.question_scores)
    assert [a.table for a in outcome.table_agreement] == ["unseen_runs", "unseen_programs"]
    for a in outcome.table_agreement:
        assert a.positions > 0 and 0 < a.coverage <= 1 and 0 <= a.keep_agreement <= 1
        assert a.against == "network"
    assert outcome.class_table is not None and outcome.class_table.covered().any()
    assert outcome.question_network is not None and outcome.question_network.train_calls > 0
    # the placement's lifetime table, distilled from the network's answers the training made
    # at every training allocation: what answering the trained network again on those runs,
    # as read from the root, gives (the synthetic runs have no call sites: no key either way;
    # the keys of real runs: tests/tasks/registry/test_lifetime_table.py)
    from tasks.dataset.events_reader import read_stack_frames
    from tasks.dataset.token_runs import head_rows
    from tasks.learning.questions.network import answered_inputs, distilled_lifetime
    from tasks.learning.questions.reuse import read_events

    inputs, answers = [], []
    for w, r in outcome.dataset.train_runs:
        events = head_rows(read_events(events_root, w, r), cfg.data.max_eval_tokens)
        frames = read_stack_frames(events_root, w, r)
        _, inp, said = answered_inputs(events, outcome.question_network.model, frames)
        inputs.append(inp)
        answers.append(said)
    keys, scores = distilled_lifetime(inputs, answers)
    assert outcome.lifetime_table is not None
    assert np.array_equal(outcome.lifetime_table[0], keys)
    assert np.array_equal(outcome.lifetime_table[1], scores)


def test_without_the_questions_network_the_counters_answer_and_the_table_follows_them(
    events_root, tmp_path
):
    cfg = tiny_train_config(tmp_path / "ckpt", questions={"network": False})
    outcome = evaluate.fn(train.fn(events_root, cfg, load_catalog(cfg.data.catalog)))
    assert outcome.question_network is None
    assert "network" not in {s.predictor for s in outcome.question_scores}
    assert {a.against for a in outcome.table_agreement} == {"class_online"}


@pytest.mark.backends
def test_a_killed_training_resumes_at_the_next_epoch(events_root, tmp_path):
    import keras

    cfg = tiny_train_config(tmp_path / "ckpt", epochs=3)
    split = load_split(events_root, cfg.data)
    ckpt = checkpoint_dir(events_root, cfg, split)

    class Kill(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("killed")

    class Epochs(keras.callbacks.Callback):
        seen: list[int] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.seen.append(epoch)

    # WHEN the first training dies after its first epoch
    with pytest.raises(RuntimeError, match="killed"):
        fit_model(cfg, split, ckpt, [Kill()], verbose=0)
    # THEN the same config resumes at epoch 2 (index 1) and the curves hold all three epochs
    epochs = Epochs()
    _, facts = fit_model(cfg, split, ckpt, [epochs], verbose=0)
    assert epochs.seen == [1, 2]
    assert facts["initial_epoch"] == 1
    assert len(facts["history"]["loss"]) == 3


@pytest.mark.backends
def test_windows_mode_trains_and_is_scored_on_the_same_positions(events_root, tmp_path):
    cfg = tiny_train_config(
        tmp_path / "ckpt",
        mode="windows",
        epochs=1,
        validation_windows=50,
        data={"workloads": ["alpha"]},
    )
    outcome = evaluate.fn(train.fn(events_root, cfg, load_catalog(cfg.data.catalog)))
    ev = outcome.evaluation
    assert ev.get(MODEL).positions == ev.get("ngram").positions > 0
    assert outcome.model.output_shape == (None, 64)


@pytest.mark.backends
def test_train_chunk_contexts_sets_the_sequence_training_chunk_length(events_root, tmp_path):
    from tasks.dataset.token_runs import concat_runs
    from tasks.learning.nextcall.chunks import train_chunks

    cfg = tiny_train_config(
        tmp_path / "ckpt", train_chunk_contexts=3, lr_schedule="cosine", clipnorm=1.0, epochs=1
    )
    split = load_split(events_root, cfg.data)
    _, facts = fit_model(cfg, split, tmp_path / "chunk-ckpt", verbose=0)
    assert facts["train_units"] == len(train_chunks(concat_runs(split.train), 30)[0])
    assert facts["predictions"] == (facts["steps_per_epoch"] - 2) * 8 * 30  # 2 untimed steps


@pytest.mark.backends
def test_ngram_hybrid_trains_and_is_scored_from_tokens_alone(events_root, tmp_path):
    cfg = tiny_train_config(
        tmp_path / "ckpt", model={"units": [8], "ngram_features": True, "ngram_order": 3}
    )
    trained = train.fn(events_root, cfg, load_catalog(cfg.data.catalog))
    assert trained.model.input_shape == (None, None)  # tokens only; the table is inside
    outcome = evaluate.fn(trained)
    ev = outcome.evaluation
    n = {ev.get(p, OVERALL, "unseen_runs").positions for p in (MODEL, *BASELINES)}
    assert len(n) == 1 and n.pop() > 0
    assert np.isfinite(ev.get(MODEL).log_loss)


def test_crossfit_features_come_from_the_other_workloads_table(events_root, tmp_path):
    from tasks.dataset.token_runs import concat_runs
    from tasks.learning.nextcall.model import NGramTable
    from tasks.learning.nextcall.training import (
        crossfit_features,
        training_features,
        training_tables,
    )

    cfg = tiny_train_config(
        tmp_path / "ckpt", model={"units": [8], "ngram_features": True, "ngram_crossfit": 0.5}
    )
    runs = load_split(events_root, cfg.data).train
    whole = concat_runs(runs)
    pos = whole.position_in_thread()
    table, others_ = training_tables(runs, whole, pos, cfg)
    loo = table.features(whole.tokens, pos, leave_one_out=True)
    fitted = NGramTable.fit(whole.tokens, pos, cfg.model.ngram_order)  # as fit gives it
    assert np.array_equal(loo, fitted.features(whole.tokens, pos, leave_one_out=True))
    feats = loo.copy()
    replaced = crossfit_features(feats, runs, cfg, others_)
    # about half the positions, in blocks, now hold what a table WITHOUT their workload says
    assert 0.2 * len(feats) < replaced < 0.8 * len(feats)
    changed = (feats != loo).any(axis=1)
    start = 0
    for r in runs:
        rows = slice(start, start + r.n_tokens)
        others = concat_runs([o for o in runs if o.workload != r.workload])
        out = NGramTable.fit(
            others.tokens, others.position_in_thread(), cfg.model.ngram_order
        ).features(r.tokens, r.position_in_thread(), leave_one_out=False)
        mine = feats[rows]
        took = (mine == out).all(axis=1)
        kept = (mine == loo[rows]).all(axis=1)
        assert (took | kept).all()  # every row is one or the other, never a mix
        start += r.n_tokens
    assert changed.any()
    # what training uses: each row looked up in its one table only, the same features
    got = training_features(table, others_, runs, whole, pos, cfg)
    assert np.array_equal(got, feats)
    rows = np.flatnonzero(changed)[::-3]  # any rows, in any order
    assert np.array_equal(table.features(whole.tokens, pos, True, rows=rows), loo[rows])
    # one training workload: nothing to cross-fit from
    single = [r for r in runs if r.workload == runs[0].workload]
    one = concat_runs(single)
    assert training_tables(single, one, one.position_in_thread(), cfg)[1] is None


@pytest.mark.backends
def test_an_online_hybrid_champion_is_rescored_exactly_as_it_was_scored(events_root, tmp_path):
    # GIVEN the default family (n-gram + online features, cross-fitted), trained and scored
    from tasks.registry.register import champion_rescorer

    cfg = tiny_train_config(
        tmp_path / "ckpt",
        model={
            "units": [8],
            "ngram_features": True,
            "ngram_order": 3,
            "ngram_crossfit": 0.5,
            "online_features": True,
        },
    )
    trained = train.fn(events_root, cfg, load_catalog(cfg.data.catalog))
    outcome = evaluate.fn(trained)
    # WHEN promotion re-scores it as a champion (its own config, as logged with it)
    again = champion_rescorer(cfg, trained.split)(trained.model, cfg.model_dump(mode="json"))
    # THEN the figures are the candidate's own on the table promotion compares, workload by
    # workload (like is compared with like); the model alone is scored, on that table alone
    for w in {s.slice for s in again.scores}:
        a, b = outcome.evaluation.get(MODEL, w, "unseen_runs"), again.get(MODEL, w, "unseen_runs")
        assert a.positions == b.positions > 0
        assert a.top1 == pytest.approx(b.top1) and a.log_loss == pytest.approx(b.log_loss, rel=1e-5)
    assert {(s.predictor, s.table) for s in again.scores} == {(MODEL, "unseen_runs")}
