"""What the program does to its heap, read from one traced run: the facts `heapcast tune` derives
its candidates from (tasks.allocators.advise).

Takes the tracer's files of one run (native/FORMAT.md, callers on), read by the one reader
(tasks.format.trace_reader) and paired by the converter (tasks.dataset.convert_trace: lifetimes,
freed sizes), and the probe's lines of the same run. Gives a frozen `HeapFacts`: the large sizes
freed again and again (`REPEATED` times at least) and their peak bytes, the depth of small-size
churn, peak live heap bytes against peak RSS, the most threads allocating in one process, the
freed blocks' lifetimes, and mallopt (the probe's lines and the modules that import it). Each
fact: docs/allocators.md#advice-from-the-trace.

Per-event work is numpy over the converter's Arrow columns; the Python loops are over files and
modules.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dataset.convert import convert_groups
from tasks.format.trace_reader import (
    ALLOCATING_OPS,
    TRACE_SUFFIX,
    Op,
    TraceFormatError,
    read_trace,
)
from tasks.replay.runners.preload import parse_probe

REPEATED = 3  # a large size allocated and freed at least this often churns
TCACHE_MAX_BYTES = 1032  # glibc's default tcache_max: the largest request tcache holds
TCACHE_COUNT = 7  # glibc's default tcache_count: blocks per size held by a thread
SHORT_LIVED_NS = 1_000_000  # "short-lived": freed within 1 ms
CHURN_QUANTILE = 0.95  # the depth that covers this share of small frees
# placement (the small blocks that outlive the others), by the placement layer's own rule
# (native/layers/place.c, its defaults): a block is long-lived when it is still live
# PLACE_HORIZON allocations (of its process) after its own, short when freed before; a call site
# is long when at least 2 of its blocks, and at least half, are long-lived
PLACE_HORIZON = 262144


class TraceFactsError(RuntimeError):
    """The traced run left nothing readable; the message names the folder."""


@dataclass(frozen=True)
class SizeChurn:
    """One large size (rounded up to 4 KiB) allocated and freed `count` times."""

    size: int
    count: int


@dataclass(frozen=True)
class HeapFacts:
    """What decides the allocator's settings, from one traced run (see the module)."""

    processes: int
    allocations: int  # allocation calls (malloc family and realloc)
    frees: int  # free calls
    span_s: float  # from the first heap call to the last, under the tracer
    allocating_threads: int  # the most threads that allocated in one process
    large_block_bytes: int  # what counts as large
    large_churn: tuple[SizeChurn, ...]  # sizes freed >= REPEATED times, largest first
    large_churn_bytes: int  # bytes allocated at those sizes, all calls
    large_live_peak_bytes: int  # the most bytes held at once in large blocks (one process)
    small_reuses: int  # allocations up to TCACHE_MAX_BYTES served by a block the thread freed
    small_churn_depth: int  # CHURN_QUANTILE of the blocks waiting at those reuses
    peak_live_bytes: int  # the most live heap bytes at once (one process)
    peak_rss_bytes: int | None  # the traced run's peak process RSS
    wall_s: float | None  # the traced run's wall time (the tracer's cost in it)
    median_lifetime_us: float | None  # of the blocks freed
    short_lived_share: float  # of the blocks freed, freed within SHORT_LIVED_NS
    # small blocks (<= TCACHE_MAX_BYTES) and their lifetimes, for placement (the process with
    # the highest small peak): the most bytes live at once, the allocations, the long-lived ones
    # (PLACE_HORIZON) allocated while short ones came and went (between the first short
    # block's allocation and the last one's free), their bytes, and how many of them came from
    # long call sites (sites whose blocks mostly outlive: what a per-site counter can tell apart),
    # and whether the trace has call sites at all (callers on)
    small: SmallLives = field(default_factory=lambda: SmallLives())
    mallopt_calls: tuple[str, ...] = ()  # "M_MMAP_THRESHOLD=131072 (pid 12)" as the probe saw
    mallopt_importers: tuple[str, ...] = ()  # mapped modules importing mallopt
    mallopt_checked: str = "by the probe in the traced run"  # how mallopt imports were looked for
    notes: tuple[str, ...] = field(default=())  # files skipped, tools missing

    @property
    def largest_churned(self) -> int:
        return max((c.size for c in self.large_churn), default=0)

    @property
    def heap_calls(self) -> int:
        return self.allocations + self.frees

    def lines(self) -> list[str]:
        """The facts as short lines, for the terminal and the page."""
        mib = 1024 * 1024
        out = [
            f"{self.allocations:,} allocations and {self.frees:,} frees in {self.span_s:.2f} s "
            f"(traced), {self.processes} process(es), at most {self.allocating_threads} "
            "allocating thread(s) in one",
        ]
        if self.large_churn:
            top = ", ".join(f"{c.size / mib:.1f} MiB x{c.count}" for c in self.large_churn[:4])
            out.append(
                f"large blocks (>= {self.large_block_bytes // 1024} KiB) allocated and freed "
                f"repeatedly: {top}; {self.large_churn_bytes / mib:,.0f} MiB in all, at most "
                f"{self.large_live_peak_bytes / mib:.1f} MiB held at once"
            )
        else:
            out.append(
                f"no large block (>= {self.large_block_bytes // 1024} KiB) allocated and freed "
                f"{REPEATED} times or more"
            )
        if not self.small_reuses:
            out.append(f"no small block (<= {TCACHE_MAX_BYTES} B) freed and requested again")
        else:
            out.append(
                f"small blocks (<= {TCACHE_MAX_BYTES} B): {self.small_reuses:,} requests could reuse "
                f"a block their thread freed; for {CHURN_QUANTILE:.0%} of them at most "
                f"{self.small_churn_depth} blocks of the size were waiting (glibc's tcache holds "
                f"{TCACHE_COUNT} per size)"
            )
        rss = (
            f" against a peak RSS of {self.peak_rss_bytes / mib:,.1f} MiB"
            if self.peak_rss_bytes
            else ""
        )
        out.append(f"peak live heap {self.peak_live_bytes / mib:,.1f} MiB{rss}")
        small = self.small
        if small.allocations:
            sites = (
                f", {small.long_from_long_sites:,} of them from {small.long_sites} "
                f"call site(s) whose blocks mostly outlive (short blocks from "
                f"{small.short_sites} other site(s))"
                if small.call_sites
                else " (no call sites in the trace)"
            )
            out.append(
                f"small blocks (<= {TCACHE_MAX_BYTES} B): {small.allocations:,} allocated, "
                f"at most {small.live_peak_bytes / mib:,.1f} MiB live at once; "
                f"{small.long_blocks:,} ({small.long_bytes / mib:,.1f} MiB) outlived the "
                f"others (still live {PLACE_HORIZON:,} allocations later){sites}"
            )
        if self.median_lifetime_us is not None:
            out.append(
                f"blocks freed: median lifetime {self.median_lifetime_us:,.0f} µs, "
                f"{self.short_lived_share:.0%} freed within 1 ms"
            )
        if self.mallopt_calls:
            out.append("the program calls mallopt itself: " + ", ".join(self.mallopt_calls))
        elif self.mallopt_importers:
            out.append(
                "no mallopt call seen, but these modules import mallopt: "
                + ", ".join(Path(p).name for p in self.mallopt_importers)
            )
        else:
            out.append(f"no mallopt call ({self.mallopt_checked})")
        return out + [f"note: {n}" for n in self.notes]


def _running_min_by_group(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The running minimum of `values` restarted at each group start (groups are contiguous,
    `starts` their first indices, ascending, starting with 0): each group is shifted below every
    earlier one, so one np.minimum.accumulate serves all groups."""
    n = len(values)
    group = np.zeros(n, dtype=np.int64)
    group[starts[1:]] = 1
    group = np.cumsum(group)
    span = int(values.max() - values.min()) + 1 if n else 1
    shifted = values - group * span
    return np.minimum.accumulate(shifted) + group * span


def small_churn_depths(thread: np.ndarray, op: np.ndarray, size: np.ndarray) -> np.ndarray:
    """At each allocation of a small block that reuses one (its thread had freed blocks of its
    16-byte size class and not yet taken them back), how many such blocks were waiting: the
    depth a thread cache needs for that reuse. Frees never followed by a request of their class
    (a program's teardown) count for nothing. Rows in call order (`size`: the freed block's on
    free rows); allocations and frees only."""
    if len(op) == 0:
        return np.zeros(0, np.int64)
    cls = (size.astype(np.int64) + 15) // 16
    key = thread.astype(np.int64) * 1024 + cls
    order = np.argsort(key, kind="stable")  # stable: call order kept within a key
    k = key[order]
    step = np.where(op[order] == Op.FREE, 1, -1).astype(np.int64)
    level = np.cumsum(step)
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    base = np.repeat(level[starts] - step[starts], np.diff(np.r_[starts, len(k)]))
    level = level - base  # each key's own running count, from 0
    low = _running_min_by_group(level, starts)
    # the running minimum before each row (0 at a key's first row)
    low_before = np.r_[0, low[:-1]]
    low_before[starts] = 0
    low_before = np.minimum(low_before, 0)
    waiting = (level - step) - low_before
    return waiting[(step < 0) & (waiting > 0)]


def mallopt_importers(paths: list[str]) -> tuple[tuple[str, ...], str]:
    """The files among `paths` whose dynamic symbols import mallopt, and how that was checked."""
    nm = shutil.which("nm")
    files = [p for p in paths if p.startswith("/") and Path(p).is_file()]
    if nm is None:
        return (), "mallopt imports not checked: nm is not installed (apt-get install binutils)"
    if not files:
        return (), "no module file to check for mallopt imports"
    proc = subprocess.run(
        [nm, "-D", "--undefined-only", "-A", *files], capture_output=True, text=True
    )
    found = []
    for line in proc.stdout.splitlines():  # one line per imported symbol, not per event
        name, _, rest = line.partition(":")
        words = rest.split()
        if words and words[-1].split("@")[0] == "mallopt":
            found.append(name)
    how = f"the probe saw none; nm -D found no import of mallopt in the {len(files)} mapped modules"
    return tuple(dict.fromkeys(found)), how


@dataclass(frozen=True)
class _FileFacts:
    allocations: int
    frees: int
    t_lo: int
    t_hi: int
    threads: int
    churn_sizes: np.ndarray  # page-rounded sizes of the large blocks freed
    large_peak: int
    depths: np.ndarray  # small_churn_depths
    lifetimes: np.ndarray  # of the blocks freed (every `stride`-th in a long trace)
    live_peak: int
    small: SmallLives | None = None


@dataclass(frozen=True)
class SmallLives:
    """One process image's small blocks, as placement sees them (HeapFacts' small_* fields)."""

    live_peak_bytes: int = 0
    allocations: int = 0
    long_blocks: int = 0
    long_bytes: int = 0
    long_from_long_sites: int = 0
    long_sites: int = 0
    short_sites: int = 0
    call_sites: bool = False


def small_lives(
    t0: np.ndarray, t1: np.ndarray, size: np.ndarray, site: np.ndarray, clock: np.ndarray
) -> SmallLives:
    """The small blocks' facts from their allocation and free times (`t1`: int64 max when never
    freed), sizes and call sites (0: unknown); `clock`: the times of all the process's
    allocations, sorted (a block's age is counted in allocations, as the layer counts it)."""
    n = len(t0)
    if n == 0:
        return SmallLives()
    never = np.iinfo(np.int64).max
    sz = size.astype(np.int64)
    freed = t1 != never
    when = np.concatenate([t0, t1[freed]])
    delta = np.concatenate([sz, -sz[freed]])
    peak = int(np.cumsum(delta[np.argsort(when, kind="stable")]).max())
    born = np.searchsorted(clock, t0, side="left")
    died = np.where(freed, np.searchsorted(clock, t1, side="left"), len(clock))
    age = died - born
    long_ = age >= PLACE_HORIZON
    short = freed & ~long_  # never freed and young at the end: neither
    if short.any():
        # long blocks allocated while the short ones came and went: the ones that pin pages
        lo, hi = int(t0[short].min()), int(t1[short].max())
        among = long_ & (t0 >= lo) & (t0 <= hi)
    else:
        among = np.zeros(n, bool)
    known = bool((site != 0).any())
    from_long = long_sites = short_sites = 0
    if known:
        sites, inverse = np.unique(site, return_inverse=True)
        longs = np.bincount(inverse, weights=long_, minlength=len(sites))
        shorts = np.bincount(inverse, weights=short, minlength=len(sites))
        is_long_site = (longs >= 2) & (longs >= shorts) & (sites != 0)
        from_long = int((among & is_long_site[inverse]).sum())
        long_sites = int(is_long_site.sum())
        short_sites = int((~is_long_site & (sites != 0)).sum())
    return SmallLives(
        live_peak_bytes=peak,
        allocations=n,
        long_blocks=int(among.sum()),
        long_bytes=int(sz[among].sum()),
        long_from_long_sites=from_long,
        long_sites=long_sites,
        short_sites=short_sites,
        call_sites=known,
    )


LIFETIMES_KEPT = 4_000_000  # lifetimes kept per file at most (a stride over a longer trace)


def _group_parts(
    table: pa.Table, alloc_ops: np.ndarray, large_block_bytes: int, stride: int
) -> dict[str, np.ndarray]:
    """One row group's compact columns the facts need: the allocating threads, the large
    blocks (page-rounded sizes freed, when each was held), the small sizes allocated and freed
    per thread, a sample of lifetimes, and the small blocks' lives and call sites."""
    op = table.column("op").to_numpy()
    size = table.column("size").to_numpy()
    thread = table.column("thread").to_numpy()
    time_ns = table.column("time_ns").to_numpy()
    life = table.column("lifetime_ns")
    freed = life.is_valid().to_numpy(zero_copy_only=False)
    life_ns = life.fill_null(0).to_numpy()
    freed_size = table.column("freed_size").fill_null(0).to_numpy()
    is_alloc = np.isin(op, alloc_ops) & (size > 0)
    is_free = op == Op.FREE
    never = np.iinfo(np.int64).max
    # large blocks: sizes freed again and again, and when each was held
    large = is_alloc & (size >= large_block_bytes)
    # small sizes, for their churn per thread and size class
    small = (is_alloc & (size <= TCACHE_MAX_BYTES)) | (
        is_free & (freed_size > 0) & (freed_size <= TCACHE_MAX_BYTES)
    )
    # small blocks' lives and call sites, for placement (ages counted in allocations)
    small_alloc = is_alloc & (size <= TCACHE_MAX_BYTES)
    caller = table.column("caller") if "caller" in table.column_names else None
    return {
        "frees": np.array([np.count_nonzero(is_free)]),
        "time": time_ns[[0, -1]],
        "threads": np.unique(thread[is_alloc]),
        "churn": (size[large & freed] + 4095) // 4096 * 4096,
        "large_t0": time_ns[large],
        "large_t1": np.where(freed[large], time_ns[large] + life_ns[large], never),
        "large_size": size[large].astype(np.int64),
        "small_thread": thread[small],
        "small_op": op[small],
        "small_size": np.where(is_free, freed_size, size)[small].astype(np.uint16),
        "lifetimes": life_ns[is_alloc & freed][::stride],
        "clock": time_ns[is_alloc].astype(np.int64),
        "place_t0": time_ns[small_alloc].astype(np.int64),
        "place_t1": np.where(
            freed[small_alloc], time_ns[small_alloc] + life_ns[small_alloc], never
        ).astype(np.int64),
        "place_size": size[small_alloc].astype(np.uint16),
        "place_site": (
            caller.fill_null(0).to_numpy()[small_alloc].astype(np.uint64)
            if caller is not None
            else np.zeros(int(small_alloc.sum()), np.uint64)
        ),
    }


def _large_peak(t0: np.ndarray, t1: np.ndarray, sizes: np.ndarray) -> int:
    """The most bytes the large blocks held at once (each held from t0 to t1)."""
    if not sizes.size:
        return 0
    when = np.concatenate([t0, t1])
    delta = np.concatenate([sizes, -sizes])
    return int(np.cumsum(delta[np.argsort(when, kind="stable")]).max())


def _file_facts(trace, large_block_bytes: int) -> _FileFacts:
    """One process image's facts: the converter's events a row group at a time (only the
    compact columns the facts need are kept: a large trace is never whole in memory)."""
    groups, stats = convert_groups(trace)
    alloc_ops = np.array([int(o) for o in ALLOCATING_OPS + (Op.REALLOC, Op.REALLOCARRAY)])
    stride = max(1, len(trace) // LIFETIMES_KEPT)
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for table in groups:
        if table.num_rows:
            for k, v in _group_parts(table, alloc_ops, large_block_bytes, stride).items():
                parts[k].append(v)
    if not parts:
        return _FileFacts(
            small=None,
            allocations=0,
            frees=0,
            t_lo=0,
            t_hi=0,
            threads=0,
            churn_sizes=np.zeros(0, np.uint64),
            large_peak=0,
            depths=np.zeros(0, np.int64),
            lifetimes=np.zeros(0, np.int64),
            live_peak=int(stats.peak_live_bytes),  # complete once the groups are consumed
        )
    got = {k: np.concatenate(v) for k, v in parts.items()}
    small = small_lives(
        got["place_t0"],
        got["place_t1"],
        got["place_size"],
        got["place_site"],
        np.sort(got["clock"]),
    )
    return _FileFacts(
        small=small,
        allocations=len(got["clock"]),
        frees=int(got["frees"].sum()),
        t_lo=int(got["time"][0]),
        t_hi=int(got["time"][-1]),
        threads=int(np.unique(got["threads"]).size),
        churn_sizes=got["churn"],
        large_peak=_large_peak(got["large_t0"], got["large_t1"], got["large_size"]),
        depths=small_churn_depths(got["small_thread"], got["small_op"], got["small_size"]),
        lifetimes=got["lifetimes"],
        live_peak=int(stats.peak_live_bytes),  # complete once the groups are consumed
    )


def _repeated_sizes(churn_sizes: list[np.ndarray]) -> tuple[tuple[SizeChurn, ...], int]:
    """The large sizes freed REPEATED times or more, largest first, and the bytes they make."""
    all_churn = np.concatenate(churn_sizes) if churn_sizes else np.zeros(0, np.uint64)
    sizes, counts = np.unique(all_churn, return_counts=True)
    keep = counts >= REPEATED
    churn = tuple(
        SizeChurn(int(s), int(c))
        for s, c in sorted(zip(sizes[keep], counts[keep]), key=lambda sc: -int(sc[0]))
    )
    return churn, int((sizes[keep].astype(np.int64) * counts[keep]).sum())


def heap_facts(
    trace_dir: Path,
    *,
    large_block_bytes: int = 128 * 1024,
    peak_rss_bytes: int | None = None,
    wall_s: float | None = None,
    mallopt_calls: tuple[str, ...] = (),
    check_imports: bool = True,
) -> HeapFacts:
    """The facts of the trace files in `trace_dir` (see the module)."""
    files = sorted(trace_dir.glob(f"*{TRACE_SUFFIX}"))
    notes: list[str] = []
    allocations = frees = small_reuses = 0
    threads = processes = 0
    t_lo, t_hi = None, None
    churn_sizes: list[np.ndarray] = []
    large_peak = live_peak = 0
    depths: list[np.ndarray] = []
    lifetimes: list[np.ndarray] = []
    modules: list[str] = []
    small = SmallLives()
    for path in files:  # one file per process image
        try:
            trace = read_trace(path)
        except TraceFormatError as err:
            notes.append(f"skipped {err}")
            continue
        processes += 1
        if trace.modules is not None:
            modules.extend(trace.modules.path)
        if len(trace) == 0:
            continue
        f = _file_facts(trace, large_block_bytes)
        live_peak = max(live_peak, f.live_peak)
        allocations += f.allocations
        frees += f.frees
        t_lo = f.t_lo if t_lo is None else min(t_lo, f.t_lo)
        t_hi = f.t_hi if t_hi is None else max(t_hi, f.t_hi)
        threads = max(threads, f.threads)
        churn_sizes.append(f.churn_sizes)
        large_peak = max(large_peak, f.large_peak)
        small_reuses += int(f.depths.size)
        depths.append(f.depths)
        lifetimes.append(f.lifetimes)
        if f.small is not None and f.small.live_peak_bytes > small.live_peak_bytes:
            small = f.small
    if processes == 0:
        raise TraceFactsError(
            f"{trace_dir}: the traced run left no readable trace file"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    churn, churn_bytes = _repeated_sizes(churn_sizes)
    depth = np.concatenate(depths) if depths else np.zeros(0, np.int64)
    life_all = np.concatenate(lifetimes) if lifetimes else np.zeros(0, np.int64)
    importers, how = (), "mallopt imports not checked"
    if check_imports:
        importers, how = mallopt_importers(list(dict.fromkeys(modules)))
    return HeapFacts(
        processes=processes,
        allocations=allocations,
        frees=frees,
        span_s=((t_hi - t_lo) / 1e9) if t_lo is not None else 0.0,
        allocating_threads=threads,
        large_block_bytes=large_block_bytes,
        large_churn=churn,
        large_churn_bytes=churn_bytes,
        large_live_peak_bytes=large_peak,
        small_reuses=small_reuses,
        small_churn_depth=int(np.quantile(depth, CHURN_QUANTILE)) if depth.size else 0,
        peak_live_bytes=live_peak,
        peak_rss_bytes=peak_rss_bytes,
        wall_s=wall_s,
        median_lifetime_us=float(np.median(life_all)) / 1e3 if life_all.size else None,
        short_lived_share=float((life_all < SHORT_LIVED_NS).mean()) if life_all.size else 0.0,
        small=small,
        mallopt_calls=mallopt_calls,
        mallopt_importers=importers,
        mallopt_checked=how,
        notes=tuple(notes),
    )


def mallopt_lines(probe_text: str | None) -> tuple[str, ...]:
    """The probe's `mallopt` lines as "M_NAME=value (pid N)"."""
    out = []
    for rec in parse_probe(probe_text or ""):
        if rec["kind"] != "mallopt":
            continue
        for k, v in rec.items():
            if k.startswith("mallopt."):
                out.append(f"M_{k.removeprefix('mallopt.').upper()}={v} (pid {rec.get('pid')})")
    return tuple(dict.fromkeys(out))
