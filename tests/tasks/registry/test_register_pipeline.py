"""Registration of real training outcomes, and a champion re-scored by the real evaluation.

GIVEN a windows-mode model trained on data A and registered (the champion)
WHEN a sequence-mode model trained on data B is registered with champion_rescorer
THEN the champion is re-evaluated on B's unseen runs (tasks.learning.train.score_model_on_unseen_runs),
with its own model shape (windows mode, from its logged config), and the decision compares the two on B.
"""

from __future__ import annotations

import pytest

from tasks.core.storage import Root  # noqa: E402
from tasks.dataset.synthetic_events import write_synthetic_events  # noqa: E402
from tasks.learning.train import evaluate, train  # noqa: E402
from tasks.learning.train_config import TrainConfig  # noqa: E402
from tasks.registry.register import champion_rescorer, register_outcome  # noqa: E402
from tasks.registry.tracking import TrackingConfig  # noqa: E402
from tasks.replay.workloads import load_catalog  # noqa: E402
from tests.tasks.learning.tiny_training import tiny_train_config  # noqa: E402

pytestmark = pytest.mark.integration


def tiny(mode: str, ckpt) -> TrainConfig:
    """One epoch of two steps in `mode`."""
    return tiny_train_config(ckpt, mode=mode, epochs=1, steps_per_epoch=2, ngram={"max_order": 3})


def trained_on(root: Root, cfg: TrainConfig):
    t = train.fn(root, cfg, load_catalog(cfg.data.catalog))
    return t, evaluate.fn(t)


def test_real_outcomes_register_and_the_champion_is_rescored_on_new_data(tmp_path):
    tracking = TrackingConfig(root=str(tmp_path / "store"))
    root_a = Root.from_url(str(tmp_path / "a"))
    write_synthetic_events(root_a, {"alpha": 3, "beta": 2, "gamma": 2}, tokens_per_run=2000)
    cfg_a = tiny("windows", tmp_path / "ck-a")
    t_a, out_a = trained_on(root_a, cfg_a)
    first = register_outcome(out_a, tracking, evaluate_model=champion_rescorer(cfg_a, t_a.split))
    assert (first.decision, first.champion_version) == ("first", "1")

    root_b = Root.from_url(str(tmp_path / "b"))
    write_synthetic_events(root_b, {"alpha": 3, "beta": 2, "gamma": 2}, tokens_per_run=1500)
    cfg_b = tiny("sequence", tmp_path / "ck-b")
    t_b, out_b = trained_on(root_b, cfg_b)
    assert out_b.dataset.content_hash != out_a.dataset.content_hash
    calls = []
    rescore = champion_rescorer(cfg_b, t_b.split)

    def counted(model, champion_config):
        calls.append(champion_config["mode"])
        return rescore(model, champion_config)

    second = register_outcome(out_b, tracking, evaluate_model=counted)
    assert calls == ["windows"]  # re-scored once, with the champion's own mode
    assert second.decision in ("promoted", "kept") and second.champion_score is not None
    assert "(re-evaluated)" in second.reason
    assert second.promoted == (second.candidate_score > second.champion_score)

    from mlflow import MlflowClient

    run = MlflowClient().get_run(second.run_id)
    assert run.data.params["promotion.champion_reevaluated"] == "true"
    assert run.data.metrics["headline/unseen_runs.top1.model"] == pytest.approx(
        second.candidate_score
    )
    assert len(MlflowClient().get_metric_history(second.run_id, "train/loss")) == len(
        out_b.history["loss"]
    )
