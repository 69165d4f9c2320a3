"""Flow `trace`: build the tracer and the images, replay the catalog (or a subset), summarize.

python -m flows.trace                    # the whole catalog, runner auto (or `heapcast replay`)
python -m flows.trace --quick --runner local
python -m flows.trace --help             # the flow's parameters (flows/command_line.py)
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows.command_line import fields, parameters
from flows.command_line import trace_parser as build_parser
from tasks.core.config import ConfigError
from tasks.core.storage import Root
from tasks.format.build import build_tracer
from tasks.replay.images import build_images
from tasks.replay.replays import TraceSummary, replay_all, report_replays
from tasks.replay.runners.select import resolve_runner_kind
from tasks.replay.workloads import Catalog, TraceParams, load_catalog


def replay_catalog(params: TraceParams, root: Root, catalog: Catalog) -> TraceSummary:
    """Replay the selected workloads with the tracer preloaded; one failure fails only its run."""
    log = get_run_logger()
    pairs = catalog.select(params.workloads, quick=params.quick)
    kind, why = resolve_runner_kind(params.runner)
    log.info(why)
    tracer = str(build_tracer())
    if kind == "docker":
        build_images(catalog.images(params.workloads, quick=params.quick))
    futures = replay_all(
        pairs,
        params.max_parallel,
        tracer=tracer,
        root=root,
        runner=kind,
        caller=params.caller,
        frames=params.stack_frames,
    )
    return report_replays(pairs, futures, runner=kind, runner_reason=why, tracer=tracer, root=root)


RUNNER = ThreadPoolTaskRunner(max_workers=16)

# The same flow for a caller that has resolved the root and read the catalog already (the
# nightly): Prefect records it as the `trace` subflow, and nothing is resolved twice.
trace_with = flow(name="trace", task_runner=RUNNER)(replay_catalog)


@flow(name="trace", task_runner=RUNNER)
def trace(params: TraceParams = TraceParams()) -> TraceSummary:
    """Replay the selected workloads with the tracer preloaded; one failure fails only its run."""
    # the parameters' strings resolved once, here; the tasks take the Root and the Catalog
    return replay_catalog(params, Root.from_url(params.root), load_catalog(params.catalog))


def run(args: argparse.Namespace) -> int:
    """The flow with `build_parser`'s arguments; 1 when a replay failed."""
    params = parameters(TraceParams, fields(args, set(TraceParams.model_fields)), args.prog)
    try:  # the catalog and the workloads named, checked before the flow starts
        load_catalog(params.catalog).select(params.workloads, quick=params.quick)
    except (ConfigError, KeyError) as err:
        print(f"{args.prog}: {err.args[0] if isinstance(err, KeyError) else err}", file=sys.stderr)
        return 2
    s = trace(params)
    print(s.markdown())
    return 1 if s.failed else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
