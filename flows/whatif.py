"""Flow `whatif`: what allocator caching would have done with a model's predictions.

Replays a registered model's evaluation runs through the allocator cache policies (heuristics,
prediction-guided with the model and the online counter, causally, and with the freeing
thread's true future, named optimistic; and the oracle's bound); writes <root>/whatif/<model>-v<version>.parquet, logs `whatif.*` metrics and a Pareto
plot on the model's MLflow run, and publishes the `whatif` markdown artifact.

Composition only: the work lives in tasks/whatif/night.py.

python -m flows.whatif                   # the champion's evaluation runs (or `heapcast whatif`)
python -m flows.whatif --model 7 --run sqlite3/small
python -m flows.whatif --help            # the flow's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.command_line import fields, parameters
from flows.command_line import whatif_parser as build_parser
from tasks.core.config import ConfigError, read_yaml
from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel
from tasks.registry.tracking import TrackingConfig, tracking_for
from tasks.whatif.night import (
    WhatifParams,
    WhatifSummary,
    load_predictor,
    log_to_mlflow,
    model_ref,
    publish,
    replay_run,
    resolve_model,
    summarize,
    write_table,
)

# Two runs at once: a run's replay alternates TensorFlow (both cores, poorly: a recurrent step is
# small), numba kernels (nogil) and numpy, so a second run fills the gaps. The quick night's six
# runs: 100 s -> 88 s for the flow, the same table row for row (2 cores, idle).
RUNNER = ThreadPoolTaskRunner(max_workers=2)


def replay_for_model(
    params: WhatifParams, root: Root, tracking: TrackingConfig, model: RegisteredModel
) -> WhatifSummary:
    """The model's evaluation runs (or params.runs) through the policy grid; the summary."""
    ref = model_ref(model, params, tracking)
    predictor = load_predictor(ref)
    futures = [
        replay_run.submit(root, w, r, params, predictor, ref.max_eval_tokens) for w, r in ref.runs
    ]
    replays = [f.result() for f in futures]
    table = write_table(root, replays, ref)
    summary = summarize(replays, ref, params, table)
    log_to_mlflow(summary, replays, tracking)
    publish(summary)
    return summary


# The same flow for a caller that holds the resolved root, the tracking config and the
# registered model already (the nightly, with the version it registered tonight).
whatif_with = flow(name="whatif", task_runner=RUNNER)(replay_for_model)


@flow(name="whatif", task_runner=RUNNER)
def whatif(params: WhatifParams = WhatifParams()) -> WhatifSummary:
    """What allocator caching would have done with a registered model's predictions."""
    root = Root.from_url(params.root)  # resolved once, here; the tasks take the Root
    tracking = tracking_for(root)
    # the alias (or version) resolved once, here, to the registered model
    return replay_for_model(params, root, tracking, resolve_model(params, tracking))


def run(args: argparse.Namespace) -> int:
    """The flow with `build_parser`'s arguments; 1 when a run could not be replayed."""
    values = fields(args, set(WhatifParams.model_fields) - {"policies"})
    if "policies" in args:
        try:
            values["policies"] = read_yaml(args.policies, "policy grid (a YAML list)")
        except ConfigError as err:
            print(f"{args.prog}: --policies: {err}", file=sys.stderr)
            return 2
    s = whatif(parameters(WhatifParams, values, args.prog))
    print(s.markdown)
    return 1 if s.runs_failed else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
