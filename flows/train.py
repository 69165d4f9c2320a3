"""Flow `train`: train the next-call model, evaluate it honestly, report its data, register it.

Composition only: the work lives in tasks/learning/train.py, tasks/report/night_reports.py (the heap
report of the training data, handed to registration as a file) and tasks/registry/register.py.

python -m flows.train                    # configs/train.yaml (or `heapcast train`)
python -m flows.train --quick --set epochs=2
python -m flows.train --help             # the flow's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from prefect import flow

from flows.command_line import fields, nested, parameters
from flows.command_line import train_parser as build_parser
from tasks.core.config import ConfigError
from tasks.core.storage import Root
from tasks.learning.outcome import TrainResult
from tasks.learning.train import evaluate, publish_evaluation, train
from tasks.learning.train_config import QUICK_CONFIG, TrainParams, load_train_config
from tasks.registry.register import champion_rescorer, register
from tasks.registry.tracking import TrackingConfig, tracking_for
from tasks.replay.workloads import load_catalog
from tasks.report.night_reports import report_training_run


def train_and_register(params: TrainParams, root: Root, tracking: TrackingConfig) -> TrainResult:
    """Train, evaluate, report the training data, register; the outcome and the registered
    model."""
    config = load_train_config(params.config, params.overrides)
    trained = train(root, config, load_catalog(config.data.catalog))
    outcome = evaluate(trained)
    # the page lives until registration has logged it
    with tempfile.TemporaryDirectory(prefix="heapcast-train-report-") as folder:
        page = report_training_run(root, outcome.dataset, Path(folder))
        # The champion is re-scored on today's evaluation when its data differs
        # (tasks/registry/champion.py).
        model = register(
            outcome,
            tracking,
            page.path,
            page.error,
            evaluate_model=champion_rescorer(config, trained.split),
        )
    publish_evaluation(outcome)
    return TrainResult(outcome, model)


# The same flow for a caller that has resolved the root and the tracking config (the nightly).
train_with = flow(name="train")(train_and_register)


@flow(name="train")
def train_flow(params: TrainParams = TrainParams()) -> TrainResult:
    """Train, evaluate, report the training data, register."""
    root = Root.from_url(params.root)  # resolved once, here; the tasks take the Root
    return train_and_register(params, root, tracking_for(root))


def run(args: argparse.Namespace) -> int:
    """The flow with `build_parser`'s arguments."""
    values = fields(args, {"root", "config"})
    if getattr(args, "quick", False):
        values["config"] = str(QUICK_CONFIG)
    if "overrides" in args:
        values["overrides"] = nested(args.overrides)
    params = parameters(TrainParams, values, args.prog)
    try:  # the training config and the --set settings, checked before the flow starts
        load_train_config(params.config, params.overrides)
    except ConfigError as err:
        print(f"{args.prog}: {err}", file=sys.stderr)
        return 2
    result = train_flow(params)
    m = result.model
    decision = f": {m.decision} ({m.reason})" if m.decision else ""
    print(f"registered {m.name} version {m.version}{decision}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
