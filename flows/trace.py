"""Flow `trace`: build the tracer and the images, replay the catalog (or a subset), summarize.

python -m flows.trace                    # the whole catalog, runner auto
python -m flows.trace --quick --runner local
"""

from __future__ import annotations

import argparse

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="replay workloads with the heapcast tracer")
    ap.add_argument("workloads", nargs="*", help="workload names (default: all)")
    ap.add_argument("--quick", action="store_true", help="only the quick inputs")
    ap.add_argument("--runner", choices=["auto", "docker", "local"], default="auto")
    ap.add_argument("--root", default=None, help="data root (fsspec URL)")
    ap.add_argument("--max-parallel", type=int, default=2)
    a = ap.parse_args()
    p = dict(
        workloads=a.workloads or None, quick=a.quick, runner=a.runner, max_parallel=a.max_parallel
    )
    if a.root:
        p["root"] = a.root
    s = trace(TraceParams(**p))
    print(s.markdown())
    raise SystemExit(1 if s.failed else 0)
