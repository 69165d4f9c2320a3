"""The layer's own decisions over a traced run: the policy core (native/policy/core.c) replayed.

`replay(events, policy) -> CoreReplay` lays a run out (tasks.whatif.events.prepare), models the
usable size glibc gives each request (`glibc_usable`), and hands every array to
native/build/libheapcast_policy.so in one call (ctypes; the per-event loop is C, none here).
`LayerPolicy` holds the layer's options that decide (HL_OPTIONS in native/layers/layer.c, the
same names and defaults), and `LayerPolicy.env()` is the HEAPCAST_LAYER line that runs the real
layer under the same rules. `layer_policy(config)` maps the simulator's configs of the policies
the layer runs (largest, pools, layer_guided) to it: tasks/whatif/simulate.py computes those
through this module only.

What a trace cannot tell the replay is named once, in UNTOLD_BY_A_TRACE's file.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from tasks.core.config import StrictModel
from tasks.core.policy_names import current_policy
from tasks.dataset.contexts import NO_CONTEXT, event_contexts
from tasks.dataset.events_reader import StackFrames
from tasks.dataset.sites import SITE_VOCABULARY, call_sites
from tasks.dataset.tokens import size_class
from tasks.format.native_sources import POLICY_SOURCES, NativeBuildError, build_native
from tasks.learning.table.distill import allocation_contexts, context_key_index
from tasks.whatif.events import SimInput, prepare
from tasks.whatif.policies import (
    MMAP_THRESHOLD,
    LargestConfig,
    LayerGuidedConfig,
    PoolsConfig,
)

POLICY_RELPATH = Path("build") / "libheapcast_policy.so"
PAGE = 4096
# What a trace cannot tell the replay (of the layer's timing and threads) is named once, in the
# opening comment of this file (the C replay), and nowhere else: read it there. A replay of a run with several
# threads is exact only as far as those allow; test_policy_core holds it equal on one thread.
UNTOLD_BY_A_TRACE = "native/policy/replay.c"
CLASS_TABLE_SHAPE = (64, 64)  # the layer table's class scores (format 2 payload), uint8
SITE_CLASSES = 32  # a format 3 entry's key: site * SITE_CLASSES + size class (native/TABLE.md)
SITE_TABLE_SHAPE = (SITE_VOCABULARY, SITE_CLASSES)  # int16 keep scores, -1: no entry
CALL_SITES = "call_sites"  # SimInput.cache: int64 per row, its call site (`with_call_sites`)
# SimInput.cache: (depth, int64 per row: the context of the allocation of the block the row
# frees, at that depth; `with_allocation_contexts`)
ALLOC_CONTEXTS = "allocation_contexts"
_POLICIES = ("off", "largest", "pools", "guided")
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
# what the Python side adds (not the core's struct): the layer's `table_sites`, frees of blocks
# it tracked that a call-site entry answered (guided with a table of sites), and its
# `table_contexts`, those an allocation-context entry answered (a format 4 table)
SITED = "sited"
CONTEXTED = "contexted"
# per-row decision: request | fate << 2
REQUEST_NAMES = ("none", "hit", "miss")
FATE_NAMES = ("none", "kept", "unproven", "outgrown", "declined", "untracked", "heap")


class LayerPolicy(StrictModel):
    """The layer's options that decide (native/layers/layer.c HL_OPTIONS; same defaults)."""

    policy: Literal["off", "largest", "pools", "guided"] = "largest"
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

    @field_validator("policy", mode="before")
    @classmethod
    def _current(cls, v: object) -> object:
        return current_policy(v) if isinstance(v, str) else v  # a former name, as the layer

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
    # a table with site or context entries never asks its class scores (the layer's init.c: a
    # key the table lacks asks the thread's counter)
    if keyed(class_scores):
        class_scores = None
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
        fronts=int(p.policy in ("pools", "guided") and p.madv_ms != 0),
        class_table=None if class_scores is None else class_scores.ctypes.data,
    )


LayerConfig = LargestConfig | PoolsConfig | LayerGuidedConfig


def layer_policy(config: LayerConfig) -> tuple[LayerPolicy, int]:
    """The layer's options for a simulator config of a policy the layer runs, and its decay in
    ns (the layer's is in ms; the sweep goes below): (LayerPolicy, decay_ns)."""
    common = dict(min=max(config.min_size, 1), peak=config.peak, proof=config.proof)
    if isinstance(config, LargestConfig):
        return LayerPolicy(policy="largest", n=config.n, **common), 0
    if isinstance(config, PoolsConfig):
        return LayerPolicy(policy="pools", **common), config.decay_ns
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


@dataclass(frozen=True)
class ContextScores:
    """A format 4 table's (allocation context, size class) entries (native/TABLE.md): keys
    sorted by (context, class), unique; the contexts' depth in frames."""

    depth: int
    context: np.ndarray  # int64 [m], >= 0
    cls: np.ndarray  # int64 [m], 0..31
    score: np.ndarray  # uint8 [m]: the keep score

    def at(self, context: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """int16 [n]: the entry's score at each (context, class); -1 where none (NO_CONTEXT,
        or a key the table lacks): distill.context_key_index, as ClassTable.answer asks."""
        i = context_key_index(self.context, self.cls, context, cls)
        return np.where(i >= 0, self.score[np.maximum(i, 0)].astype(np.int16), -1).astype(np.int16)


def context_scores_of(entries: np.ndarray, depth: int) -> ContextScores | None:
    """A format 4 file's context entries (layer_file.CONTEXT_ENTRY, as layer_entries reads
    them: keys rising) at `depth`; None where there are none."""
    if len(entries) == 0:
        return None
    word = np.asarray(entries["word"], np.int64)
    return ContextScores(
        int(depth),
        np.asarray(entries["context"], np.uint64).astype(np.int64),
        word >> 8,
        (word & 0xFF).astype(np.uint8),
    )


class TableScores(np.ndarray):
    """A layer table's class scores (the array itself: uint8 [64, 64]), its call-site
    entries, `sites`: int16 SITE_TABLE_SHAPE, the keep score of (site, size class), -1 where
    the table has no entry, and its allocation-context entries, `contexts` (format 4); each
    None where the table has none. A table with neither (format 2, or 3 with none) answers by
    its class scores. With entries the layer never asks the class scores: at a free it asks the
    block's allocation context first, then the free's call site, and where the table lacks both
    keys the thread's counter (native/TABLE.md)."""

    sites: np.ndarray | None
    contexts: ContextScores | None

    def __array_finalize__(self, obj) -> None:
        self.sites = getattr(obj, "sites", None)
        self.contexts = getattr(obj, "contexts", None)


def keyed(scores: np.ndarray | None) -> bool:
    """Whether a table's scores have site or context entries (the layer's hl_use_sites): its
    frees ask those, then the counter, never the class scores."""
    return (
        getattr(scores, "sites", None) is not None or getattr(scores, "contexts", None) is not None
    )


def site_scores_of(entries: bytes | np.ndarray) -> np.ndarray | None:
    """A format 3 table's site entries (the payload after the class scores: uint32 LE words,
    (site * 32 + class) << 8 | score, native/TABLE.md) as int16 SITE_TABLE_SHAPE (-1: no
    entry); None where there are none."""
    raw = entries if isinstance(entries, bytes) else np.asarray(entries, np.uint8).tobytes()
    if len(raw) % 4:
        raise ValueError(f"a layer table's site entries are 4 bytes each, got {len(raw)} bytes")
    if not raw:
        return None
    w = np.frombuffer(raw, "<u4")
    key = (w >> 8).astype(np.int64)
    if key.max() >= SITE_VOCABULARY * SITE_CLASSES or np.any(np.diff(key) <= 0):
        raise ValueError("a layer table's site entries are out of range or do not rise")
    out = np.full(SITE_VOCABULARY * SITE_CLASSES, -1, np.int16)
    out[key] = (w & 0xFF).astype(np.int16)
    return out.reshape(SITE_TABLE_SHAPE)


def class_scores_of(
    payload: bytes | np.ndarray, contexts: ContextScores | None = None
) -> np.ndarray:
    """The scores a layer table file holds, as the core reads them: its payload's (after the
    header: tasks.learning.table.distill) first 64 * 64 bytes, uint8 [64, 64], C order; given the whole
    payload of a format 3 file (bytes, or a flat uint8 array), its site entries after them too,
    parsed once (`site_scores_of`): a TableScores whose `sites` the replay asks first, as the
    layer does. A [64, 64] array keeps the sites and contexts it carries (`contexts`: a format 4
    file's, context_scores_of, given with the payload)."""
    a = np.frombuffer(payload, np.uint8) if isinstance(payload, bytes) else np.asarray(payload)
    n = CLASS_TABLE_SHAPE[0] * CLASS_TABLE_SHAPE[1]
    if a.size < n:
        raise ValueError(f"a layer table's class scores are {n} bytes, got {a.size}")
    flat = a.reshape(-1)
    sites = getattr(payload, "sites", None)
    contexts = contexts if contexts is not None else getattr(payload, "contexts", None)
    if a.ndim == 1 and a.size > n:
        sites = site_scores_of(flat[n:])
    scores = np.ascontiguousarray(flat[:n].astype(np.uint8).reshape(CLASS_TABLE_SHAPE))
    if sites is None and contexts is None:
        return scores
    out = scores.view(TableScores)
    out.sites, out.contexts = sites, contexts
    return out


def with_call_sites(x: SimInput, table: pa.Table) -> SimInput:
    """`x` (prepared from `table`) with each row's call site (tasks.dataset.sites.call_sites,
    the key the layer computes at a free; -1: none, as in a trace without callers) in
    simulation order, where a table with site entries asks them (`core_batch`). Returns `x`."""
    x.cache[CALL_SITES] = x.align(call_sites(table))
    return x


def with_allocation_contexts(
    x: SimInput, table: pa.Table, frames: StackFrames | None, depth: int
) -> SimInput:
    """`x` (prepared from `table`) with, at each row that frees a block, the context of the
    block's allocation at `depth` frames (what the layer keeps in the block's slot and a format
    4 table's entries key on), as the evaluation finds it: the rows' contexts from the run's
    stacks (tasks.dataset.contexts.event_contexts, `frames`, the `stack` column), then
    distill.allocation_contexts; NO_CONTEXT everywhere for a run without stacks (frames None,
    or none recorded), whose frees then ask the site entries and the counter. Returns `x`."""
    if frames is None or "stack" not in table.column_names:
        rows = np.full(table.num_rows, NO_CONTEXT, np.int64)
    else:
        rows = event_contexts(frames, table.column("stack"), (depth,))[depth]
    x.cache[ALLOC_CONTEXTS] = (int(depth), x.align(allocation_contexts(table, rows)))
    return x


def row_site_scores(
    x: SimInput, sites: np.ndarray | None, contexts: ContextScores | None = None
) -> np.ndarray:
    """int16 per row (simulation order): the table's entry at the free in the row (a realloc's
    old block included), as the layer asks it (policy.c hl_keep_at_free) at the size class of
    the block's request (the layer's hcp_class of its req, 0 read as 1): the entry of (the
    block's allocation context, class) where `contexts` holds it (`with_allocation_contexts`),
    else of (the row's call site, class) where `sites` holds it; -1 where the row frees
    nothing known or the table has neither (the layer then asks the thread's counter)."""
    return _row_scores(x, sites, contexts)[0]


def _row_scores(
    x: SimInput, sites: np.ndarray | None, contexts: ContextScores | None
) -> tuple[np.ndarray, np.ndarray]:
    """row_site_scores, and bool per row: a context entry answered."""
    a = x.partner
    frees = (x.freed >= 0) & (a >= 0)
    req = x.req[np.maximum(a, 0)]
    cls = size_class(np.where(req > 0, req, 1)).astype(np.int64)
    score = np.full(x.n, -1, np.int16)
    if sites is not None:
        if CALL_SITES not in x.cache:
            raise ValueError(
                "a layer table with call-site entries needs the run's call sites: "
                "policy_core.with_call_sites(prepare(table), table)"
            )
        site = np.asarray(x.cache[CALL_SITES], np.int64)
        at = frees & (site >= 0) & (site < SITE_VOCABULARY)
        score = np.where(at, sites[np.where(at, site, 0), cls], -1).astype(np.int16)
    by_context = np.zeros(x.n, bool)
    if contexts is not None:
        depth, alloc = x.cache.get(ALLOC_CONTEXTS, (None, None))
        if depth != contexts.depth:
            raise ValueError(
                f"a layer table with allocation-context entries at depth {contexts.depth} needs "
                "the run's allocation contexts at that depth: policy_core."
                "with_allocation_contexts(x, table, frames, depth) (frames None: a run without "
                "stacks)"
            )
        ctx = contexts.at(np.where(frees, alloc, NO_CONTEXT), cls)
        by_context = ctx >= 0
        score = np.where(by_context, ctx, score).astype(np.int16)
    return np.ascontiguousarray(score, np.int16), by_context


class PolicyCoreBuildError(NativeBuildError):
    """The core's library cannot be built; the message names the tool or make's error."""


def build_policy_core(native_dir: str | Path | None = None) -> Path:
    """`make -C native policy` when a source is newer than the library; its path."""
    return build_native(
        "policy",
        POLICY_RELPATH.name,
        POLICY_SOURCES,
        "the policy core",
        native_dir,
        PolicyCoreBuildError,
    )


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
            + [ptr] * 8
        )
        lib.hpc_sizes.argtypes = [ptr]
        lib.hpc_glibc_usable.argtypes = [ctypes.c_int64, ptr, ptr, ctypes.c_uint64, ptr]
        lib.hpc_replay_stats.argtypes = [ptr, ctypes.c_int32, ptr]
        _LIB = lib
    return _LIB


def _sizes() -> tuple[int, int, int, int]:
    out = np.zeros(4, np.int64)
    _lib().hpc_sizes(out.ctypes.data)
    return tuple(int(v) for v in out)  # type: ignore[return-value]


def glibc_usable(req: np.ndarray, align: np.ndarray, mmap_threshold: int) -> np.ndarray:
    """glibc's malloc_usable_size of the block it makes for each request, as the layer sees it
    (-1 where req < 0): the model is native/policy/replay.c's hpc_usable, one C loop."""
    req = np.ascontiguousarray(req, np.int64)
    align = np.ascontiguousarray(np.broadcast_to(align, req.shape), np.int64)
    out = np.empty(len(req), np.int64)
    _lib().hpc_glibc_usable(
        len(req), req.ctypes.data, align.ctypes.data, mmap_threshold, out.ctypes.data
    )
    return out


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
    # int16 per row: the table's context or call-site entry (row_site_scores), -1: none
    site_score: np.ndarray | None = None
    by_context: np.ndarray | None = None  # bool per row: a context entry gave site_score

    @property
    def n(self) -> int:
        return len(self.arrays[0])


def thread_exits(
    proc: np.ndarray, thread: np.ndarray, n_threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each thread's process (int32 per thread, -1: no row), and where threads exit (uint8 per
    row): after the last row of every thread but its process's first, whose front the layer keeps
    to the end (a trace records no exit: native/policy/replay.c names it). O(n): ufunc.at, no
    sort."""
    n = len(thread)
    t_count = max(n_threads, 1)
    thread_proc = np.full(t_count, -1, np.int32)
    exits = np.zeros(n, np.uint8)
    if n == 0:
        return thread_proc, exits
    rows = np.arange(n, dtype=np.int64)
    first = np.full(t_count, n, np.int64)
    np.minimum.at(first, thread, rows)
    last = np.full(t_count, -1, np.int64)
    np.maximum.at(last, thread, rows)
    seen = last >= 0
    thread_proc[seen] = proc[first[seen]]
    proc_first = np.full(int(proc.max()) + 1, n, np.int64)
    np.minimum.at(proc_first, proc, rows)
    main = np.zeros(t_count, bool)
    main[thread[proc_first[proc_first < n]]] = True
    exits[last[seen & ~main]] = 1
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
    (`class_scores_of`), which the layer asks instead of its counter; with entries, the
    allocation-context entries (TableScores.contexts) first, then the call-site entries
    (TableScores.sites), and the counter where the table has neither, the class scores never
    (the run's call sites: `with_call_sites`; its allocation contexts:
    `with_allocation_contexts`)."""
    site_score = by_context = None
    if class_scores is not None:
        class_scores = class_scores_of(class_scores)
        if keyed(class_scores) and policy.policy == "guided":
            site_score, by_context = _row_scores(
                x,
                class_scores.sites,
                class_scores.contexts,  # type: ignore[attr-defined]
            )
    n = x.n
    align = x.align_req if x.align_req is not None else np.zeros(n, np.int64)
    addr = x.addr_align if x.addr_align is not None else np.full(n, 16, np.int64)
    thread = x.thread if x.thread is not None else x.proc
    n_threads = x.n_threads if x.thread is not None else x.n_proc
    usable = glibc_usable(x.req, align, mmap_threshold)

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
        site_score,
        by_context,
    )


def run_batch(b: CoreBatch) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """One C call over the whole batch: (the counters, per-row decision, usable bytes got, bytes
    its process keeps after the row), the rows in simulation order. The counters are STATS and
    SITED and CONTEXTED (0 without a table's entries)."""
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
        b.site_score.ctypes.data if b.site_score is not None else None,
    )
    out = np.zeros(len(STATS), np.uint64)
    lib.hpc_replay_stats(caches.ctypes.data, b.n_proc, out.ctypes.data)
    stats = dict(zip(STATS, (int(v) for v in out)))
    stats[SITED], stats[CONTEXTED] = _sited(b, decision, row_tracked)
    return stats, decision, got_usable, kept_bytes


def _sited(b: CoreBatch, decision: np.ndarray, row_tracked: np.ndarray) -> tuple[int, int]:
    """The layer's `table_sites` and `table_contexts`: frees of blocks it tracked (hpc_free's
    fates: kept, unproven, outgrown, declined; the block tracked) whose call-site entry, whose
    allocation-context entry answered."""
    if b.site_score is None:
        return 0, 0
    partner = b.arrays[2]
    fate = decision >> 2
    tracked = (partner >= 0) & (row_tracked[np.maximum(partner, 0)] == 1)
    asked = (fate >= 1) & (fate <= 4) & tracked & (b.site_score >= 0)
    by_context = b.by_context if b.by_context is not None else np.zeros(len(asked), bool)
    return int(np.count_nonzero(asked & ~by_context)), int(np.count_nonzero(asked & by_context))


def replay(
    events: pa.Table | SimInput,
    policy: LayerPolicy = LayerPolicy(),
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    decay_ns: int | None = None,
    class_scores: np.ndarray | None = None,
    frames: StackFrames | None = None,
) -> CoreReplay:
    """The layer's decisions (the policy core) over one run's events, in one C call. Given a
    table (not a prepared run), its rows' call sites too (`with_call_sites`), and where the
    table's scores have context entries, its blocks' allocation contexts from the run's stacks
    `frames` (`with_allocation_contexts`; None: a run without stacks)."""
    if isinstance(events, SimInput):
        x = events
    else:
        x = with_call_sites(prepare(events), events)
        contexts = getattr(class_scores, "contexts", None)
        if contexts is not None:
            with_allocation_contexts(x, events, frames, contexts.depth)
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
