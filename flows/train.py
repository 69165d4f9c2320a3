"""Flow `train`: train the next-call model, evaluate it honestly, register it, report.

Composition only: the work lives in tasks/train.py.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from tasks.config import default_root
from tasks.outcome import TrainOutcome
from tasks.register import champion_rescorer, register
from tasks.tracking import tracking_for
from tasks.train import evaluate, publish_evaluation, train
from tasks.train_config import DEFAULT_CONFIG, load_train_config


class TrainParams(BaseModel):
    """What a run of the flow is given; the training settings come from the config file."""

    root: str = Field(default_factory=default_root, description="data root (folder or s3:// URL)")
    config: str = Field(default=str(DEFAULT_CONFIG), description="training YAML (configs/train.yaml)")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="nested settings merged over the YAML, e.g. {'epochs': 2}"
    )


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
