"""From what the trace showed to what `heapcast tune` runs: candidates derived, others ruled out.

Takes `HeapFacts` (tasks.allocators.trace_facts), the fixed list of candidates and the config; gives
an `Advice`: new candidates with their settings computed from the facts, the reason each candidate
is run, and the reason each one left out is not run. Pure: no run, no file.

The rules, each a function below, are in docs/allocators.md#advice-from-the-trace: `glibc-derived`
(glibc's tunables at the trace's values; a knob the program sets itself with mallopt is left alone),
the layer's `largest` policy where large blocks are freed and requested again, `jemalloc-place`
(memory objective only) where the trace has its case, with and without jemalloc returning freed
pages at once (and jemalloc alone so, for reference), and the fixed candidates ruled out where the
trace says they cannot help. The thresholds are the constants below; `Advice.place` says why
placement was or was not proposed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.allocators.config import Allocator, AllocatorsConfig
from tasks.allocators.trace_facts import TCACHE_COUNT, HeapFacts

DERIVED = "glibc-derived"
LAYER_LARGE = "layer-largest"  # the layer's policy for large blocks freed and requested again
FIXED_GLIBC = ("glibc-fixed", "glibc-arena2")
PLACE = "jemalloc-place"  # jemalloc behind the placement layer
JEMALLOC = "jemalloc"
# jemalloc returning a burst's freed pages to the system at once, not after its decay (10 s by
# default): where a run is shorter than the decay, or judged by its peak, the pages placement
# frees show only so; each candidate is measured with and without it, the time it costs beside
PROMPT_PURGE = "dirty_decay_ms:0,muzzy_decay_ms:0"
PROMPT_SUFFIX = "-prompt"
PLACE_MIN_PEAK = 8 * 1024 * 1024  # small bytes live at once, at least: fewer pages do not show
PLACE_MIN_LONG = 64  # long-lived small blocks among short ones, at least
PLACE_MAX_LONG_SHARE = 0.25  # of the small allocations, at most: a minority
PLACE_PEAK_RATIO = 4.0  # small peak over the long blocks' bytes: most of the peak dies
PLACE_SITE_SHARE = 0.8  # of the long blocks from long call sites, at least
MIB = 1024 * 1024
TCACHE_COUNT_CAP = 1024
# generous costs: a heap call, and a page fault on a fresh page of a large block
CALL_COST_S = 1e-6
FAULT_COST_S = 1e-6
PAGE = 4096
HEAP_MATTERS_SHARE = 0.01  # below this share of the run's time, no allocator can show


@dataclass(frozen=True)
class Advice:
    """What the trace decided: the derived candidates, why each candidate runs, why others not."""

    facts: HeapFacts
    derived: tuple[Allocator, ...] = ()
    run: dict[str, str] = field(default_factory=dict)  # name -> why it is measured
    ruled_out: dict[str, str] = field(default_factory=dict)  # name -> why it is not
    place: str = ""  # why jemalloc-place was or was not proposed ("" where it is not configured)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def _set_by_program(facts: HeapFacts, knob: str) -> bool:
    return any(c.startswith(f"M_{knob.upper()}=") for c in facts.mallopt_calls)


def glibc_tunables(facts: HeapFacts, cpus: int, objective: str) -> tuple[dict[str, int], list[str]]:
    """glibc's tunables at the trace's values (see the module), each with why."""
    knobs: dict[str, int] = {}
    why: list[str] = []
    skipped: list[str] = []

    def propose(knob: str, value: int, reason: str) -> None:
        """The knob at `value`, with why, unless the program sets it itself with mallopt."""
        if _set_by_program(facts, knob):
            skipped.append(f"{knob} (the program sets it with mallopt)")
        else:
            knobs[knob] = value
            why.append(f"{knob}={value}{reason}")

    if facts.large_churn:
        top = facts.largest_churned
        threshold = _round_up(top + PAGE, MIB)
        trim = _round_up(max(facts.large_live_peak_bytes, top) + top, MIB)
        propose(
            "mmap_threshold",
            threshold,
            f" ({threshold // MIB} MiB): above the largest size freed again and again "
            f"({top / MIB:.1f} MiB), so glibc serves it from the heap instead of a fresh "
            "mapping each time",
        )
        propose(
            "trim_threshold",
            trim,
            f" ({trim // MIB} MiB): above the {facts.large_live_peak_bytes / MIB:.1f} MiB those "
            "blocks held at once, so the freed top of the heap is kept for the next request",
        )
    if facts.allocating_threads > cpus:
        propose(
            "arena_max",
            cpus,
            f": {facts.allocating_threads} threads allocate on {cpus} cores; more arenas than "
            "cores only hold more memory",
        )
    if objective == "time" and facts.small_churn_depth > TCACHE_COUNT:
        count = min(_pow2_at_least(facts.small_churn_depth), TCACHE_COUNT_CAP)
        knobs["tcache_count"] = count
        why.append(
            f"tcache_count={count}: small sizes are reused in bursts of up to "
            f"{facts.small_churn_depth} blocks, deeper than tcache's {TCACHE_COUNT}"
        )
    if skipped:
        why.append("left alone: " + ", ".join(skipped))
    return knobs, why


def derived_glibc(knobs: dict[str, int]) -> Allocator:
    """The `glibc-derived` candidate with these tunables."""
    value = ":".join(f"glibc.malloc.{k}={v}" for k, v in knobs.items())
    return Allocator(name=DERIVED, package="libc6", env={"GLIBC_TUNABLES": value})


def prompt_purge(a: Allocator) -> Allocator:
    """`a` (jemalloc, or jemalloc behind the placement layer) with PROMPT_PURGE added to its
    MALLOC_CONF, named `a.name` + PROMPT_SUFFIX."""
    env = dict(a.env)
    env["MALLOC_CONF"] = ",".join(c for c in (env.get("MALLOC_CONF"), PROMPT_PURGE) if c)
    return Allocator.model_validate(
        {**a.model_dump(exclude={"model_table"}), "name": a.name + PROMPT_SUFFIX, "env": env}
    )


def run_time_s(facts: HeapFacts) -> float:
    """The traced run's time: its wall time, else the span of its heap calls."""
    return max(facts.wall_s or 0.0, facts.span_s)


def heap_share_bound(facts: HeapFacts) -> float:
    """A generous bound on the share of the traced run's time the allocator can change."""
    if run_time_s(facts) <= 0:
        return 1.0
    cost = facts.heap_calls * CALL_COST_S + facts.large_churn_bytes / PAGE * FAULT_COST_S
    return cost / run_time_s(facts)


def placement_case(facts: HeapFacts) -> tuple[bool, str]:
    """Whether the trace shows placement's case (see the module), and why, in a sentence."""
    mib = 1024 * 1024
    peak, n = facts.small.live_peak_bytes, facts.small.allocations
    longs, bytes_ = facts.small.long_blocks, facts.small.long_bytes
    if not facts.small.call_sites:
        return False, "the trace has no call sites (traced without callers): nothing to place by"
    if peak < PLACE_MIN_PEAK:
        return False, (
            f"small blocks held at most {peak / mib:.1f} MiB at once, under "
            f"{PLACE_MIN_PEAK // mib} MiB: too few pages for placement to show"
        )
    if longs < PLACE_MIN_LONG:
        return False, (
            f"{longs} small block(s) outlived the others while they came and went (fewer than "
            f"{PLACE_MIN_LONG}): nothing pins the pages a burst frees"
        )
    if longs > PLACE_MAX_LONG_SHARE * n:
        return False, (
            f"{longs:,} of {n:,} small blocks outlive the others ({longs / n:.0%}, more than "
            f"{PLACE_MAX_LONG_SHARE:.0%}): not a minority, nothing for placement to set apart"
        )
    if peak < PLACE_PEAK_RATIO * bytes_:
        return False, (
            f"the small peak ({peak / mib:.1f} MiB) is under {PLACE_PEAK_RATIO:g}x the "
            f"long-lived blocks' {bytes_ / mib:.1f} MiB: little of it dies in bursts"
        )
    share = facts.small.long_from_long_sites / longs
    if share < PLACE_SITE_SHARE:
        return False, (
            f"only {share:.0%} of the long-lived small blocks come from call sites whose blocks "
            "mostly outlive (the rest share sites with short ones): a per-site counter cannot "
            "tell them apart"
        )
    return True, (
        f"small blocks came and went ({peak / mib:.1f} MiB live at most) while {longs:,} "
        f"({bytes_ / mib:.1f} MiB, {longs / n:.1%} of them) outlived them, {share:.0%} from "
        f"{facts.small.long_sites} call site(s) of their own: placed apart, they no longer pin "
        "the pages a burst frees"
    )


def _placement_candidates(config: AllocatorsConfig) -> list[Allocator]:
    """jemalloc-place, and both it and jemalloc with prompt purging (PROMPT_PURGE)."""
    out = [config.get(PLACE), prompt_purge(config.get(PLACE))]
    if JEMALLOC in config.names():
        out.append(prompt_purge(config.get(JEMALLOC)))
    return out


def _placement(
    facts: HeapFacts,
    config: AllocatorsConfig,
    objective: str,
    derived: list[Allocator],
    run: dict[str, str],
) -> str:
    """Whether placement is proposed, and why (Advice.place); its candidates join `derived` and
    `run` where it is."""
    case, why = placement_case(facts)
    if case and objective == "memory":
        derived += _placement_candidates(config)
        run[PLACE] = f"heapcast's placement layer in front of jemalloc: {why}"
        run[PLACE + PROMPT_SUFFIX] = (
            f"the same, jemalloc returning freed pages at once ({PROMPT_PURGE}): a "
            "burst's pages leave the resident set now, not after jemalloc's decay; the "
            "madvise calls cost time, measured here"
        )
        if JEMALLOC in config.names():
            run[JEMALLOC + PROMPT_SUFFIX] = (
                f"jemalloc alone with {PROMPT_PURGE}: what returning pages at once buys "
                "without placement, so that placement's own share shows"
            )
        return f"proposed: {why}"
    if case:
        return (
            f"not proposed: the trace has its case ({why}), but it buys memory after "
            "bursts, not time (tune --objective memory measures it)"
        )
    return f"not proposed: {why}"


def advise(
    facts: HeapFacts, config: AllocatorsConfig, names: list[str], cpus: int, objective: str
) -> Advice:
    """Which candidates to run for a program with these facts (see the module): `names` are the
    fixed list (the baseline among them); the derived ones are added after them."""
    baseline = config.baseline
    run: dict[str, str] = {baseline: "the baseline: every gain is relative to it"}
    ruled: dict[str, str] = {}
    derived: list[Allocator] = []
    knobs, why = glibc_tunables(facts, cpus, objective)
    if knobs:
        derived.append(derived_glibc(knobs))
        run[DERIVED] = "; ".join(why)
    if facts.large_churn and LAYER_LARGE in config.names() and LAYER_LARGE not in names:
        derived.append(config.get(LAYER_LARGE))
        run[LAYER_LARGE] = (
            f"heapcast's layer, the largest policy: keeps the largest freed blocks for the next "
            f"request ({len(facts.large_churn)} large size(s) freed and requested again)"
        )
    for n in names:
        if n == baseline:
            continue
        if n in FIXED_GLIBC:
            if knobs:
                ruled[n] = f"its knobs at fixed values; {DERIVED} sets them at the trace's"
            elif facts.allocating_threads <= 1 and not facts.large_churn:
                ruled[n] = (
                    "nothing it changes happens in the trace: one allocating thread, no large "
                    "block freed again and again"
                )
            else:
                run[n] = "glibc's knobs at fixed values"
            continue
        a = config.get(n)
        if a.kind == "layer":
            run[n] = "heapcast's layer, asked for"
        elif a.kind == "place":
            run[n] = "heapcast's placement layer in front of jemalloc, asked for"
        elif a.library:
            run[n] = (
                "another malloc: its own thread caches and its own way of keeping freed "
                "memory; the trace cannot tell its speed"
            )
        else:
            run[n] = "glibc with other settings"
    place = ""
    if PLACE in config.names() and PLACE not in names:
        place = _placement(facts, config, objective, derived, run)
    share = heap_share_bound(facts)
    if objective == "time" and share < HEAP_MATTERS_SHARE:
        reason = (
            f"the heap cannot matter to the time: {facts.heap_calls:,} heap calls and "
            f"{facts.large_churn_bytes / MIB:,.0f} MiB of large blocks re-requested are at most "
            f"{share:.2%} of the traced run's {run_time_s(facts):.2f} s (at 1 µs a call and a page)"
        )
        for n in list(run):
            if n != baseline:
                ruled[n] = reason
                del run[n]
        derived = []
    return Advice(facts=facts, derived=tuple(derived), run=run, ruled_out=ruled, place=place)
