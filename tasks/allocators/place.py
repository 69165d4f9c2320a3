"""heapcast's placement layer (native/layers/place.c, issue 45) as a candidate: its library built
on demand, its preload line (the layer, then jemalloc: LD_PRELOAD="libheapcast_place.so
libjemalloc.so.2"), its stats line read back and said in a sentence. Standard library only: the
CLI (`heapcast layer --policy place`) imports it at once.

A process where the layer was in force writes one stats line (`heapcast place: pid=.. mode=..
long=.. ... table_answers=.. counter_answers=..`); one where it passed every call through (no
jemalloc behind it, a bad option) writes none and says why on stderr. With a lifetime table
(`table=FILE`, native/TABLE.md) the table answers where it knows the (call site, size class),
the online counter elsewhere; a refused file is `table_refused=1`. See docs/layer.md#placement-issue-45.
"""

from __future__ import annotations

from pathlib import Path

from tasks.format.native_sources import NATIVE_DIR, PLACE_SOURCES, NativeBuildError, build_native

PLACE_FILE = "libheapcast_place.so"
PLACE_LIBRARY = NATIVE_DIR / "build" / PLACE_FILE
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_PACKAGE = "libjemalloc2"
# where a run's stats line goes, in its measure folder
PLACE_STATS = "place-stats"
# the layer's options (HP_OPTIONS in native/layers/place.c); `stats` is the stage's
PLACE_OPTIONS = {
    "mode",
    "sample",
    "horizon",
    "pct",
    "falls",
    "big",
    "min_mb",
    "learn_mb",
    "depth",
    "sites",
    "learn",
    "table",
    "model",
}
PLACE_MODES = {"predict", "sites", "size", "off"}
# the stats line's counters, summed over processes
PLACE_COUNTERS = (
    "long",  # allocations placed in the long arena
    "sampled",
    "dropped",
    "freed_short",
    "freed_long",
    "evicted_long",
    "sites_seen",
    "sites_long",
    "sites_aside",  # sites whose verdict fell from long back to short: kept short since
    "table",  # processes that used a lifetime table
    "table_refused",  # processes that refused theirs (and ran on the counter)
    "table_answers",  # allocations the table placed
    "counter_answers",  # with a table: allocations the online counter placed (no key)
    "long_young",  # sampled blocks placed long that died young (wrong placements)
    "long_old",  # sampled blocks placed long that outlived the horizon (right ones)
    "held_small",  # called long by the counter, placed short: the process under min_mb
    "waiting",  # processes whose counter never learned: under learn_mb resident to the end
)


class PlaceBuildError(NativeBuildError):
    """The placement layer cannot be built; the message names the tool or make's error."""


def build_place(native_dir: str | Path | None = None) -> Path:
    """`make -C native place` when a source is newer than the library (or it is missing); its
    path."""
    return build_native(
        "place", PLACE_FILE, PLACE_SOURCES, "the placement layer", native_dir, PlaceBuildError
    )


def layer_settings(
    var: str, value: str, options: frozenset[str] | set[str], table: str, stats: str
) -> dict[str, str]:
    """A heapcast layer's `var`=NAME=VALUE,... setting as a candidate gives it (HEAPCAST_LAYER,
    HEAPCAST_PLACE), by name; ValueError naming the pair that is not one of `options` (the
    layer's option `table`), and refusing `stats`, which the stage sets (`stats`: where the
    layer's line goes)."""
    names = {}
    for pair in value.split(","):
        name, eq, val = pair.partition("=")
        if name == "stats":
            raise ValueError(
                f"{var}: `stats` is set by the stage ({stats} goes to each run's measure "
                "folder); leave it out"
            )
        if not eq or name not in options or not val:
            raise ValueError(
                f"{var}: {pair!r} is not NAME=VALUE with NAME one of "
                f"{', '.join(sorted(options))} ({table})"
            )
        names[name] = val
    return names


def check_settings(value: str) -> None:
    """Raise ValueError saying what is wrong with HEAPCAST_PLACE=`value` (a candidate's)."""
    names = layer_settings(
        "HEAPCAST_PLACE",
        value,
        PLACE_OPTIONS,
        "native/layers/place.c, HP_OPTIONS",
        "the layer's stats line",
    )
    mode = names.get("mode", "predict")
    if mode not in PLACE_MODES:
        raise ValueError(
            f"HEAPCAST_PLACE mode: {mode!r} is not one of {', '.join(sorted(PLACE_MODES))}"
        )
    if mode == "sites" and "sites" not in names:
        raise ValueError("HEAPCAST_PLACE: mode=sites needs sites=FILE (a learn=FILE run's)")
    if "table" in names and mode != "predict":
        raise ValueError("HEAPCAST_PLACE: table=FILE needs mode=predict (the counter answers "
                         "where the table has no key)")  # fmt: skip
    for name in ("sample", "horizon", "pct", "big", "model", "depth"):
        if name in names and not names[name].isdigit():
            raise ValueError(f"HEAPCAST_PLACE {name}: {names[name]!r} is not a whole number")


def parse_stats(text: str) -> list[dict[str, str]]:
    """The stats lines in `text` (a stats file, or stderr), one dict per process."""
    rows = []
    for line in text.splitlines():
        if "heapcast place:" not in line:
            continue
        fields = line.split("heapcast place:", 1)[1].split()
        rows.append(dict(f.split("=", 1) for f in fields if "=" in f))
    return rows


def read_place_stats(path: Path) -> dict[str, int | str]:
    """The layer's counters of one run (`place_<name>` summed over processes, place_processes,
    place_mode) from its stats file; {} when no process wrote a line (not in force)."""
    rows = parse_stats(path.read_text(errors="replace")) if path.is_file() else []
    if not rows:
        return {}
    out: dict[str, int | str] = {
        f"place_{k}": sum(int(r.get(k, 0) or 0) for r in rows) for k in PLACE_COUNTERS
    }
    # sites are a process's own table: the largest, not a sum over processes
    for k in ("sites_seen", "sites_long", "sites_aside"):
        out[f"place_{k}"] = max(int(r.get(k, 0) or 0) for r in rows)
    out["place_processes"] = len(rows)
    out["place_mode"] = ",".join(sorted({r.get("mode", "?") for r in rows}))
    return out


def not_in_force(stats: dict[str, int | str], mode: str) -> str | None:
    """Why a run's placement was not in force (no stats line: the layer passed every call
    through; another mode), or None."""
    if not stats:
        return (
            "placement not in force: no process wrote the layer's stats line (it passed every "
            "call through: no jemalloc behind it, or an option it refused; the run's stderr says "
            "which)"
        )
    if stats.get("place_mode") != mode:
        return f"placement ran in mode {stats.get('place_mode')}, not {mode}"
    return None


def describe(stats: dict[str, int | str], mode: str = "predict") -> str:
    """What the layer did, in a sentence (or why it did nothing)."""
    why = not_in_force(stats, mode)
    if why and not stats:
        return why
    n = stats["place_processes"]
    text = (
        f"{n} process(es), mode {stats['place_mode']}: {stats['place_long']:,} allocations "
        f"placed long (their own jemalloc arena), the rest short (jemalloc's own); "
        f"{stats['place_sites_long']} of {stats['place_sites_seen']} call sites long"
    )
    if stats["place_mode"] == "predict":
        text += (
            f" ({stats['place_sampled']:,} blocks sampled: {stats['place_freed_short']:,} died "
            f"young, {stats['place_freed_long'] + stats['place_evicted_long']:,} outlived the "
            "horizon)"
        )
    judged = int(stats.get("place_long_young") or 0) + int(stats.get("place_long_old") or 0)
    if stats["place_mode"] == "predict" and judged:
        text += (
            f"; of the sampled blocks placed long, {stats['place_long_old']:,} of {judged:,} "
            "outlived the horizon"
        )
    if stats.get("place_held_small"):
        text += (
            f"; {stats['place_held_small']:,} allocations the counter called long stayed short: "
            "the process was under min_mb resident (16 MB by default), where the long arena "
            "would cost more than it can save"
        )
    if stats.get("place_mode") == "predict" and stats.get("place_waiting"):
        text += (
            f"; in {stats['place_waiting']} process(es) the counter never learned: they stayed "
            "under learn_mb resident (16 MB by default), where it could place nothing (it "
            "samples nothing and checks no free until then)"
        )
    if stats.get("place_sites_aside"):
        text += (
            f"; {stats['place_sites_aside']} call site(s) stepped aside (their verdict fell from "
            "long back to short; placed short since)"
        )
    if stats.get("place_table"):
        text += (
            f"; the lifetime table placed {stats['place_table_answers']:,} allocations, the "
            f"counter {stats['place_counter_answers']:,} (keys the table lacks)"
        )
    if stats.get("place_table_refused"):
        text += "; the lifetime table was REFUSED (stderr says why): the counter placed all"
    return text


def preload_line(library: str | Path = PLACE_LIBRARY, jemalloc: str = JEMALLOC) -> str:
    """LD_PRELOAD's value: the layer, then jemalloc (the layer must come first)."""
    return f"{library}:{jemalloc}"
