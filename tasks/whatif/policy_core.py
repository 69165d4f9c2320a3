"""The layer's own decisions over a traced run: the policy core (native/policy/core.c) replayed.

`replay(events, policy) -> CoreReplay` lays a run out (tasks.whatif.events.prepare), models the
usable size glibc gives each request (`glibc_usable`), and hands every array to
native/build/libheapcast_policy.so in one call (ctypes; the per-event loop is C, none here).
`LayerPolicy` holds the layer's options that decide (HL_OPTIONS in native/layers/layer.c, the
same names and defaults), and `LayerPolicy.env()` is the HEAPCAST_LAYER line that runs the real
layer under the same rules. `layer_policy(config)` maps the simulator's configs of the policies
the layer runs (seed002, seed001, layer_guided) to it: tasks/whatif/simulate.py computes those
through this module only.

What a trace cannot tell the replay is named once, in UNTOLD_BY_A_TRACE's file.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from tasks.core.config import StrictModel
from tasks.whatif.events import SimInput, prepare
from tasks.whatif.policies import (
    MMAP_THRESHOLD,
    LayerGuidedConfig,
    Seed001Config,
    Seed002Config,
)

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
POLICY_RELPATH = Path("build") / "libheapcast_policy.so"
POLICY_SOURCES = ("policy/replay.c", "policy/core.c", "policy/core.h", "layers/predictor.h")
PAGE = 4096
# What a trace cannot tell the replay (of the layer's timing and threads) is named once, in the
# opening comment of this file (the C replay), and nowhere else: read it there. A replay of a run with several
# threads is exact only as far as those allow; test_policy_core holds it equal on one thread.
UNTOLD_BY_A_TRACE = "native/policy/replay.c"
CLASS_TABLE_SHAPE = (64, 64)  # the layer table's class scores (format 2 payload), uint8
_POLICIES = ("off", "seed002", "seed001", "guided")
# struct hpc_stats' fields, in order (native/policy/core.h), then what replay.c adds
STATS = (
    "hits",
    "misses",
    "kept",
    "bytes_kept_peak",
    "given_back",
    "bytes_given_back",
    "decayed",
    "outgrown",
    "heap",
    "declined",
    "unproven",
    "untracked",
    "bounded",
    "live_peak",
    "proof_hits",
    "regret_hits",
    "regret_keeps",
    "bytes_kept_at_exit",
    "bytes_in_fronts",
)
# per-row decision: request | fate << 2
REQUEST_NAMES = ("none", "hit", "miss")
FATE_NAMES = ("none", "kept", "unproven", "outgrown", "declined", "untracked", "heap")


class LayerPolicy(StrictModel):
    """The layer's options that decide (native/layers/layer.c HL_OPTIONS; same defaults)."""

    policy: Literal["off", "seed002", "seed001", "guided"] = "seed002"
    min: int = Field(default=128 * 1024, gt=0)
    cap: int = Field(default=1 << 30, ge=0)
    n: int = Field(default=4, ge=0, le=64)
    decay_ms: int = Field(default=1000, ge=0)
    topk: int = Field(default=2, ge=1, le=64)
    horizon: int = Field(default=4, ge=1, le=64)
    peak: int | None = Field(default=4, ge=0, le=1000)
    proof: int = Field(default=2, ge=0, le=1 << 20)
    regret: bool = False
    # madv: only whether it is 0 matters to the decisions (madv=0: no fronts); None: off
    madv_ms: int | None = 100
    scope: Literal["mapped", "all"] = "mapped"

    def env(self, stats: str | None = None) -> str:
        """HEAPCAST_LAYER for the real layer under these rules."""
        items = {
            "policy": self.policy,
            "min": self.min,
            "cap": self.cap,
            "n": self.n,
            "decay": self.decay_ms,
            "topk": self.topk,
            "horizon": self.horizon,
            "peak": "off" if self.peak is None else self.peak,
            "proof": self.proof,
            "regret": int(self.regret),
            "madv": "off" if self.madv_ms is None else self.madv_ms,
            "scope": self.scope,
        }
        if stats:
            items["stats"] = stats
        return ",".join(f"{k}={v}" for k, v in items.items())


class _Settings(ctypes.Structure):  # struct hpc_settings
    _fields_ = [
        ("policy", ctypes.c_int32),
        ("n", ctypes.c_int32),
        ("min", ctypes.c_uint64),
        ("cap", ctypes.c_uint64),
        ("decay_ns", ctypes.c_uint64),
        ("topk", ctypes.c_int32),
        ("horizon", ctypes.c_int32),
        ("peak", ctypes.c_int32),
        ("proof", ctypes.c_int32),
        ("regret", ctypes.c_int32),
        ("fronts", ctypes.c_int32),
        ("class_table", ctypes.c_void_p),
    ]


def _settings(p: LayerPolicy, decay_ns: int | None, class_scores: np.ndarray | None) -> _Settings:
    return _Settings(
        policy=_POLICIES.index(p.policy),
        n=p.n,
        min=p.min,
        cap=p.cap,
        decay_ns=p.decay_ms * 1_000_000 if decay_ns is None else decay_ns,
        topk=p.topk,
        horizon=p.horizon,
        peak=-1 if p.peak is None else p.peak,
        proof=p.proof,
        regret=int(p.regret),
        fronts=int(p.policy in ("seed001", "guided") and p.madv_ms != 0),
        class_table=None if class_scores is None else class_scores.ctypes.data,
    )


LayerConfig = Seed002Config | Seed001Config | LayerGuidedConfig


def layer_policy(config: LayerConfig) -> tuple[LayerPolicy, int]:
    """The layer's options for a simulator config of a policy the layer runs, and its decay in
    ns (the layer's is in ms; the sweep goes below): (LayerPolicy, decay_ns)."""
    common = dict(min=max(config.min_size, 1), peak=config.peak, proof=config.proof)
    if isinstance(config, Seed002Config):
        return LayerPolicy(policy="seed002", n=config.n, **common), 0
    if isinstance(config, Seed001Config):
        return LayerPolicy(policy="seed001", **common), config.decay_ns
    return (
        LayerPolicy(
            policy="guided",
            topk=config.topk,
            horizon=config.horizon,
            regret=config.regret,
            **common,
        ),
        config.decay_ns,
    )


def class_scores_of(payload: bytes | np.ndarray) -> np.ndarray:
    """The class scores a layer table file holds (its payload's first 64 * 64 bytes, after the
    header: tasks.learning.table), as the core reads them: uint8 [64, 64], C order."""
    a = np.frombuffer(payload, np.uint8) if isinstance(payload, bytes) else np.asarray(payload)
    n = CLASS_TABLE_SHAPE[0] * CLASS_TABLE_SHAPE[1]
    if a.size < n:
        raise ValueError(f"a layer table's class scores are {n} bytes, got {a.size}")
    return np.ascontiguousarray(a.reshape(-1)[:n].astype(np.uint8).reshape(CLASS_TABLE_SHAPE))


class PolicyCoreBuildError(RuntimeError):
    """The core's library cannot be built; the message names the tool or make's error."""


def build_policy_core(native_dir: str | Path | None = None) -> Path:
    """`make -C native policy` when a source is newer than the library; its path."""
    native = Path(native_dir or NATIVE_DIR).resolve()
    lib = native / POLICY_RELPATH
    try:
        built = lib.stat().st_mtime_ns
        if all((native / s).stat().st_mtime_ns <= built for s in POLICY_SOURCES + ("Makefile",)):
            return lib
    except FileNotFoundError:
        pass
    for tool in ("make", "cc"):
        if shutil.which(tool) is None:
            raise PolicyCoreBuildError(f"cannot build the policy core: `{tool}` is not on PATH")
    proc = subprocess.run(["make", "-C", str(native), "policy"], capture_output=True, text=True)
    if proc.returncode != 0 or not lib.is_file():
        raise PolicyCoreBuildError(
            f"`make -C {native} policy` failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return lib


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(build_policy_core()))
        ptr = ctypes.c_void_p
        lib.hpc_replay.restype = ctypes.c_int64
        lib.hpc_replay.argtypes = (
            [ctypes.POINTER(_Settings), ctypes.c_int64]
            + [ptr] * 9
            + [ptr, ctypes.c_int32, ptr, ctypes.c_int32, ptr, ctypes.c_uint64]
            + [ctypes.c_int32, ctypes.c_int32]
            + [ptr] * 7
        )
        lib.hpc_sizes.argtypes = [ptr]
        lib.hpc_replay_stats.argtypes = [ptr, ctypes.c_int32, ptr]
        _LIB = lib
    return _LIB


def _sizes() -> tuple[int, int, int, int]:
    out = np.zeros(4, np.int64)
    _lib().hpc_sizes(out.ctypes.data)
    return tuple(int(v) for v in out)  # type: ignore[return-value]


def glibc_usable(req: np.ndarray, align: np.ndarray, mmap_threshold: int) -> np.ndarray:
    """glibc's malloc_usable_size of the block it makes for each request (as
    the layer sees it): mapped (>= the threshold), the mapping less the
    pointer's offset in it (16, or the alignment asked for, whose chunk glibc maps with room to
    align it); on the heap, the chunk less 8."""
    req = np.asarray(req, np.int64)
    align = np.asarray(align, np.int64)

    def chunk(s):
        return np.maximum((s + 8 + 15) & ~15, 32)

    def pages(x):
        return (x + PAGE - 1) // PAGE * PAGE

    mapped = np.where(
        align <= 16,
        pages(chunk(req) + 8) - 16,
        pages(chunk(chunk(req) + align + 32) + 8) - align,
    )
    return np.where(req < mmap_threshold, chunk(req) - 8, mapped)


@dataclass(frozen=True)
class CoreReplay:
    """What the core decided over a run: the layer's counters (STATS, summed over processes),
    and per row of the input table the request's outcome and the free's fate (REQUEST_NAMES,
    FATE_NAMES codes) and the usable bytes the request got (-1: none)."""

    stats: dict[str, int]
    request: np.ndarray
    fate: np.ndarray
    got_usable: np.ndarray
    kept_bytes: np.ndarray  # per row: usable bytes its process keeps after it (cache + fronts)

    @property
    def passed(self) -> int:
        """The layer's `passed`: misses and frees left to the next allocator."""
        s = self.stats
        return s["misses"] + s["heap"] + s["outgrown"] + s["declined"] + s["unproven"]


@dataclass(frozen=True)
class CoreBatch:
    """A run's events as the C replay takes them (`core_batch`), with the buffers it writes."""

    arrays: tuple[np.ndarray, ...]  # req, freed, partner, align, addr, usable, time, proc, thread
    n_proc: int
    n_threads: int
    settings: _Settings
    scope_all: int
    mmap_threshold: int
    counters: bool  # guided: a counter per thread
    class_scores: np.ndarray | None = None  # kept alive: settings.class_table points into it
    thread_proc: np.ndarray | None = None  # int32 per thread: its process (steals)
    exits: np.ndarray | None = None  # uint8 per row: a thread exits after it

    @property
    def n(self) -> int:
        return len(self.arrays[0])


def thread_exits(
    proc: np.ndarray, thread: np.ndarray, n_threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each thread's process (int32 per thread, -1: no row), and where threads exit (uint8 per
    row): after the last row of every thread but its process's first, whose front the layer keeps
    to the end (a trace records no exit: native/policy/replay.c names it)."""
    n = len(thread)
    thread_proc = np.full(max(n_threads, 1), -1, np.int32)
    exits = np.zeros(n, np.uint8)
    if n == 0:
        return thread_proc, exits
    threads, first = np.unique(thread, return_index=True)
    thread_proc[threads] = proc[first]
    rthreads, rfirst = np.unique(thread[::-1], return_index=True)
    last = n - 1 - rfirst
    _, proc_first = np.unique(proc, return_index=True)
    main = np.zeros(max(n_threads, 1), bool)
    main[thread[proc_first]] = True
    exits[last[~main[rthreads]]] = 1
    return thread_proc, exits


def core_batch(
    x: SimInput,
    policy: LayerPolicy,
    mmap_threshold: int = MMAP_THRESHOLD,
    *,
    decay_ns: int | None = None,
    class_scores: np.ndarray | None = None,
) -> CoreBatch:
    """The replay's input arrays of a prepared run (the usable sizes modelled here, in numpy).
    `decay_ns` overrides the policy's decay_ms; `class_scores` (guided): a table's class scores
    (`class_scores_of`), which the layer asks instead of its counter."""
    if class_scores is not None:
        class_scores = class_scores_of(class_scores)
    n = x.n
    align = x.align_req if x.align_req is not None else np.zeros(n, np.int64)
    addr = x.addr_align if x.addr_align is not None else np.full(n, 16, np.int64)
    thread = x.thread if x.thread is not None else x.proc
    n_threads = x.n_threads if x.thread is not None else x.n_proc
    usable = glibc_usable(np.maximum(x.req, 0), align, mmap_threshold)
    usable = np.where(x.req >= 0, usable, -1)

    def c(a, dtype=np.int64):
        return np.ascontiguousarray(a, dtype)

    arrays = (
        c(x.req),
        c(x.freed),
        c(x.partner),
        c(align),
        c(addr, np.uint64),
        c(usable),
        c(x.time),
        c(x.proc, np.int32),
        c(thread, np.int32),
    )
    thread_proc, exits = thread_exits(arrays[7], arrays[8], n_threads)
    return CoreBatch(
        arrays,
        x.n_proc,
        n_threads,
        _settings(policy, decay_ns, class_scores),
        int(policy.scope == "all"),
        mmap_threshold,
        policy.policy == "guided",
        class_scores,
        thread_proc,
        exits,
    )


def run_batch(b: CoreBatch) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """One C call over the whole batch: (the counters, per-row decision, usable bytes got, bytes
    its process keeps after the row), the rows in simulation order."""
    cache_size, thread_size, counter_size, _ = _sizes()
    caches = np.zeros(max(b.n_proc, 1) * cache_size, np.uint8)
    threads = np.zeros(max(b.n_threads, 1) * thread_size, np.uint8)
    counters = np.zeros(max(b.n_threads, 1) * counter_size, np.uint8) if b.counters else None
    n = b.n
    decision = np.zeros(n, np.uint8)
    got_usable = np.zeros(n, np.int64)
    row_p = np.zeros(n, np.uint64)
    row_tracked = np.zeros(n, np.uint8)
    kept_bytes = np.zeros(n, np.int64)
    lib = _lib()
    lib.hpc_replay(
        ctypes.byref(b.settings),
        n,
        *[a.ctypes.data for a in b.arrays],
        caches.ctypes.data,
        b.n_proc,
        threads.ctypes.data,
        b.n_threads,
        counters.ctypes.data if counters is not None else None,
        b.mmap_threshold,
        b.scope_all,
        1,
        decision.ctypes.data,
        got_usable.ctypes.data,
        row_p.ctypes.data,
        row_tracked.ctypes.data,
        kept_bytes.ctypes.data,
        b.thread_proc.ctypes.data if b.thread_proc is not None else None,
        b.exits.ctypes.data if b.exits is not None else None,
    )
    out = np.zeros(len(STATS), np.uint64)
    lib.hpc_replay_stats(caches.ctypes.data, b.n_proc, out.ctypes.data)
    return dict(zip(STATS, (int(v) for v in out))), decision, got_usable, kept_bytes


def replay(
    events: pa.Table | SimInput,
    policy: LayerPolicy = LayerPolicy(),
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    decay_ns: int | None = None,
    class_scores: np.ndarray | None = None,
) -> CoreReplay:
    """The layer's decisions (the policy core) over one run's events, in one C call."""
    x = events if isinstance(events, SimInput) else prepare(events)
    batch = core_batch(x, policy, mmap_threshold, decay_ns=decay_ns, class_scores=class_scores)
    stats, decision, got_usable, kept = run_batch(batch)
    n = x.n
    request = np.empty(n, np.uint8)  # back to the input table's rows
    fate = np.empty(n, np.uint8)
    got = np.empty(n, np.int64)
    kept_bytes = np.empty(n, np.int64)
    request[x.row] = decision & 3
    fate[x.row] = decision >> 2
    got[x.row] = got_usable
    kept_bytes[x.row] = kept
    return CoreReplay(stats, request, fate, got, kept_bytes)
