"""Checks on replayed traces shared by the runner and docker tests (vectorised, no per-event
Python loops), and the tracer every replay test uses."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tasks.format.trace_reader import ALLOCATING_OPS, REALLOCATING_OPS, Op, Trace
from tasks.replay.inputs import generate_input
from tasks.replay.runners.base import RunRequest
from tasks.replay.workloads import Workload


def tracer_path() -> Path:
    """The tracer the project builds (HEAPCAST_TRACER overrides it)."""
    if os.environ.get("HEAPCAST_TRACER"):
        return Path(os.environ["HEAPCAST_TRACER"])
    from tasks.format.build import build_tracer

    return Path(build_tracer.fn())


def unpaired_frees(trace: Trace) -> int:
    """Frees (and reallocs' releases) not preceded, at their address, by a live allocation.

    Each allocation is an event (addr, +), each release an event (addr, -); in call order per
    address the events must alternate +, -, +, ... with no release first."""
    order = np.argsort(trace.time_ns, kind="stable")
    op, addr, arg, size = (trace.op[order], trace.addr[order], trace.arg[order], trace.size[order])
    pos = np.arange(len(op), dtype=np.int64) * 2
    is_alloc = np.isin(op, np.array(ALLOCATING_OPS, dtype=np.uint8)) & (addr != 0)
    is_re = np.isin(op, np.array(REALLOCATING_OPS, dtype=np.uint8))
    re_new = is_re & (addr != 0)
    # realloc releases its old block when it returns a new one, or when it frees (size 0)
    re_old = is_re & (arg != 0) & ((addr != 0) | (size == 0))
    is_free = op == Op.FREE
    a_addr = np.concatenate([addr[is_alloc | re_new], arg[re_old], addr[is_free]])
    a_when = np.concatenate([pos[is_alloc | re_new] + 1, pos[re_old], pos[is_free]])
    a_kind = np.concatenate(
        [
            np.zeros((is_alloc | re_new).sum(), np.int8),
            np.ones(re_old.sum(), np.int8),
            np.ones(is_free.sum(), np.int8),
        ]
    )
    idx = np.lexsort((a_when, a_addr))
    a_addr, a_kind = a_addr[idx], a_kind[idx]
    prev_same = np.concatenate([[False], a_addr[1:] == a_addr[:-1]])
    prev_alloc = np.concatenate([[False], a_kind[:-1] == 0])
    released = a_kind == 1
    return int((released & ~(prev_same & prev_alloc)).sum())


def op_counts(traces: list[Trace]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in traces:
        for k, v in t.counts_by_op().items():
            out[k] = out.get(k, 0) + v
    return out


def files_of(d: Path) -> dict[str, bytes]:
    """Every file of folder `d`: its bytes by name."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def assert_seeded_flat_input(generator: str, scale: int, tmp_path: Path) -> None:
    """The generator's input is its seed's alone (same seed, same bytes; another seed, others),
    and the names it returns are every file written, all plain files in one folder: the replay
    makes each of them read-only (0644), which would lock a subfolder."""
    names = generate_input(generator, 5, scale, tmp_path / "a")
    generate_input(generator, 5, scale, tmp_path / "b")
    generate_input(generator, 6, scale, tmp_path / "c")
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    assert files_of(tmp_path / "a") != files_of(tmp_path / "c")
    assert sorted(names) == sorted(files_of(tmp_path / "a"))
    assert all((tmp_path / "a" / n).is_file() for n in names)


def run_request(w: Workload, tmp_path: Path, tracer: Path | None) -> RunRequest:
    """A request to run w's small input, with fresh input, trace and work folders under
    tmp_path."""
    dirs = {d: tmp_path / d for d in ("input", "trace", "work")}
    for d in dirs.values():
        d.mkdir()
    return RunRequest(
        workload=w,
        input=w.input("small"),
        tracer=tracer,
        input_dir=dirs["input"],
        trace_dir=dirs["trace"],
        work_dir=dirs["work"],
    )


def reachable_by_nobody(path: Path) -> None:
    """The programs run as nobody (bound into the sandbox, or straight from the host): path and
    every folder above it let others in."""
    for p in (path, *path.parents):
        mode = p.stat().st_mode
        if mode & 0o005 != 0o005:
            p.chmod(mode | 0o755)
