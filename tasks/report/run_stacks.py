"""A run's call stacks for the report: its raw traces (`RunInput.traces`) reduced to a
StackProfile by tasks.stacks.collect, or None when none of them recorded stacks (traces of
format version 1 or 2, or recorded with `--frames 0`: the page then says how to record them).

A run of the events dataset is read from the data root's raw traces beside it; when those
are gone, the page says the stacks were not found rather than guessing.
"""

from __future__ import annotations

from pathlib import Path

from tasks.format.trace_reader import TraceFormatError
from tasks.report.sources import RunInput, open_trace
from tasks.stacks.collect import stack_profile
from tasks.stacks.profile import StackProfile


def read_stacks(run: RunInput, sysroot: Path | None = None) -> StackProfile | None:
    """The StackProfile of the run's traces when one of them recorded stacks, else None (the
    processes that did not count under their caller's one frame, or no frame: collect's
    rule). A trace that cannot be read is left out (the report's analysis names it among its
    warnings); `sysroot`: where a container run's modules are copied (tasks.format.frames)."""
    traces = []
    for path in run.traces:  # a loop over process images
        try:
            trace, _ = open_trace(path, run.fs)
        except (TraceFormatError, OSError):
            continue
        traces.append(trace)
    if not any(t.header.has_stacks for t in traces):
        return None
    return stack_profile(traces, sysroot)
