"""Flow `train`: train the next-call model, evaluate it honestly, register it, report.

Composition only: the work lives in tasks/train.py.
"""

from __future__ import annotations

from prefect import flow

from tasks.outcome import TrainOutcome
from tasks.register import champion_rescorer, register
from tasks.tracking import tracking_for
from tasks.train import evaluate, publish_evaluation, train
from tasks.train_config import TrainParams, load_train_config


@flow(name="train")
def train_flow(params: TrainParams = TrainParams()) -> TrainOutcome:
    config = load_train_config(params.config, params.overrides)
    trained = train(params.root, config)
    outcome = evaluate(trained)
    # The champion is re-scored on today's evaluation when its data differs (tasks/champion.py).
    register(outcome, tracking_for(params.root),
             evaluate_model=champion_rescorer(config, trained.split))
    publish_evaluation(outcome)
    return outcome


if __name__ == "__main__":
    train_flow()
