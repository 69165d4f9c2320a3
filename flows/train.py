"""Flow `train`: train the next-call model, evaluate it honestly, register it, report.

Composition only: the work lives in tasks/learning/train.py.
"""

from __future__ import annotations

from prefect import flow

from tasks.core.storage import Root
from tasks.learning.outcome import TrainOutcome
from tasks.learning.train import evaluate, publish_evaluation, train
from tasks.learning.train_config import TrainParams, load_train_config
from tasks.registry.register import champion_rescorer, register
from tasks.registry.tracking import tracking_for


@flow(name="train")
def train_flow(params: TrainParams = TrainParams()) -> TrainOutcome:
    config = load_train_config(params.config, params.overrides)
    root = Root.from_url(params.root)  # resolved once; tasks take the Root
    trained = train(root, config)
    outcome = evaluate(trained)
    # The champion is re-scored on today's evaluation when its data differs (tasks/registry/champion.py).
    outcome.registration = register(
        outcome, tracking_for(root), evaluate_model=champion_rescorer(config, trained.split)
    )
    publish_evaluation(outcome)
    return outcome


if __name__ == "__main__":
    train_flow()
