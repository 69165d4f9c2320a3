"""`heapcast`: the command line, a thin front over the same tasks the flows use.

  heapcast trace [-o DIR] -- PROGRAM ARGS...   trace any program, the way heaptrack does
  heapcast inspect FILE...                      a trace's header and counts per operation
  heapcast run [...]                            the whole pipeline (the nightly flow) once
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tasks.trace_reader import Op, TraceFormatError, count_traces, read_trace


def _run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"


def cmd_trace(args: argparse.Namespace) -> int:
    from tasks.build import build_tracer

    program = args.program
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        print("heapcast trace: give a program to trace: heapcast trace [-o DIR] -- PROGRAM ARGS...",
              file=sys.stderr)
        return 2
    lib = build_tracer.fn()
    run_dir = Path(args.output).resolve() / _run_id()
    run_dir.mkdir(parents=True, exist_ok=False)
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(lib)
    env["HEAPCAST_OUT"] = str(run_dir)
    if args.caller:
        env["HEAPCAST_CALLER"] = "1"
    try:
        code = subprocess.call(program, env=env)
    except FileNotFoundError:
        print(f"heapcast trace: program not found: {program[0]}", file=sys.stderr)
        return 127
    s = count_traces(run_dir)
    for why in s.unreadable.values():
        print(f"heapcast: skipped {why}", file=sys.stderr)
    where = run_dir / s.files[0] if len(s.files) == 1 else run_dir
    print(f"heapcast: {s.processes} process(es), {s.threads} thread(s), "
          f"{s.events} events -> {where}", file=sys.stderr)
    # The traced program's exit code is heapcast's, so scripts can wrap programs transparently.
    return code if code >= 0 else 128 - code


def cmd_inspect(args: argparse.Namespace) -> int:
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
        print(f"  format version {h.version}, record {h.record_size} bytes, "
              f"caller {'yes' if h.has_caller else 'no'}")
        print(f"  pid {h.pid}, parent {h.ppid}, clock {'tsc' if h.clock == 2 else 'monotonic'}")
        print(f"  started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h.start_realtime_ns / 1e9))} UTC")
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


def cmd_run(argv: list[str]) -> int:
    from flows.nightly import main as nightly_main

    return nightly_main(argv)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heapcast", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="trace a program: heapcast trace [-o DIR] -- PROGRAM ARGS...")
    t.add_argument("-o", "--output", default="heapcast-traces",
                   help="folder for the run's trace files (default ./heapcast-traces)")
    t.add_argument("--caller", action="store_true", help="record each call's return address")
    t.add_argument("program", nargs=argparse.REMAINDER)
    t.set_defaults(func=cmd_trace)
    i = sub.add_parser("inspect", help="print a trace's header and counts per operation")
    i.add_argument("files", nargs="+")
    i.set_defaults(func=cmd_inspect)
    # `run` hands its arguments to the nightly flow's own parser (see main).
    sub.add_parser("run", add_help=False,
                   help="run the whole pipeline once (the nightly flow): heapcast run [--quick] "
                        "[--root URL] [--runner auto|docker|local]")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        return cmd_run(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
