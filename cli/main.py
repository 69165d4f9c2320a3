"""`heapcast`: the command line, a thin front over the flows' own tasks.

heapcast trace [-o DIR] -- PROGRAM ARGS...      trace any program, like heaptrack
heapcast layer [--policy P] -- PROGRAM ARGS...  run any program over heapcast's allocator layer
heapcast inspect FILE...                        a trace's header and per-operation counts
heapcast report RUN [-o HTML] [--diff RUN]      a run's heap report: HTML and a summary
heapcast export --format F -o FILE RUN          call stacks for flamegraph.pl, speedscope, pprof
heapcast tune [-o HTML] -- PROGRAM ARGS...      which allocator and settings suit a program
heapcast run [...]                              the whole pipeline once (flow nightly)
heapcast bundle export|train ...                train the network elsewhere (a lent GPU)

one stage at a time:
heapcast replay [WORKLOAD...]                   replay the catalog's workloads, traced
heapcast dataset [WORKLOAD...]                  convert raw runs into the events dataset
heapcast train [--quick] [--set KEY=VALUE]      train, evaluate and register the model
heapcast whatif [--model VERSION]               a model's predictions through cache policies
heapcast allocators [WORKLOAD...] [--seeds]     the workloads under each allocator, measured
"""

# Start-up time matters here (`trace` runs before the traced program, `inspect` is interactive):
# this module imports only the standard library's argparse, os and sys at the top; each command
# imports what it needs when it runs (numpy for inspect; pyarrow, plotly for report; Prefect only
# to build a missing tracer or for `run`). benchmarks/bench_cli.py measures it.

from __future__ import annotations

import argparse
import os
import sys

# what each library is built from (no Prefect: read at once)
from tasks.format.native_sources import (
    LAYER_SOURCES,
    TRACER_SOURCES,
    NativeBuildError,
    build_native,
)

# the tracer's stack depth: its variable, bounds and default (standard library only)
from tasks.format.stack_depth import DEFAULT_FRAMES, FRAMES_ENV, FRAMES_MAX, frames_problem

EPILOG = """\
examples:
  heapcast trace -o traces -- sqlite3 :memory: 'select 1'
      trace a program and every process it starts into traces/<run>/*.hct
  heapcast inspect traces/*/*.hct
      the header and the calls per operation of each trace
  heapcast report traces/<run> -o report.html
      the heap report of those traces: report.html and a summary on the terminal
  heapcast report sqlite3/small --diff sqlite3/medium
      two runs of the data root ($HEAPCAST_ROOT or ./data) side by side
  heapcast tune -- python3 train.py
      the program under glibc, its tunables, jemalloc, tcmalloc, mimalloc: the line to use
  heapcast run --quick
      the whole pipeline once: replay, dataset, train, register (heapcast run --help)
  heapcast dataset && heapcast train --quick --set epochs=2
      one stage at a time: convert what is new, then train (heapcast VERB --help)
  heapcast bundle export -o bundle.npz && KERAS_BACKEND=jax heapcast bundle train bundle.npz
      what the network trains on, in one file; trained here or on a GPU machine
"""

BUNDLE_EPILOG = """\
A bundle holds the training and validation tokens with their features, the n-gram table, the
evaluation runs and the config (< 48 MiB): what a machine with no data root, no network and no
services needs to train the network and score it on the unseen-runs table.

examples:
  heapcast bundle export -o bundle.npz --quick
      the quick night's training data (configs/train-quick.yaml) from $HEAPCAST_ROOT or ./data
  heapcast bundle train bundle.npz -o trained --set epochs=2
      train it here (KERAS_BACKEND picks the backend; a GPU is used by itself) and write
      trained/model.keras and trained/result.json (placement, positions/s, scores)
  scripts/gpu_check.sh
      the same on a lent GPU machine, in one prepared call (the script says how)
"""

TUNE_EPILOG = """\
The program runs here, in this folder and environment: once traced (what it allocates and
frees, its threads, its mallopt calls), then once per candidate per round: the fixed list of
configs/allocators.yaml's `tune`, less those the trace rules out, plus those derived from it
(glibc-derived: glibc's tunables at the trace's values; heapcast's layer where its case shows).
Each run's allocator is verified in force from inside the program; output and exit code must
stay as under glibc. Rounds stop once the choice is decided; the choice is run alone once more.

example:
  heapcast tune -o tune.html -- python3 -c 'import numpy as np; ...'
      what the trace showed, the candidates and why, a table (time, peak RSS, minor faults
      per candidate relative to glibc), the recommendation with its interval, the check run,
      and the line to paste, e.g.
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=81788928:... python3 -c ...
"""

TRACE_EPILOG = """\
examples:
  heapcast trace -o traces -- sqlite3 :memory: 'select 6*7'
      prints 42 as sqlite3 would, exits with sqlite3's code, then on stderr:
      heapcast: 1 process(es), 1 thread(s), 1234 events -> traces/<run>/<pid>-<ns>.hct
      each call's return address, each allocation's call stack (up to 32 frames; each distinct
      stack stored once) and the module map are recorded (the report's top callers and stacks,
      by name; the call sites the questions and the layer's table read)
  heapcast trace --frames 8 -o traces -- python3 script.py
      stacks up to 8 frames deep (1 to 128; --frames 0: the caller only, 8 bytes less per event)
  heapcast trace --no-caller -o traces -- make -j2
      no caller and no stacks: 16 bytes less per event; the report and the questions then say
      the trace has no call sites (--no-caller with --frames N > 0 is refused: stacks begin
      with the caller)
"""

LAYER_EPILOG = """\
examples:
  heapcast layer -- python3 -c 'import numpy as np; a = np.ones(10**7); print(((a * a) ** 2 + 3).sum())'
      prints what python prints, exits with its code, then on stderr what the layer did:
      heapcast layer (largest, online): 1 process(es): 62 hits, 4 misses, 66 blocks kept
      (peak 305.2 MB), 2 given back (152.6 MB), 5 calls passed through
  heapcast layer --policy guided --stats -- sqlite3 :memory: 'select 1'
      the guided policy (the thread's online counter), and each process's counters
  heapcast layer --policy guided --predictor model -- ./app
      guided by the champion's table (model:7: version 7's), fetched from the registry
  heapcast layer --policy guided --predictor table:model.hclt -- ./app
      guided by a table file from the model (refused with one line if it cannot be trusted)
  heapcast layer -O cap=64M -O min=64K -- ./app
      any option of the layer (native/layers/layer.c, HL_OPTIONS; native/README.md)
  heapcast layer --policy place -- ./app
      the placement layer in front of jemalloc (native/layers/place.c; libjemalloc2 installed,
      or HEAPCAST_JEMALLOC naming one): each allocation placed by its call site's predicted
      lifetime in one of two jemalloc arenas; at exit, on stderr:
      heapcast layer (place, predict): 1 process(es), mode predict: 5,412 allocations placed
      long (their own jemalloc arena), the rest short (jemalloc's own); 1 of 4 call sites long
      (-O mode=size|off|sites -O sites=FILE, -O horizon=N, ...: its options; --stats: the lines)
  heapcast layer --policy place --predictor model -- ./app
      placed by the champion's lifetime table where it knows the (call site, size class), by
      the online counter elsewhere (model:7, table:FILE likewise; native/TABLE.md)
"""

INSPECT_EPILOG = """\
example:
  heapcast inspect traces/*/*.hct
      traces/20260101T120000-42/42-1767268800000000000.hct
        format version 3, record 48 bytes, caller yes, modules 12, stacks yes (5678 nodes)
        pid 42, parent 41, clock tsc
        ...
        threads 1, events 1234, span 0.012 s
          malloc   700
          free     530
"""

REPORT_EPILOG = """\
RUN is a folder of raw traces (what `heapcast trace` wrote, or <root>/raw/<w>/<r>), an events
run folder (<root>/events/workload=<w>/run=<r>), .hct or .parquet files, or WORKLOAD/RUN under
the data root (--root; default $HEAPCAST_ROOT or ./data). The page is self-contained (no network).

examples:
  heapcast report traces/20260101T120000-42 -o report.html
      report the traces `heapcast trace -o traces` wrote; open report.html in a browser
  heapcast report git/medium
      a run of the data root: its events if converted, else its raw traces
  heapcast report git/medium --diff git/small -o diff.html
      both runs side by side, with their differences
  heapcast report data/events/workload=git/run=medium --temporary-calls 8
      count blocks freed within 8 calls as temporaries
"""

_LAYER_POLICIES = ("largest", "pools", "guided", "off", "place")


def _layer_policy(name: str) -> str:
    """--policy: a former name (tasks.core.policy_names) is the policy now."""
    if name in _LAYER_POLICIES:
        return name
    from tasks.core.policy_names import current_policy  # deferred: start-up time

    now = current_policy(name)
    if now != name:
        print(f"heapcast layer: policy {name} is now {now}", file=sys.stderr)
    return now


def _run_id() -> str:
    # deferred: imported on first use, for start-up time
    import time

    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"


def _tracer_library() -> str | None:
    """The tracer's path; built (make, through tasks.format.build) only when missing or older
    than its sources. None, with the reason on stderr, when it cannot be built."""
    # deferred: imported on first use, for start-up time
    from pathlib import Path

    native = Path(__file__).resolve().parents[1] / "native"
    lib = native / "build" / "libheapcast.so"
    try:
        built = lib.stat().st_mtime_ns
        if all((native / s).stat().st_mtime_ns <= built for s in TRACER_SOURCES):
            return str(lib)
    except FileNotFoundError:
        pass
    # deferred: imported on first use, for start-up time
    from tasks.format.build import TracerBuildError, build_tracer

    try:
        return str(build_tracer.fn())
    except TracerBuildError as err:
        print(f"heapcast trace: {err}", file=sys.stderr)
        return None


def _program(args: argparse.Namespace, verb: str, usage: str) -> list[str] | None:
    """The program and its arguments after `--`; None, with the usage on stderr, when none is
    given."""
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        print(f"heapcast {verb}: give a program to {usage}", file=sys.stderr)
        return None
    return program


def _preloaded(lib: str) -> dict[str, str]:
    """This environment with `lib` first in LD_PRELOAD (before any the user preloads)."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    return env


def _run_program(program: list[str], env: dict[str, str], verb: str) -> int | None:
    """The program's exit code; None, said on stderr, when there is no such program."""
    import subprocess  # deferred: start-up time

    try:
        return subprocess.call(program, env=env)
    except FileNotFoundError:
        print(f"heapcast {verb}: program not found: {program[0]}", file=sys.stderr)
        return None


def _exit_code(code: int) -> int:
    """The program's exit code is heapcast's, so scripts can wrap programs transparently (a
    signal's death as the shell says it, 128 + N)."""
    return code if code >= 0 else 128 - code


def _trace_frames(args: argparse.Namespace) -> int | None:
    """The stack depth to record: --frames, else DEFAULT_FRAMES with the caller and 0 without;
    None, said on stderr, for --no-caller with --frames N > 0 (a stack's first frame is the
    caller: asking for stacks without it is a contradiction, not a choice to guess)."""
    if args.frames is None:
        return DEFAULT_FRAMES if args.caller else 0
    if args.frames and not args.caller:
        print(
            f"heapcast trace: --frames {args.frames} records call stacks, whose first frame is "
            "the caller; drop --no-caller, or give --frames 0",
            file=sys.stderr,
        )
        return None
    return args.frames


def cmd_trace(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    from pathlib import Path

    program = _program(args, "trace", "trace: heapcast trace [-o DIR] -- PROGRAM ARGS...")
    if not program:
        return 2
    frames = _trace_frames(args)
    if frames is None:
        return 2
    lib = _tracer_library()
    if lib is None:
        return 2
    run_dir = Path(args.output).resolve() / _run_id()
    run_dir.mkdir(parents=True, exist_ok=False)
    env = _preloaded(lib)
    env["HEAPCAST_OUT"] = str(run_dir)
    if args.caller:  # as the catalog's traces are: the questions and the layer key call sites
        env["HEAPCAST_CALLER"] = "1"
    else:
        env.pop("HEAPCAST_CALLER", None)
    if frames:  # the whole call stack, as the catalog's replays record it (FORMAT.md, Stacks)
        env[FRAMES_ENV] = str(frames)
    else:
        env.pop(FRAMES_ENV, None)
    code = _run_program(program, env, "trace")
    if code is None:
        return 127
    # deferred: imported on first use, for start-up time
    from tasks.format.trace_reader import count_traces  # numpy: after the program has run

    s = count_traces(run_dir)
    for why in s.unreadable.values():
        print(f"heapcast: skipped {why}", file=sys.stderr)
    where = run_dir / s.files[0] if len(s.files) == 1 else run_dir
    print(
        f"heapcast: {s.processes} process(es), {s.threads} thread(s), {s.events} events -> {where}",
        file=sys.stderr,
    )
    return _exit_code(code)


def _layer_library() -> str | None:
    """native/build/libheapcast_layer.so, built with make when missing or older than a source.
    None, with the reason on stderr, when it cannot be built."""
    try:
        return str(build_native("layer", "libheapcast_layer.so", LAYER_SOURCES, "the layer"))
    except NativeBuildError as e:
        print(f"heapcast layer: {e}", file=sys.stderr)
        return None


def _place_module():
    """tasks/allocators/place.py (standard library only), loaded by its path: importing it as
    tasks.allocators.place would run the package's __init__, which imports Prefect (seconds)."""
    # deferred: imported on first use, for start-up time
    import importlib.util
    from pathlib import Path

    name = "heapcast_cli_place"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "tasks" / "allocators" / "place.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _registered_table(args: argparse.Namespace, pred: str, kind: str):
    """`--predictor model[:VERSION]`: the registered version's table of `kind` (reuse: the cache
    layer's; lifetime: placement's), by alias or number, kept on this host by version (MLflow
    only to fetch one not here yet); the layer requires its version (model=N), so a file from
    another version is refused. None, with the reason on stderr, when there is none."""
    from tasks.core.config import default_root  # deferred: start-up time
    from tasks.core.storage import Root
    from tasks.registry.table_cache import model_table

    which = pred.partition(":")[2] or "champion"
    root = Root.from_url(args.root or default_root())
    try:
        got = model_table(root, which, kind=kind)
    except (FileNotFoundError, ValueError) as err:
        print(f"heapcast layer: --predictor {pred}: {err}", file=sys.stderr)
        return None
    if got is None:
        print(
            f"heapcast layer: --predictor {pred}: no registered version {which!r} under "
            f"{root.url} (`make run` registers one; --root names another data root)",
            file=sys.stderr,
        )
        return None
    if got.refused:
        print(f"heapcast layer: {got.refused}; fetched again", file=sys.stderr)
    return got


def _place_table_options(args: argparse.Namespace, pred: str) -> list[str] | None:
    """`--predictor` for placement: the layer's options naming its lifetime table (none for the
    online counter); None, with the reason on stderr, when it names no usable table."""
    from pathlib import Path  # deferred: start-up time

    if pred == "model" or pred.startswith("model:"):
        # the registered version's lifetime table (native/TABLE.md)
        got = _registered_table(args, pred, "lifetime")
        if got is None:
            return None
        return [f"table={got.path}", f"model={got.version}"]
    if pred.startswith("table:") and len(pred) > 6:
        table = Path(pred[6:]).resolve()
        if not table.is_file():
            print(f"heapcast layer: --predictor {pred}: no such file {table}", file=sys.stderr)
            return None
        return [f"table={table}"]
    if pred != "online":
        print(
            f"heapcast layer: --predictor {pred}: online, model[:VERSION] or table:FILE (a "
            "lifetime table, native/TABLE.md)",
            file=sys.stderr,
        )
        return None
    return []


def _place_library(place) -> tuple[str, str] | None:
    """(jemalloc, the placement layer built when missing or stale); None, with what to do on
    stderr, when either is missing."""
    jemalloc = os.environ.get("HEAPCAST_JEMALLOC") or place.JEMALLOC
    if not os.path.isfile(jemalloc):
        print(
            f"heapcast layer: --policy place runs the program over jemalloc (the layer needs its "
            f"arenas), and {jemalloc} is missing: install the Debian package {place.JEMALLOC_PACKAGE} "
            f"(apt-get install {place.JEMALLOC_PACKAGE}), or name another libjemalloc.so.2 in "
            "HEAPCAST_JEMALLOC",
            file=sys.stderr,
        )
        return None
    try:
        return jemalloc, place.build_place()
    except place.PlaceBuildError as err:
        print(f"heapcast layer: {err}", file=sys.stderr)
        return None


def cmd_place(args: argparse.Namespace, program: list[str]) -> int:
    """`heapcast layer --policy place`: PROGRAM under jemalloc with heapcast's placement layer in
    front of it (native/layers/place.c, built when missing or stale); at exit, what it did."""
    # deferred: imported on first use, for start-up time
    import tempfile
    from pathlib import Path

    place = _place_module()
    pred = args.predictor
    table_options = _place_table_options(args, pred)
    if table_options is None:
        return 2
    options = [*table_options, *args.option]
    bad = [s for s in options if "," in s or "=" not in s or s.startswith("stats=")]
    if bad:
        print(
            f"heapcast layer: option {bad[0]!r}: NAME=VALUE without commas (mode, sample, horizon, "
            "pct, big, sites, learn, table, model; stats is heapcast's)",
            file=sys.stderr,
        )
        return 2
    built = _place_library(place)
    if built is None:
        return 2
    settings = {"mode": "predict"}
    settings.update(o.split("=", 1) for o in options)
    if "table" in settings and settings["mode"] != "predict":
        print(
            f"heapcast layer: --predictor {pred}: a lifetime table needs mode predict (the "
            f"counter answers where it has no key), not {settings['mode']}",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="heapcast-place-") as tmp:
        stats = Path(tmp) / "stats"
        env = _preloaded(place.preload_line(built[1], built[0]))
        env["HEAPCAST_PLACE"] = ",".join(
            [*(f"{k}={v}" for k, v in settings.items()), f"stats={stats}"]
        )
        code = _run_program(program, env, "layer")
        if code is None:
            return 127
        got = place.read_place_stats(stats)
        lines = stats.read_text().splitlines() if stats.exists() else []
    print(
        f"heapcast layer (place, {settings['mode']}): {place.describe(got, settings['mode'])}",
        file=sys.stderr,
    )
    if args.stats:
        for row in place.parse_stats("\n".join(lines)):
            print(
                "heapcast layer: " + " ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr
            )
    return _exit_code(code)


def _layer_predictor(args: argparse.Namespace) -> tuple[str, list[str]] | None:
    """`--predictor` for the cache layer: its predictor option (online, or table: with the
    file's absolute path) and, for a registered table, the model option the layer checks it
    against; None, with the reason on stderr, when it names no usable table."""
    from pathlib import Path  # deferred: start-up time

    pred = args.predictor
    model_option = []
    if pred == "model" or pred.startswith("model:"):
        # the registered version's reuse table (native/TABLE.md)
        got = _registered_table(args, pred, "reuse")
        if got is None:
            return None
        pred, model_option = f"table:{got.path}", [f"model={got.version}"]
    if pred != "online" and not (pred.startswith("table:") and len(pred) > 6):
        print(
            f"heapcast layer: --predictor {pred}: online, model[:VERSION] or table:FILE",
            file=sys.stderr,
        )
        return None
    if pred.startswith("table:"):
        table = Path(pred[6:]).resolve()
        if not table.is_file():
            print(f"heapcast layer: --predictor {pred}: no such file {table}", file=sys.stderr)
            return None
        pred = f"table:{table}"
    return pred, model_option


def _say_layer_stats(args: argparse.Namespace, rows: list[dict[str, str]]) -> None:
    """On stderr, what the cache layer did over all processes: hits, blocks kept and given
    back, calls passed through; where it stepped aside, and a threshold the program fixed."""

    def total(key: str) -> int:
        return sum(int(r.get(key, 0)) for r in rows)

    mb = 1e6
    print(
        f"heapcast layer ({args.policy}, {args.predictor.split(':')[0]}): "
        f"{len(rows)} process(es): {total('hits')} hits, {total('misses')} misses, "
        f"{total('kept')} blocks kept (peak {max((int(r['bytes_kept_peak']) for r in rows), default=0) / mb:.1f} MB), "
        f"{total('given_back')} given back ({total('bytes_given_back') / mb:.1f} MB; "
        f"{total('bounded')} to stay within the program's own peak of "
        f"{max((int(r.get('live_peak', 0)) for r in rows), default=0) / mb:.1f} MB live), "
        f"{total('passed')} calls passed through ({total('heap')} frees left to glibc's heap, "
        f"{total('outgrown')} of blocks the program outgrew)",
        file=sys.stderr,
    )
    # the proof (layer.c hl_ghost_hit): processes that freed blocks the layer would have kept,
    # but did not ask again for them often enough
    aside = [r for r in rows if r.get("proven") == "0" and int(r.get("unproven", 0))]
    if aside:
        some = "" if len(aside) == len(rows) else f" in {len(aside)} of {len(rows)} processes"
        reuses = sum(int(r.get("proof_hits", 0)) for r in aside)
        print(
            f"heapcast layer: stepped aside{some}: {reuses} of its requests could have reused a "
            f"block it freed, fewer than the {aside[0].get('proof', '?')} the layer waits "
            "for (-O proof=0 keeps from the start)",
            file=sys.stderr,
        )
    fixed = {
        int(r["program_mmap_threshold"]) for r in rows if int(r.get("program_mmap_threshold", 0))
    }
    if fixed:  # what makes glibc slow there, and why the layer's own following is off
        print(
            "heapcast layer: the program fixed glibc's mmap threshold itself (mallopt "
            f"M_MMAP_THRESHOLD={', '.join(map(str, sorted(fixed)))}): glibc maps every block from "
            "there up afresh, and the layer leaves the threshold where the program put it",
            file=sys.stderr,
        )


def cmd_layer(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    import tempfile
    from pathlib import Path

    program = _program(args, "layer", "run: heapcast layer [--policy P] -- PROGRAM ARGS...")
    if not program:
        return 2
    if args.policy == "place":
        return cmd_place(args, program)
    resolved = _layer_predictor(args)
    if resolved is None:
        return 2
    pred, model_option = resolved
    settings = [f"policy={args.policy}", f"predictor={pred}", *model_option, *args.option]
    bad = [s for s in settings if "," in s or "=" not in s]
    if bad:
        print(f"heapcast layer: option {bad[0]!r}: NAME=VALUE, without commas", file=sys.stderr)
        return 2
    lib = _layer_library()
    if lib is None:
        return 2
    with tempfile.TemporaryDirectory(prefix="heapcast-layer-") as tmp:
        stats = Path(tmp) / "stats"
        env = _preloaded(lib)
        env["HEAPCAST_LAYER"] = ",".join([*settings, f"stats={stats}"])
        code = _run_program(program, env, "layer")
        if code is None:
            return 127
        lines = stats.read_text().splitlines() if stats.exists() else []
    rows = [dict(f.split("=", 1) for f in line.split()) for line in lines if line.strip()]
    _say_layer_stats(args, rows)
    if args.stats:
        for line in lines:
            print(f"heapcast layer: {line}", file=sys.stderr)
    return _exit_code(code)


def cmd_inspect(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    import time

    from tasks.format.trace_reader import Op, TraceFormatError, read_trace

    status = 0
    for path in args.files:
        try:
            t = read_trace(path)
        except TraceFormatError as err:
            print(f"heapcast inspect: {err}", file=sys.stderr)
            status = 1
            continue
        h = t.header
        op = t.op
        print(f"{path}")
        print(
            f"  format version {h.version}, record {h.record_size} bytes, "
            f"caller {'yes' if h.has_caller else 'no'}"
            + (f", modules {len(t.modules)}" if t.modules is not None else "")
            + (f", stacks yes ({len(t.stacks)} nodes)" if t.stacks is not None else ", stacks no")
        )
        print(f"  pid {h.pid}, parent {h.ppid}, clock {'tsc' if h.clock == 2 else 'monotonic'}")
        print(
            f"  started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.start_realtime_ns / 1e9))} UTC"
        )
        print(f"  command {' '.join(h.cmdline)}")
        n_threads = int((op == Op.THREAD_START).sum())
        calls = op != Op.THREAD_START
        span = 0.0
        if calls.any():
            tn = t.time_ns[calls]
            span = (int(tn.max()) - int(tn.min())) / 1e9
        print(f"  threads {n_threads}, events {int(calls.sum())}, span {span:.3f} s")
        for name, n in sorted(t.counts_by_op().items(), key=lambda kv: -kv[1]):
            if name != "thread_start":
                print(f"    {name:<15} {n:>12}")
        if t.dropped_bytes:
            print(f"  dropped a truncated last record ({t.dropped_bytes} bytes)")
    return status


def cmd_report(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    from tasks.core.config import default_root
    from tasks.core.storage import Root
    from tasks.report.sources import ReportInputError
    from tasks.report.summary import make_report

    try:
        result = make_report(
            args.run,
            args.output,
            diff=args.diff,
            root=Root.from_url(args.root or default_root()),
            bins=args.bins,
            temporary_calls=args.temporary_calls,
            top_processes=args.top_processes,
        )
    except ReportInputError as err:
        print(f"heapcast report: {err}", file=sys.stderr)
        return 1
    for r in result.reports:
        for w in r.warnings:
            print(f"heapcast report: warning: {r.label}: {w}", file=sys.stderr)
    print(result.text)
    return 0


def _candidates(text: str | None, config) -> list[str] | None:
    """--candidates: the names, a former one (RENAMED_POLICIES) said once as the name now."""
    if not text:
        return None
    names = text.split(",")
    for n in names:
        if config.resolve(n) != n:
            print(f"heapcast tune: candidate {n} is now {config.resolve(n)}", file=sys.stderr)
    return names


def cmd_tune(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    from pathlib import Path

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from tasks.allocators.config import load_allocators_config
    from tasks.allocators.tune import TuneError, tune
    from tasks.core.config import ConfigError

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        config = load_allocators_config(args.config)
    except ConfigError as err:
        print(f"heapcast tune: {err}", file=sys.stderr)
        return 2
    bar = Progress(
        TextColumn("heapcast tune"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        transient=True,
    )
    with bar:
        job = bar.add_task("", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(job, completed=done, total=total, description=what)

        try:
            out = tune(
                program,
                config,
                candidates=_candidates(args.candidates, config),
                repetitions=args.repetitions,
                max_repetitions=args.max_repetitions,
                html_out=Path(args.output) if args.output else None,
                progress=progress,
                objective=args.objective,
                memory=args.memory,
                trace=not args.no_trace,
            )
        except TuneError as err:
            bar.stop()
            print(f"heapcast tune: {err}", file=sys.stderr)
            return 1
    print(out.table)
    if out.html_path is not None:
        print(f"page: {out.html_path}")
    return 0


# The pipeline's stages, each its flow once: verb -> the flow module. `heapcast VERB ARGS` is
# `python -m flows.FLOW ARGS`, parsed by the same parser (flows/command_line.py). `replay`, not
# `trace`: `heapcast trace` traces one program of the user's; the stage replays the catalog.
STAGES = {
    "run": "nightly",
    "replay": "trace",
    "dataset": "dataset",
    "train": "train",
    "whatif": "whatif",
    "allocators": "allocators",
}

STAGE_HELP = {
    "run": "the whole pipeline once (flow nightly): replay, dataset, train, ...",
    "replay": "stage: replay the catalog's workloads, traced (flow trace)",
    "dataset": "stage: convert raw runs into the Parquet events dataset",
    "train": "stage: train, evaluate and register the next-call model",
    "whatif": "stage: a model's predictions through allocator cache policies",
    "allocators": "stage: the catalog's workloads under each allocator, measured",
}


def cmd_stage(verb: str, argv: list[str]) -> int:
    """A stage's flow once. --help and a bad argument end at the parser, before the flow
    module (Prefect, and TensorFlow for train) is imported."""
    # deferred: imported on first use, for start-up time (pydantic, yaml)
    import importlib

    from flows.command_line import PARSERS

    flow = STAGES[verb]
    args = PARSERS[flow](f"heapcast {verb}").parse_args(argv)
    return importlib.import_module(f"flows.{flow}").run(args)


class _Version(argparse.Action):
    """--version: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kw):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        # deferred: imported on first use, for start-up time
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("heapcast")
        except PackageNotFoundError:
            v = "(not installed: run scripts/setup.sh)"
        print(f"heapcast {v}")
        parser.exit()


def _frames(text: str) -> int:
    """--frames N: a whole number the tracer takes (tasks/format/frames.py)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    problem = frames_problem(n)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return n


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _trace_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast trace`: its options and the program after `--`."""
    t = sub.add_parser(
        "trace",
        help="trace a program: heapcast trace [-o DIR] -- PROGRAM ARGS...",
        description="Run PROGRAM with the tracer preloaded; one trace file per process image.",
        epilog=TRACE_EPILOG,
        formatter_class=raw,
    )
    t.add_argument(
        "-o",
        "--output",
        default="heapcast-traces",
        help="folder for the run's trace files (default ./heapcast-traces)",
    )
    t.add_argument(
        "--caller",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record each call's return address and the module map: the report's callers, the "
        "questions' call sites (default: on; --no-caller: no call sites and no stacks, 32-byte records)",
    )
    t.add_argument(
        "--frames",
        type=_frames,
        default=None,
        metavar="N",
        help=f"record each allocation's call stack, up to N frames, 0 to {FRAMES_MAX} (default "
        f"{DEFAULT_FRAMES}; 0: the caller only; with --no-caller: 0)",
    )
    t.add_argument("program", nargs=argparse.REMAINDER)
    t.set_defaults(func=cmd_trace)


def _layer_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast layer`: the policy, its predictor, the layer's own options, the program."""
    la = sub.add_parser(
        "layer",
        help="run a program over heapcast's allocator layer: heapcast layer [--policy P] -- "
        "PROGRAM ARGS...",
        description="Run PROGRAM with heapcast's allocator layer preloaded (it keeps freed large "
        "blocks for reuse);\nat exit, say on stderr what it did. Output and exit code are the "
        "program's.",
        epilog=LAYER_EPILOG,
        formatter_class=raw,
    )
    la.add_argument("--policy", type=_layer_policy, choices=_LAYER_POLICIES, default="largest",
                    help="what to keep (default largest: the few largest freed blocks); place: "
                    "the placement layer in front of jemalloc instead")  # fmt: skip
    la.add_argument(
        "--predictor",
        default="online",
        metavar="online|model[:VERSION]|table:FILE",
        help="guided policy: the thread's online counter (default), the registered model's "
        "table (model: the champion's; model:7 version 7's; --root's registry), or a table file; "
        "place: the same for its lifetime table (the counter where the table has no key)",
    )
    la.add_argument("--root", default=None, help="data root whose registry --predictor model reads")
    la.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other layer option (cap=64M, min=64K, madv=off, decay=500, topk=2, ...)",
    )
    la.add_argument("--stats", action="store_true", help="also print each process's counters")
    la.add_argument("program", nargs=argparse.REMAINDER)
    la.set_defaults(func=cmd_layer)


def _inspect_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast inspect FILE...`."""
    i = sub.add_parser(
        "inspect",
        help="print a trace's header and counts per operation",
        description="Print each trace's header and its calls per operation.",
        epilog=INSPECT_EPILOG,
        formatter_class=raw,
    )
    i.add_argument("files", nargs="+")
    i.set_defaults(func=cmd_inspect)


def _report_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast report`: the run, a second one to compare, the plots' settings."""
    r = sub.add_parser(
        "report",
        help="the heap report of a run (one HTML page) and a summary: "
        "heapcast report RUN [-o report.html] [--diff OTHER]",
        description="The heap report of a run: its peak, live bytes and allocation rate over\n"
        "time, size classes, lifetimes, temporaries, leaks, processes and threads, callers.",
        epilog=REPORT_EPILOG,
        formatter_class=raw,
    )
    r.add_argument("run", nargs="+", metavar="RUN_OR_FILES", help="a run folder, files, or W/R")
    r.add_argument("-o", "--output", default="report.html", help="the page (default report.html)")
    r.add_argument("--diff", metavar="OTHER", help="a second run, shown side by side (B)")
    r.add_argument(
        "--root", help="data root for WORKLOAD/RUN names (default $HEAPCAST_ROOT, ./data)"
    )
    r.add_argument(
        "--bins", type=_positive, default=1000, metavar="N", help="time bins of the plots (1000)"
    )
    r.add_argument(
        "--temporary-calls",
        type=_positive,
        metavar="N",
        default=4,
        help="a block freed within this many calls of its process is a temporary (4)",
    )
    r.add_argument(
        "--top-processes",
        type=_positive,
        default=8,
        metavar="N",
        help="processes drawn over time (8)",
    )
    r.set_defaults(func=cmd_report)


EXPORT_EPILOG = """\
The run is named as for `heapcast report`: a folder of traces, trace files, or WORKLOAD/RUN under
the data root (its raw traces). Every allocation that returned a block is counted on its call
stack (traces recorded without stacks: one frame, malloc's caller). --weight: bytes allocated
(default), calls, peak (bytes live when the run's live heap peaked) or leaked (never freed).

examples:
  heapcast export --format pprof -o heap.pb.gz traces/<run>
      all four weights in one profile.proto: go tool pprof -http=: heap.pb.gz
  heapcast export --format collapsed --weight peak -o peak.folded traces/<run>
      folded stacks: flamegraph.pl peak.folded > peak.svg, or open it in speedscope
"""


def _export_traces(specs: list[str], root) -> tuple[list, list[str]]:
    """The process traces of the run `specs` names, as `heapcast report` takes it (a run
    folder, trace files, or WORKLOAD/RUN under `root`: its raw traces, where the stacks are,
    even once converted), and warnings: files skipped, traces without stacks. Raises
    ReportInputError naming what cannot be read."""
    # deferred: imported on first use, for start-up time (numpy, pyarrow)
    from tasks.format.trace_reader import TraceFormatError, read_trace
    from tasks.report.sources import ReportInputError, resolve

    run = resolve(specs, root)  # an events run comes with the raw traces beside it, if any
    if not run.traces:
        raise ReportInputError(
            f"{run.label}: an events run: its parts carry no call stacks; name the run's raw "
            "traces (its raw/WORKLOAD/RUN folder or its *.hct files)"
        )
    traces, warnings = [], list(run.warnings)
    for path in run.traces:  # a loop over process images
        try:
            traces.append(read_trace(path, fs=run.fs))
        except (TraceFormatError, OSError) as err:
            warnings.append(f"skipped {err}")
            continue
        h = traces[-1].header
        if not h.has_stacks:
            what = "malloc's caller" if h.has_caller else "no frame (no caller recorded)"
            warnings.append(
                f"{path}: no call stacks (format version {h.version}, or traced with "
                f"--frames 0): its stacks are one frame, {what}"
            )
    if not traces:
        why = "; ".join(warnings) or "no files"
        raise ReportInputError(f"{run.label}: no readable trace ({why})")
    return traces, warnings


def cmd_export(args: argparse.Namespace) -> int:
    """`heapcast export`: a run's call stacks as folded stacks or pprof; exit 2 on bad input."""
    # deferred: imported on first use, for start-up time (numpy, pyarrow)
    from tasks.core.config import default_root
    from tasks.core.storage import Root
    from tasks.report.sources import ReportInputError
    from tasks.stacks.collect import stack_profile
    from tasks.stacks.export import write

    out = os.path.abspath(args.output)
    if os.path.isdir(out) or not os.access(os.path.dirname(out), os.W_OK):
        print(
            f"heapcast export: {args.output}: cannot write here (a folder, or no such "
            "writable folder): give a file path in a writable folder",
            file=sys.stderr,
        )
        return 2
    try:
        traces, warnings = _export_traces(args.run, Root.from_url(args.root or default_root()))
    except ReportInputError as err:
        print(f"heapcast export: {err}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"heapcast export: warning: {w}", file=sys.stderr)
    profile = stack_profile(traces)
    try:
        write(profile, args.format, out, args.weight, " ".join(args.run))
    except OSError as err:
        print(f"heapcast export: {args.output}: {err.strerror}", file=sys.stderr)
        return 2
    w = profile.weight(args.weight)
    print(
        f"heapcast export: {args.output}: {args.format}, {len(profile):,} stacks, "
        f"{len(profile.frames):,} frames, {args.weight} {int(w.sum()):,} in all"
    )
    return 0


def _export_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast export`: the run, the format, the file, the weight."""
    # the choices, written here: the module that defines them imports numpy (start-up time)
    e = sub.add_parser(
        "export",
        help="a run's call stacks for other tools: heapcast export --format collapsed|pprof "
        "-o FILE RUN",
        description="A run's allocations by call stack, for other tools: folded stacks "
        "(flamegraph.pl, speedscope, inferno)\nor pprof's profile.proto (go tool pprof, "
        "Pyroscope).",
        epilog=EXPORT_EPILOG,
        formatter_class=raw,
    )
    e.add_argument("run", nargs="+", metavar="RUN_OR_FILES", help="a run folder, files, or W/R")
    e.add_argument("--format", required=True, choices=("collapsed", "pprof"), help="the format")
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="the file written")
    e.add_argument(
        "--weight",
        default="bytes",
        choices=("bytes", "calls", "peak", "leaked"),
        help="what a stack weighs: collapsed's numbers, pprof's default sample (bytes)",
    )
    e.add_argument(
        "--root", help="data root for WORKLOAD/RUN names (default $HEAPCAST_ROOT, ./data)"
    )
    e.set_defaults(func=cmd_export)


def _tune_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast tune`: the candidates, the rounds, the objective, the program."""
    tu = sub.add_parser(
        "tune",
        help="which allocator and settings suit a program: heapcast tune -- PROGRAM ARGS...",
        description="Trace PROGRAM once, derive glibc settings from what it does, measure them\n"
        "beside other allocators; recommend one, corrected for the number compared, with the\n"
        "exact line to paste.",
        epilog=TUNE_EPILOG,
        formatter_class=raw,
    )
    tu.add_argument("-o", "--output", default="tune.html", help="the page (default tune.html)")
    tu.add_argument("--candidates", help="comma-separated names (configs/allocators.yaml)")
    tu.add_argument("--repetitions", type=_positive, help="rounds a decision needs (5)")
    tu.add_argument("--max-repetitions", type=_positive, help="rounds at most")
    tu.add_argument(
        "--objective",
        choices=["time", "memory"],
        help="what the winner must beat glibc on (default: the config's rule, time)",
    )
    tu.add_argument(
        "--memory",
        choices=["peak_rss_mb", "max_process_rss_mb", "mean_rss_mb"],
        help="the memory it compares (default: the config's rule, peak_rss_mb); mean_rss_mb: "
        "averaged over the run, which placement lowers where the peak stays",
    )
    tu.add_argument(
        "--no-trace",
        action="store_true",
        help="no traced first run: the fixed list measured, nothing derived or ruled out",
    )
    tu.add_argument("--config", help="allocators config (default configs/allocators.yaml)")
    tu.add_argument("program", nargs=argparse.REMAINDER)
    tu.set_defaults(func=cmd_tune)


def _bundle_parser(sub: argparse._SubParsersAction, raw: type[argparse.HelpFormatter]) -> None:
    """`heapcast bundle export|train`."""
    bu = sub.add_parser(
        "bundle",
        help="train the network elsewhere: heapcast bundle export -o B.npz | bundle train B.npz",
        description="Export what the next-call network trains on to one file, or train one.",
        epilog=BUNDLE_EPILOG,
        formatter_class=raw,
    )
    bsub = bu.add_subparsers(dest="action", required=True)
    be = bsub.add_parser("export", help="write a night's training data to a bundle")
    be.add_argument("-o", "--output", default="bundle.npz", help="the file (default bundle.npz)")
    be.add_argument("--root", help="data root (default $HEAPCAST_ROOT, ./data)")
    be.add_argument("--quick", action="store_true", help="configs/train-quick.yaml")
    be.add_argument("--config", help="a training config (default configs/train.yaml)")
    be.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config setting")
    bt = bsub.add_parser("train", help="train a bundle here and score it on its evaluation runs")
    bt.add_argument("bundle")
    bt.add_argument("-o", "--output", default="trained", help="the folder (default trained)")
    bt.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config setting")
    for x in (be, bt):
        x.set_defaults(func=cmd_bundle)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="heapcast", description=__doc__, epilog=EPILOG, formatter_class=raw
    )
    p.add_argument("--version", action=_Version, help="print heapcast's version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for add in (
        _trace_parser,
        _layer_parser,
        _inspect_parser,
        _report_parser,
        _export_parser,
        _tune_parser,
        _bundle_parser,
    ):
        add(sub, raw)
    # The stages hand their arguments to their flow's own parser (see _main, cmd_stage); listed
    # here for `heapcast --help`; `heapcast VERB --help` gives each one's options.
    for verb, what in STAGE_HELP.items():
        sub.add_parser(verb, add_help=False, help=what)
    return p


def _settings(pairs: list[str] | None) -> dict:
    """--set KEY=VALUE pairs (KEY dotted, VALUE read as YAML) as nested training overrides, read
    as the stages' `--set` is (flows/command_line.py)."""
    # deferred: imported on first use, for start-up time (pydantic, yaml)
    from flows.command_line import key_value, nested

    try:
        return nested([key_value(pair) for pair in pairs or []])
    except argparse.ArgumentTypeError as err:
        raise SystemExit(f"heapcast bundle: --set: {err}") from None


def cmd_bundle(args: argparse.Namespace) -> int:
    # deferred: imported on first use, for start-up time
    from pydantic import ValidationError

    from tasks.learning.nextcall.bundle import BundleError

    try:
        if args.action == "export":
            # deferred: imported on first use, for start-up time
            from tasks.core.config import default_root
            from tasks.core.storage import Root
            from tasks.learning.nextcall.training import export_bundle
            from tasks.learning.train_config import DEFAULT_CONFIG, QUICK_CONFIG, load_train_config

            path = args.config or (QUICK_CONFIG if args.quick else DEFAULT_CONFIG)
            cfg = load_train_config(path, _settings(args.set))
            size, b = export_bundle(Root.from_url(args.root or default_root()), cfg, args.output)
            inp = b.inputs
            print(
                f"heapcast bundle: {args.output}: {size / 2**20:.1f} MiB, "
                f"{inp.train_run.n_tokens:,} training and {inp.val_run.n_tokens:,} validation "
                f"tokens, {len(b.evaluation)} evaluation runs, from {b.source}"
            )
            return 0
        # deferred: imported on first use, for start-up time
        from tasks.learning.nextcall.bundle import read_bundle, train_bundle

        result = train_bundle(read_bundle(args.bundle), args.output, _settings(args.set))
        where = result["placement"]
        overall = result["unseen_runs"].get("all", {})
        print(
            f"heapcast bundle: trained on {where['backend']} ({where['device']}, "
            f"{where['precision']}, batch {where['batch_size']}): "
            f"{result['positions_per_second']:,.0f} positions/s, {result['epochs']} epochs in "
            f"{result['train_seconds']:.0f} s; unseen runs top-1 {overall.get('top1', float('nan')):.4f} "
            f"top-5 {overall.get('top5', float('nan')):.4f}; {args.output}/result.json"
        )
        return 0
    except (BundleError, ValidationError, ValueError, FileNotFoundError) as err:
        print(f"heapcast bundle: {err}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if argv[:1] and argv[0] in STAGES:
        return cmd_stage(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, inside the try
        return code
    except BrokenPipeError:
        # The output's reader closed the pipe (`heapcast inspect F | head -1`): end quietly.
        # As the Python docs say (library/signal.html, "Note on SIGPIPE"): point stdout at
        # devnull, so the interpreter's own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
