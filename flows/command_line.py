"""Each flow's command line: the one parser `python -m flows.X` and `heapcast X` both read.

A parser's options are its flow's parameters, the fields of the pydantic model a Prefect
deployment takes (`--max-parallel` is `max_parallel`), under the same names. An option left out
is left out of the model, so its default is the model's. Each flow module re-exports its parser
as `build_parser` and has `run(args)` (the parameters built from the parsed arguments, the flow,
its exit code) and `main(argv)` (both), which its `__main__` block calls.

Light on purpose (argparse and yaml, no Prefect, no flow module): `--help` and a bad argument end
here, before a flow module's imports (TensorFlow, for `train`, takes seconds), and `heapcast`
parses with these parsers before it imports the flow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tasks.format.stack_depth import DEFAULT_FRAMES, FRAMES_MAX

RUNNERS = ("auto", "docker", "local")
ROOT_HELP = "data root: a folder or an s3:// URL (default $HEAPCAST_ROOT, else ./data)"


def _at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if n < low or (high is not None and n > high):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {span}, not {n}")
        return n

    return parse


def key_value(text: str) -> tuple[list[str], Any]:
    """KEY=VALUE (KEY dotted, VALUE read as YAML) as (the key's parts, the value)."""
    key, sep, value = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. epochs=2, not {text!r}")
    try:
        return key.split("."), yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not valid YAML: {err}") from None


def nested(pairs: list[tuple[list[str], Any]] | None, into: dict | None = None) -> dict:
    """`key_value` pairs as a nested dict, merged over `into` (a copy; later pairs win)."""
    out = _copy(into or {})
    for parts, value in pairs or []:
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        node[parts[-1]] = value
    return out


def _copy(d: dict) -> dict:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def _examples(prog: str, *lines: tuple[str, str]) -> str:
    """An epilog of examples, each a command line and, below it, what it does."""
    out = ["examples:"]
    for args, what in lines:
        out += [f"  {prog} {args}".rstrip(), f"      {what}"]
    return "\n".join(out)


def _parser(prog: str, description: str, epilog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # options left out stay out of the namespace: the parameters' model gives their defaults
        argument_default=argparse.SUPPRESS,
    )
    p.set_defaults(prog=prog)  # the program's name (`heapcast replay`), for `run`'s messages
    return p


def _flow_parser(
    prog: str, description: str, *examples: tuple[str, str]
) -> argparse.ArgumentParser:
    """A flow's parser: what it does, and its examples (command line, what it does) below."""
    return _parser(prog, description, _examples(prog, *examples))


def _catalog_options(p: argparse.ArgumentParser, quick: str, runs: str) -> None:
    """The catalog's workloads to run (default all), --quick, --runner (where `runs` run),
    --root and --catalog."""
    p.add_argument("workloads", nargs="*", help="workload names of the catalog (default: all)")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--runner", choices=RUNNERS, help=f"where {runs} run (default auto)")
    _root(p)
    p.add_argument("--catalog", metavar="FILE", help="catalog (default configs/workloads.yaml)")


def _root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", metavar="URL", help=ROOT_HELP)


def trace_parser(prog: str = "python -m flows.trace") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "Replay the catalog's workloads (configs/workloads.yaml) with the tracer preloaded, each\n"
        "run into <root>/raw/<workload>/<run>/; a summary of the runs (flow `trace`). To trace\n"
        "one program of your own, `heapcast trace -- PROGRAM` does.",
        ("", "the whole catalog, runner auto"),
        ("--quick --runner local", "the quick inputs, replayed here, without containers"),
        ("sqlite3 git --no-caller", "two workloads, without the return addresses"),
        ("perl --frames 8", "perl, its call stacks 8 frames deep (default 32)"),
    )
    _catalog_options(p, "only the quick inputs (small)", "replays")
    p.add_argument(
        "--max-parallel", type=_at_least(1, 16), metavar="N", help="replays at once (default 2)"
    )
    p.add_argument(
        "--caller",
        action=argparse.BooleanOptionalAction,
        help="record each call's return address (default: on)",
    )
    p.add_argument(
        "--frames",
        type=_at_least(0, FRAMES_MAX),
        metavar="N",
        help=f"record each allocation's call stack, up to N frames (default {DEFAULT_FRAMES}; "
        "0: the caller only; a workload's own `frames` caps it)",
    )
    return p


def dataset_parser(prog: str = "python -m flows.dataset") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "Convert every raw run without up-to-date events (or those named) into the Parquet\n"
        "events dataset, <root>/events/workload=<w>/run=<r>/ (flow `dataset`, on Dask).",
        ("", "every run under <root>/raw without up-to-date events"),
        ("sqlite3 --force", "every run of sqlite3, again"),
        ("--run git/medium --scheduler tcp://HOST:8786", "one run, on a Dask cluster"),
    )
    p.add_argument("workloads", nargs="*", help="only these workloads (default: all)")
    p.add_argument(
        "--run",
        dest="runs",
        action="append",
        metavar="RUN",
        help="only this run: RUN or WORKLOAD/RUN (repeat for more)",
    )
    _root(p)
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Dask scheduler (default $HEAPCAST_DASK_SCHEDULER, else a local cluster)",
    )
    p.add_argument(
        "--force", action="store_true", help="convert even runs whose events are up to date"
    )
    return p


def train_parser(prog: str = "python -m flows.train") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "Train the next-call model on the events dataset, evaluate it on unseen runs against\n"
        "the baselines, report its data, register it in MLflow (flow `train`).",
        ("", "configs/train.yaml"),
        ("--quick --set epochs=2", "configs/train-quick.yaml, for 2 epochs"),
    )
    _root(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--config", metavar="FILE", help="training config (default configs/train.yaml)"
    )
    which.add_argument(
        "--quick", action="store_true", help="configs/train-quick.yaml (small, for demos)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="a setting over the config's (KEY dotted, VALUE YAML: model.units=[8]); repeatable",
    )
    return p


def whatif_parser(prog: str = "python -m flows.whatif") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "Replay a registered model's evaluation runs through allocator cache policies\n"
        "(heuristics, guided by the model and by the online counter, the oracle's bound): what\n"
        "caching would have done with its predictions (flow `whatif`). Results under\n"
        "<root>/whatif/ and on the model's MLflow run.",
        ("", "the champion's evaluation runs"),
        ("--model 7 --run sqlite3/small", "version 7, on one run"),
        ("--policies grid.yaml", "a policy grid of your own (a YAML list of policies)"),
    )
    _root(p)
    p.add_argument(
        "--model", metavar="ALIAS|VERSION", help="the registered version (default champion)"
    )
    p.add_argument(
        "--run",
        dest="runs",
        action="append",
        metavar="WORKLOAD/RUN",
        help="replay this run (repeat for more; default: the model's evaluation runs)",
    )
    p.add_argument(
        "--horizon",
        type=_at_least(1),
        metavar="N",
        help="calls within which a prediction keeps a freed block (default 1: causal)",
    )
    p.add_argument(
        "--idle-budget",
        type=_at_least(1),
        metavar="BYTES",
        help="bytes held idle (time-weighted mean) at which the policies are compared "
        "(default 65536)",
    )
    p.add_argument(
        "--policies",
        metavar="FILE",
        help="the policy grid, a YAML list (default tasks.whatif.sweep.default_grid())",
    )
    p.add_argument(
        "--recompute",
        action="store_true",
        help="compute the model's answers here rather than read those logged with the version",
    )
    return p


def allocators_parser(prog: str = "python -m flows.allocators") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "Measure the catalog's workloads under glibc, jemalloc, tcmalloc, mimalloc and\n"
        "heapcast's layer side by side; recommend one allocator per workload (flow\n"
        "`allocators`). With --seeds, the layer's cases instead (flow `seed-cases`). For a\n"
        "program of your own, `heapcast tune -- PROGRAM` does.",
        ("", "every workload of the catalog"),
        ("sqlite3 --runner local", "one workload, run here, without containers"),
        ("--seeds --quick", "the layer's cases, fewer rounds"),
        ("--seeds --table-model 7", "the table-guided layer reading version 7's table"),
    )
    _catalog_options(p, "only the quick inputs' workloads", "runs")
    p.add_argument(
        "--config", metavar="FILE", help="allocators config (default configs/allocators.yaml)"
    )
    p.add_argument("--no-mlflow", dest="mlflow", action="store_false", help="log no MLflow run")
    p.add_argument(
        "--seeds",
        action="store_true",
        default=False,
        help="the layer's cases under the mallocs and the layer (flow `seed-cases`)",
    )
    p.add_argument(
        "--table-model",
        metavar="ALIAS|VERSION",
        help="the registered version whose table the table-guided layer reads (default champion)",
    )
    p.add_argument(
        "--table-file",
        metavar="FILE",
        help="a layer table file (native/TABLE.md) the table-guided layer reads instead of a "
        "registered version's, its model version from its header",
    )
    return p


def nightly_parser(prog: str = "python -m flows.nightly") -> argparse.ArgumentParser:
    p = _flow_parser(
        prog,
        "heapcast's whole pipeline, once (flow `nightly`): replay, dataset, train and register,\n"
        "the heap reports, whatif, then a summary.",
        ("--quick", "the quick subset, with the embedded services"),
        ("--root s3://bucket/heapcast", "the whole catalog, its data in a bucket"),
        (
            "--quick --param train.overrides.epochs=1 --param trace.max_parallel=4",
            "any parameter of a stage",
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="quick workload inputs and configs/train-quick.yaml",
    )
    _root(p)
    p.add_argument(
        "--runner", choices=RUNNERS, help="where replays and measurements run (default auto)"
    )
    p.add_argument("--allocators", action="store_true", help="also run the allocators stage, last")
    p.add_argument(
        "--seeds", action="store_true", help="also measure the layer's cases under the layer"
    )
    p.add_argument(
        "--reports-keep-nights",
        type=_at_least(1),
        metavar="N",
        help="heap report nights kept under <root>/reports/",
    )
    p.add_argument(
        "--param",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="any parameter of the night, dotted (trace.max_parallel=4, dataset.scheduler=..., "
        "train.overrides.epochs=1, allocators_params.config=FILE); repeatable",
    )
    return p


# name -> the flow's parser, for `heapcast NAME`
PARSERS: dict[str, Callable[[str], argparse.ArgumentParser]] = {
    "trace": trace_parser,
    "dataset": dataset_parser,
    "train": train_parser,
    "whatif": whatif_parser,
    "allocators": allocators_parser,
    "nightly": nightly_parser,
}


def fields(args: argparse.Namespace, names: set[str]) -> dict[str, Any]:
    """The parsed arguments that are fields of the flow's parameters (`names`), those given only;
    an empty list of workloads means all, the model's default."""
    out = {k: v for k, v in vars(args).items() if k in names}
    if out.get("workloads") == []:
        del out["workloads"]
    return out


M = TypeVar("M", bound=BaseModel)


def parameters(model: type[M], values: dict[str, Any], prog: str) -> M:
    """The flow's parameters; a value the model refuses ends the program as argparse would
    (exit 2), with a line per refused parameter naming it."""
    try:
        return model(**values)
    except ValidationError as err:
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(all)"
            print(f"{prog}: error: parameter {where}: {e['msg']}", file=sys.stderr)
        raise SystemExit(2) from None
