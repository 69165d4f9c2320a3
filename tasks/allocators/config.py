"""configs/allocators.yaml as a strict model: the allocators, the repetitions, the rule."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.allocators.place import (
    PLACE_LIBRARY,
    PLACE_STATS,
    check_settings,
    layer_settings,
    preload_line,
)
from tasks.allocators.rounds import plan_rounds
from tasks.core.config import CONFIG_DIR, PROJECT_DIR, StrictModel, default_root, load_config
from tasks.core.policy_names import RENAMED_POLICIES, current_policy
from tasks.learning.table.layer_file import ModelTable
from tasks.replay.runners.base import MEASURE_PLACEHOLDER
from tasks.replay.runners.preload import PreloadSpec
from tasks.replay.workloads import Name

CONFIG_PATH = CONFIG_DIR / "allocators.yaml"
# Below this many runs per allocator a rank test cannot reach p < 0.05 (4 vs 4: p >= 0.029,
# 3 vs 3: 0.1); the stage's contract is five.
MIN_REPETITIONS = 5


# heapcast's own layers (kind: layer) are built under native/build and shown to the program
# by the runner (RunRequest.host_libraries); `library` names the file there.
LAYER_DIR = PROJECT_DIR / "native" / "build"
# The glibc tunables a candidate may set (GLIBC_TUNABLES), with their smallest value; glibc
# ignores an unknown name or a value out of range without a word, so they are checked here.
GLIBC_MALLOC_TUNABLES = {
    "arena_max": 1,
    "arena_test": 1,
    "mmap_threshold": 0,
    "mmap_max": 0,
    "trim_threshold": 0,
    "top_pad": 0,
    "tcache_count": 0,
    "tcache_max": 0,
    "hugetlb": 0,
}
TCACHE_COUNT_MAX = 65535  # glibc's MAX_TCACHE_COUNT
# jemalloc options a candidate may set in MALLOC_CONF (those the probe can read back, and what
# jemalloc's tuning guide names for memory against time).
JEMALLOC_OPTIONS = {"background_thread", "dirty_decay_ms", "muzzy_decay_ms", "narenas"}
# Each knob and the malloc it tunes ("glibc": no library preloaded).
KNOB_OWNERS = {
    "GLIBC_TUNABLES": "glibc",
    "MALLOC_ARENA_MAX": "glibc",
    "MALLOC_CONF": "jemalloc",
    "TCMALLOC_RELEASE_RATE": "tcmalloc",
    "HEAPCAST_LAYER": "layer",
    "HEAPCAST_PLACE": "place",
}
# The layer's settings a candidate may give in HEAPCAST_LAYER (HL_OPTIONS in
# native/layers/layer.c); `stats` is not among them: the stage sets it per run, to collect the
# layer's counters into the run's measure folder.
LAYER_OPTIONS = {
    "policy",
    "min",
    "cap",
    "scope",
    "n",
    "madv",
    "decay",
    "topk",
    "horizon",
    "predictor",
    "model",
    "follow",
    "peak",
    "proof",
    "regret",
}
LAYER_POLICIES = {"largest", "pools", "guided", "off"}


def current_allocator(name: str) -> str:
    """A candidate's name as it is now: a layer named by its policy's former name
    (RENAMED_POLICIES: its layer-OLD, layer-OLD-all) as the policy's name now."""
    for old, new in RENAMED_POLICIES.items():
        if name == f"layer-{old}" or name.startswith(f"layer-{old}-"):
            return f"layer-{new}" + name[len(f"layer-{old}") :]
    return name


# Where a layer run writes its counters, in the run's measure folder.
LAYER_STATS = "layer-stats"
# Where a table-guided layer run finds the model's table: a copy in the run's measure folder
# (every runner shows that folder to the program, so no runner needs a mount of its own).
LAYER_TABLE = "heapcast.hcltab"
# ... and where a place candidate's run finds the model's lifetime table (its own name there)
PLACE_TABLE = "heapcast.hclife"


def _int(text: str, what: str, lo: int) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an integer") from None
    if v < lo:
        raise ValueError(f"{what}: {v} is below its smallest value {lo}")
    return v


def check_knob(key: str, value: str) -> None:
    """Raise ValueError saying what is wrong with allocator knob `key`=`value`."""
    if key == "GLIBC_TUNABLES":
        for item in value.split(":"):
            name, eq, val = item.partition("=")
            short = name.removeprefix("glibc.malloc.")
            if not eq or not name.startswith("glibc.malloc.") or short not in GLIBC_MALLOC_TUNABLES:
                known = ", ".join(f"glibc.malloc.{t}" for t in GLIBC_MALLOC_TUNABLES)
                raise ValueError(
                    f"GLIBC_TUNABLES: {item!r} is not NAME=VALUE with NAME one of {known}"
                )
            v = _int(val, f"GLIBC_TUNABLES {name}", GLIBC_MALLOC_TUNABLES[short])
            if short == "tcache_count" and v > TCACHE_COUNT_MAX:
                raise ValueError(f"GLIBC_TUNABLES {name}: {v} is above glibc's {TCACHE_COUNT_MAX}")
    elif key == "MALLOC_ARENA_MAX":
        _int(value, "MALLOC_ARENA_MAX", 1)
    elif key == "MALLOC_CONF":
        for pair in value.split(","):
            name, colon, val = pair.partition(":")
            if not colon or name not in JEMALLOC_OPTIONS:
                raise ValueError(
                    f"MALLOC_CONF: {pair!r} is not NAME:VALUE with NAME one of "
                    f"{', '.join(sorted(JEMALLOC_OPTIONS))}"
                )
            if name == "background_thread":
                if val not in ("true", "false"):
                    raise ValueError(f"MALLOC_CONF background_thread: {val!r} is not true/false")
            else:
                _int(val, f"MALLOC_CONF {name}", -1 if name.endswith("decay_ms") else 1)
    elif key == "TCMALLOC_RELEASE_RATE":
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"TCMALLOC_RELEASE_RATE: {value!r} is not a number") from None
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"TCMALLOC_RELEASE_RATE: {value!r} must be 0 or more")
    elif key == "HEAPCAST_PLACE":
        check_settings(value)
    elif key == "HEAPCAST_LAYER":
        names = layer_settings(
            "HEAPCAST_LAYER",
            value,
            LAYER_OPTIONS,
            "native/layers/layer.c, HL_OPTIONS",
            "the layer's counters",
        )
        if "policy" in names and current_policy(names["policy"]) not in LAYER_POLICIES:
            raise ValueError(
                f"HEAPCAST_LAYER policy: {names['policy']!r} is not one of "
                f"{', '.join(sorted(LAYER_POLICIES))}"
            )
        if "policy" not in names:
            raise ValueError("HEAPCAST_LAYER: give the policy (policy=largest|pools|guided|off)")
    else:
        raise ValueError(f"unknown allocator knob {key!r}; known: {', '.join(KNOB_OWNERS)}")


class Allocator(StrictModel):
    """One candidate: LD_PRELOADed `library` (none: the C library's malloc) with its Debian
    package, and `env`, the allocator's knobs (glibc tunables, MALLOC_CONF, ...), checked
    against the malloc they tune. `kind: layer`: a heapcast layer built under native/build
    (`library` is its file name there). `kind: place`: the placement layer (native/layers/
    place.c, built on demand) in front of jemalloc, `library` (absolute, on this host; the
    program sees the layer, then it), settings in env.HEAPCAST_PLACE. `table: model`: the
    registered model's table, the reuse table for a guided layer, the lifetime table for a place
    candidate in mode predict (table_kind)."""

    name: Name
    kind: Literal["malloc", "layer", "place"] = "malloc"
    library: str | None = None
    package: str | None = Field(default=None, description="the Debian package installing it")
    env: dict[str, str] = Field(default_factory=dict, description="allocator knobs")
    table: Literal["model"] | None = Field(
        default=None,
        description="a guided layer's predictor, or a place candidate's: `model`, the "
        "registered model's table (native/TABLE.md; the reuse table for a layer, the lifetime "
        "table for a place candidate), which the stage fetches and hands to every run "
        "(with_model_table, with_lifetime_table)",
    )
    # the table `table: model` reads (table_kind), set by the stage (AllocatorsConfig.
    # with_model_table, with_lifetime_table); None: not given, and the candidate is reported
    # unavailable rather than run on the online counter under the table's name
    model_table: ModelTable | None = Field(default=None, exclude=True)

    @field_validator("library")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and (":" in v or " " in v):
            raise ValueError(f"library {v!r}: LD_PRELOAD separates entries with ':' and spaces")
        return v

    @model_validator(mode="after")
    def _library_path(self) -> Allocator:
        v = self.library
        if self.kind == "layer":
            if not v or "/" in v:
                raise ValueError(
                    f"allocator {self.name!r}: a layer's `library` is its file name under "
                    f"{LAYER_DIR} (built by `make -C native layer`)"
                )
            if "HEAPCAST_LAYER" not in self.env:
                raise ValueError(
                    f"allocator {self.name!r}: a layer candidate gives its settings in "
                    "env.HEAPCAST_LAYER (at least policy=largest|pools|guided|off)"
                )
            return self
        if self.kind == "place":
            if not v or not v.startswith("/") or "jemalloc" not in Path(v).name:
                raise ValueError(
                    f"allocator {self.name!r}: a place candidate's `library` is the jemalloc "
                    "behind the layer, an absolute path (/usr/lib/x86_64-linux-gnu/"
                    "libjemalloc.so.2): the layer needs jemalloc's arenas API"
                )
            if "HEAPCAST_PLACE" not in self.env:
                raise ValueError(
                    f"allocator {self.name!r}: a place candidate gives its settings in "
                    "env.HEAPCAST_PLACE (at least mode=predict|sites|size|off)"
                )
            return self
        if v is not None and not v.startswith("/"):
            raise ValueError(
                f"library {v!r} must be an absolute path (as the workload sees it: inside the "
                "image for docker, on the host for local)"
            )
        return self

    @model_validator(mode="after")
    def _table_for_a_guided_layer(self) -> Allocator:
        """`table: model`: a guided layer (the reuse table, HEAPCAST_LAYER predictor= and
        model= set by the stage) or a place candidate in mode predict (the lifetime table,
        HEAPCAST_PLACE table= and model= set by the stage)."""
        if self.table is None:
            return self
        if self.kind == "place":
            settings, var, sets = self.place_settings, "HEAPCAST_PLACE", {"table", "model"}
            if self.place_mode != "predict":
                raise ValueError(
                    f"allocator {self.name!r}: `table: model` on a place candidate needs "
                    f"mode=predict, not {self.place_mode} (the online counter answers where the "
                    "lifetime table has no key)"
                )
        elif self.kind == "layer" and self.layer_settings.get("policy") == "guided":
            settings, var, sets = self.layer_settings, "HEAPCAST_LAYER", {"predictor", "model"}
        else:
            raise ValueError(
                f"allocator {self.name!r}: `table: model` is a guided layer's predictor "
                "(kind: layer, env.HEAPCAST_LAYER policy=guided: the reuse table) or a place "
                "candidate's (kind: place, mode=predict: the lifetime table)"
            )
        given = sorted(sets & settings.keys())
        if given:
            raise ValueError(
                f"allocator {self.name!r}: with `table: model` the stage sets "
                f"{' and '.join(given)} in {var} (the model's {self.table_kind} table and its "
                "version); leave them out"
            )
        return self

    @model_validator(mode="after")
    def _knobs_fit(self) -> Allocator:
        malloc = self.malloc_family
        for key, value in self.env.items():
            try:
                check_knob(key, value)
            except ValueError as err:
                raise ValueError(f"allocator {self.name!r}, env.{key}: {err}") from None
            owner = KNOB_OWNERS[key]
            if self.kind == "place" and owner == "place":
                continue  # the layer's own settings; MALLOC_CONF tunes the jemalloc behind it
            if owner != malloc:
                raise ValueError(
                    f"allocator {self.name!r}, env.{key}: tunes {owner}'s malloc, but this "
                    f"candidate runs {malloc}'s"
                )
        return self

    @model_validator(mode="after")
    def _package_for_library(self) -> Allocator:
        if self.library is not None and self.kind in ("malloc", "place") and not self.package:
            raise ValueError(
                f"allocator {self.name!r}: `package` (the Debian package that installs "
                f"{self.library}) is required, so that a missing library can say what to install"
            )
        return self

    @property
    def malloc_family(self) -> str:
        """glibc, jemalloc, tcmalloc, mimalloc, layer (a heapcast layer), or the library's file
        name."""
        if self.kind == "layer":
            return "layer"
        if self.kind == "place":
            return "jemalloc"  # behind the layer (env.MALLOC_CONF tunes it)
        if self.library is None:
            return "glibc"
        base = Path(self.library).name
        for family in ("jemalloc", "tcmalloc", "mimalloc"):
            if family in base:
                return family
        return base

    @property
    def preload(self) -> tuple[str, ...]:
        return (self.library,) if self.library and self.kind == "malloc" else ()

    @property
    def spec(self) -> PreloadSpec:
        """What a run under this candidate asks for, for tasks.replay.runners.preload."""
        if self.kind == "place":
            # the probe must see the layer define malloc; jemalloc comes after it (place_run),
            # and HEAPCAST_PLACE, which the probe does not read, is set apart (place_env)
            env = {k: v for k, v in self.env.items() if k != "HEAPCAST_PLACE"}
            return PreloadSpec(
                name=self.name, host_library=PLACE_LIBRARY, env=tuple(sorted(env.items()))
            )
        return PreloadSpec(
            name=self.name,
            library=self.library if self.kind == "malloc" else None,
            host_library=LAYER_DIR / self.library
            if self.kind == "layer" and self.library
            else None,
            env=tuple(sorted(self.layer_env().items())),
        )

    @property
    def place_settings(self) -> dict[str, str]:
        """The placement layer's settings as given ({} for other kinds)."""
        given = self.env.get("HEAPCAST_PLACE", "") if self.kind == "place" else ""
        return dict(p.partition("=")[::2] for p in given.split(",")) if given else {}

    @property
    def place_mode(self) -> str:
        return self.place_settings.get("mode", "predict")

    def place_env(self, folder: str = MEASURE_PLACEHOLDER) -> dict[str, str]:
        """HEAPCAST_PLACE as a run sets it: the stats line into `folder`, and a table
        candidate's lifetime table as its copy there (`PLACE_TABLE`, the caller copies it) with
        the version required ({} for other kinds)."""
        if self.kind != "place":
            return {}
        given = self._with_table(folder)["HEAPCAST_PLACE"]
        return {"HEAPCAST_PLACE": f"{given},stats={folder}/{PLACE_STATS}"}

    @property
    def layer_settings(self) -> dict[str, str]:
        """The layer's settings as given (env.HEAPCAST_LAYER name=value pairs; {} for others)."""
        given = self.env.get("HEAPCAST_LAYER", "")
        return dict(p.partition("=")[::2] for p in given.split(",")) if given else {}

    @property
    def table_kind(self) -> str | None:
        """Which of the model's tables `table: model` reads: "reuse" (a guided layer's),
        "lifetime" (a place candidate's); None without `table`."""
        if self.table is None:
            return None
        return "lifetime" if self.kind == "place" else "reuse"

    @property
    def table_copy(self) -> str:
        """The file name of the run's copy of its table, in its measure folder."""
        return PLACE_TABLE if self.kind == "place" else LAYER_TABLE

    def _with_table(self, folder: str) -> dict[str, str]:
        """`env` with the model's table named (as `folder`/file; "": the file on this host)
        and its version required: HEAPCAST_LAYER predictor=table:FILE,model=N for a layer,
        HEAPCAST_PLACE table=FILE,model=N for a place candidate."""
        env = dict(self.env)
        t = self.model_table
        if t is not None:
            path = f"{folder}/{self.table_copy}" if folder else str(t.path)
            if self.kind == "place":
                env["HEAPCAST_PLACE"] += f",table={path},model={t.version}"
            else:
                env["HEAPCAST_LAYER"] += f",predictor=table:{path},model={t.version}"
        return env

    def layer_env(self) -> dict[str, str]:
        """The knobs as a run sets them: a layer's settings get `stats` into the run's measure
        folder (MEASURE_PLACEHOLDER, filled by the runner), so its counters are collected, and a
        table candidate's predictor is the copy of the model's table there (`LAYER_TABLE`)."""
        if self.kind != "layer":
            return dict(self.env)
        env = self._with_table(MEASURE_PLACEHOLDER)
        env["HEAPCAST_LAYER"] += f",stats={MEASURE_PLACEHOLDER}/{LAYER_STATS}"
        return env

    def line(self) -> str:
        """The exact line to paste in front of a command (empty for glibc as it is); a layer's
        without the stage's `stats` setting, a table candidate's with the table on this host."""
        if self.kind == "place":
            knobs = " ".join(f"{k}={v}" for k, v in sorted(self._with_table("").items()))
            return f"LD_PRELOAD={preload_line(PLACE_LIBRARY, str(self.library))} {knobs}"
        return replace(self.spec, env=tuple(sorted(self._with_table("").items()))).line()

    @property
    def predictor(self) -> str | None:
        """What a layer or the placement layer decides from, in words (None: a malloc)."""
        if self.kind == "place":
            return self._place_predictor
        if self.kind != "layer":
            return None
        settings = self.layer_settings
        if settings.get("policy") != "guided":
            return "no prediction"
        if self.table is not None:
            v = self.model_table.version if self.model_table is not None else None
            return f"the model's table (v{v})" if v else "the model's table"
        given = settings.get("predictor", "online")
        return "online counter" if given == "online" else f"table {given.removeprefix('table:')}"

    @property
    def _place_predictor(self) -> str:
        settings, mode = self.place_settings, self.place_mode
        if mode == "sites":
            return f"sites {settings.get('sites', '')}"
        if mode != "predict":
            return "size" if mode == "size" else "no prediction"
        if self.table is not None:
            v = self.model_table.version if self.model_table is not None else None
            return f"the model's lifetime table (v{v})" if v else "the model's lifetime table"
        if "table" in settings:
            return f"lifetime table {settings['table']}"
        return "online counter"


class RecommendationRule(StrictModel):
    """The fastest by median `time` among those within `memory_tolerance` of the smallest
    median `memory`; the margin over the baseline is beyond noise by `noise` at `alpha`."""

    time: Literal["wall_s", "cpu_s"] = "wall_s"
    # peak_rss_mb: the container's peak (host: ru_maxrss); max_process_rss_mb: the largest
    # process's; mean_rss_mb: the memory averaged over the run, the container's (host: the
    # program process's), which placement lowers where its peak stays (docs/allocators.md)
    memory: Literal["peak_rss_mb", "max_process_rss_mb", "mean_rss_mb"] = "peak_rss_mb"
    memory_tolerance: float = Field(default=0.10, ge=0.0)
    objective: Literal["time", "memory"] = Field(
        default="time",
        description="what the winner must beat the baseline on: `time` (within memory_tolerance "
        "of the smallest memory) or `memory` (within time_tolerance of the fastest)",
    )
    time_tolerance: float = Field(default=0.10, ge=0.0)
    noise: Literal["mann_whitney", "minmax"] = "mann_whitney"
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    correction: Literal["holm", "none"] = Field(
        default="holm", description="for the number of candidates compared with the baseline"
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="of the margin's interval")
    promising_p: float = Field(
        default=0.25,
        gt=0.0,
        le=1.0,
        description="a faster candidate with an uncorrected p below this, not beyond the noise "
        "after the correction, gets more rounds (up to max_repetitions)",
    )

    def for_objective(self, objective: str | None) -> RecommendationRule:
        """This rule judged on `objective` (time or memory) instead of its own; None: as is."""
        if objective is None or objective == self.objective:
            return self
        return self.model_copy(update={"objective": objective})

    @property
    def primary(self) -> str:
        """The metric the winner beats the baseline on."""
        return self.time if self.objective == "time" else self.memory

    @property
    def guard(self) -> tuple[str, float]:
        """The other metric, and how far above its best a candidate may be."""
        if self.objective == "time":
            return self.memory, self.memory_tolerance
        return self.time, self.time_tolerance

    def describe(self) -> str:
        noise = (
            f"one-sided exact Mann-Whitney rank test (below the baseline), p < {self.alpha:g} "
            "split over the rounds' looks"
            if self.noise == "mann_whitney"
            else "every run below every run of the baseline"
        )
        guard, tolerance = self.guard
        return (
            f"the lowest median {self.primary} among allocators whose median {guard} is "
            f"within {tolerance:.0%} of the lowest and, against the baseline, "
            f"beyond noise: {noise}"
            + (", Holm-corrected for the candidates compared" if self.correction == "holm" else "")
        )


class TuneConfig(StrictModel):
    """`heapcast tune`'s defaults: the candidates (names of `allocators`) and the rounds."""

    candidates: list[Name] = Field(min_length=1)
    repetitions: int = Field(default=MIN_REPETITIONS, ge=MIN_REPETITIONS)
    max_repetitions: int = Field(default=MIN_REPETITIONS, ge=MIN_REPETITIONS)
    warmup: int = Field(default=1, ge=0)


class SeedCasesConfig(StrictModel):
    """The layer's cases (issue 21: the seeds' two, and a reader thread's chunks freed by the main
    thread) measured side by side: the four mallocs and the layer's
    policies, `repetitions` rotated rounds (the weekly flow), `quick_repetitions` in the quick
    night (fewer than a rank test needs: the summary says so)."""

    workloads: list[Name] = Field(min_length=1)
    inputs: list[Name] = Field(min_length=1)
    allocators: list[Name] = Field(min_length=2)
    repetitions: int = Field(default=MIN_REPETITIONS, ge=MIN_REPETITIONS)
    max_repetitions: int | None = Field(
        default=None,
        description="rounds added while the rule has not decided (tasks.allocators.rounds), "
        "up to this; None: repetitions only",
    )
    quick_repetitions: int = Field(default=3, ge=1)
    # the quick night's allocators (None: `allocators`): the layer's predictors and the reference
    # mallocs that fit the night's minutes; the weekly flow measures them all
    quick_allocators: list[Name] | None = Field(default=None, min_length=2)
    # what the predictions bought: per pair, the first's median minus the second's (ms, MB) with
    # the rank test's p, same case, same night
    compare: list[tuple[Name, Name]] = Field(
        default_factory=lambda: [("layer-guided", "layer-largest"), ("layer-guided", "glibc")]
    )

    @property
    def rounds_bound(self) -> int:
        return max(self.repetitions, self.max_repetitions or self.repetitions)


class AllocatorsConfig(StrictModel):
    allocators: list[Allocator] = Field(min_length=1)
    baseline: Name = "glibc"
    repetitions: int = Field(default=MIN_REPETITIONS, ge=MIN_REPETITIONS)
    max_repetitions: int | None = Field(
        default=None, description="rounds added while the decision sits in the noise, up to this"
    )
    order_seed: int = Field(default=0, description="the seed of the rounds' balanced orders")
    warmup: int = Field(default=1, ge=0, description="baseline runs before a case, discarded")
    inputs: list[Name] | None = Field(
        default=None, description="input names measured per workload; None: the selection's"
    )
    experiment: str = Field(default="heapcast-allocators", min_length=1)
    rule: RecommendationRule = RecommendationRule()
    # per workload, the objective its recommendation is judged on where it is not the rule's: a
    # service users run for days picks an allocator for the memory it holds, not for seconds
    objectives: dict[Name, Literal["time", "memory"]] = Field(default_factory=dict)
    large_block_bytes: int = Field(default=128 * 1024, ge=1)
    tune: TuneConfig | None = None
    seeds: SeedCasesConfig | None = None

    def rule_for(self, workload: str) -> RecommendationRule:
        """The rule a workload's recommendation follows (`objectives` applied)."""
        return self.rule.for_objective(self.objectives.get(workload))

    @model_validator(mode="after")
    def _seed_allocators_listed(self) -> AllocatorsConfig:
        if self.seeds is None or self.baseline not in self.names():
            return self  # an unknown baseline is said by _baseline_listed
        s = self.seeds
        compared = {n for pair in s.compare for n in pair}
        unknown = sorted(
            {n for n in [*s.allocators, *compared, *(s.quick_allocators or [])]} - set(self.names())
        )
        if unknown:
            raise ValueError(
                f"seeds: {', '.join(unknown)} not among the allocators ({', '.join(self.names())})"
            )
        outside = sorted((compared | {self.baseline}) - set(s.allocators))
        if outside:
            raise ValueError(f"seeds.allocators must include {', '.join(outside)} (compared)")
        if s.quick_allocators is not None:
            extra = sorted(set(s.quick_allocators) - set(s.allocators))
            if extra or self.baseline not in s.quick_allocators:
                raise ValueError(
                    "seeds.quick_allocators must be among seeds.allocators and include the "
                    f"baseline {self.baseline!r}"
                    + (f" ({', '.join(extra)} are not)" if extra else "")
                )
        return self

    @model_validator(mode="after")
    def _tune_candidates_listed(self) -> AllocatorsConfig:
        if self.tune is None:
            return self
        unknown = [n for n in self.tune.candidates if n not in self.names()]
        if unknown:
            raise ValueError(
                f"tune.candidates: {', '.join(unknown)} not among the allocators "
                f"({', '.join(self.names())})"
            )
        if self.baseline not in self.tune.candidates:
            raise ValueError(f"tune.candidates must include the baseline {self.baseline!r}")
        if self.tune.max_repetitions < self.tune.repetitions:
            raise ValueError("tune.max_repetitions is below tune.repetitions")
        return self

    @field_validator("allocators")
    @classmethod
    def _unique(cls, v: list[Allocator]) -> list[Allocator]:
        names = [a.name for a in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"allocator(s) named twice: {', '.join(twice)}")
        return v

    @model_validator(mode="after")
    def _baseline_listed(self) -> AllocatorsConfig:
        if self.baseline not in self.names():
            raise ValueError(
                f"baseline {self.baseline!r} is not one of the allocators ({', '.join(self.names())})"
            )
        return self

    @model_validator(mode="after")
    def _rounds_can_decide(self) -> AllocatorsConfig:
        """Each design the config runs (the stage, the seeds' full rounds, tune) must be able to
        reach the rule's bar (tasks.allocators.rounds.plan_rounds): say so rather than never
        decide. The quick seeds' rounds may not (fewer, to fit make run): the summary says how
        many they would need."""
        if self.max_repetitions is not None and self.max_repetitions < self.repetitions:
            raise ValueError(
                f"max_repetitions {self.max_repetitions} is below repetitions {self.repetitions}"
            )
        designs = [
            ("max_repetitions", len(self.allocators) - 1, self.repetitions, self.rounds_bound)
        ]
        if self.seeds is not None:
            s = self.seeds
            designs.append(
                ("seeds.max_repetitions", len(s.allocators) - 1, s.repetitions, s.rounds_bound)
            )
        if self.tune is not None:
            t = self.tune
            designs.append(
                ("tune.max_repetitions", len(t.candidates) - 1, t.repetitions, t.max_repetitions)
            )
        r = self.rule
        for field, m, planned, bound in designs:
            plan = plan_rounds(m, planned, bound, r.alpha, r.correction, r.noise)
            if m >= 1 and plan.first_look is None:
                need = f"; give {field} at least {plan.needed}" if plan.needed else ""
                raise ValueError(f"{field} (or the repetitions) {bound}: {plan.cannot()}{need}")
        return self

    @property
    def rounds_bound(self) -> int:
        return self.max_repetitions or self.repetitions

    def names(self) -> list[str]:
        return [a.name for a in self.allocators]

    @property
    def needs_table(self) -> bool:
        """Whether a layer candidate reads the registered model's (reuse) table."""
        return any(a.table_kind == "reuse" for a in self.allocators)

    @property
    def needs_lifetime_table(self) -> bool:
        """Whether a place candidate reads the registered model's lifetime table."""
        return any(a.table_kind == "lifetime" for a in self.allocators)

    def _with_table(self, kind: str, table: ModelTable | None) -> AllocatorsConfig:
        return self.model_copy(
            update={
                "allocators": [
                    a.model_copy(update={"model_table": table}) if a.table_kind == kind else a
                    for a in self.allocators
                ]
            }
        )

    def with_model_table(self, table: ModelTable | None) -> AllocatorsConfig:
        """This config with the reuse `table` handed to every layer candidate of `table: model`
        (None: they stay without one, and the stage reports them unavailable, saying why)."""
        return self._with_table("reuse", table)

    def with_lifetime_table(self, table: ModelTable | None) -> AllocatorsConfig:
        """This config with the lifetime `table` handed to every place candidate of `table:
        model` (None: they stay without one, and the stage reports them unavailable)."""
        return self._with_table("lifetime", table)

    def resolve(self, name: str) -> str:
        """`name` as this config names it: itself, or a former name's candidate now
        (`current_allocator`: a former layer name is the layer's name now)."""
        return name if name in self.names() else current_allocator(name)

    def get(self, name: str) -> Allocator:
        name = self.resolve(name)
        for a in self.allocators:
            if a.name == name:
                return a
        raise KeyError(f"no allocator {name!r} in the config; it has: {', '.join(self.names())}")


def load_allocators_config(path: str | Path | None = None) -> AllocatorsConfig:
    """configs/allocators.yaml (or `path`); a bad field is a ConfigError naming file and field."""
    return load_config(AllocatorsConfig, path or CONFIG_PATH)


class AllocatorsParams(StrictModel):
    """Parameters of an `allocators` flow (plain values, for Prefect's form)."""

    workloads: list[str] | None = Field(
        default=None, description="workload names to measure; all when empty"
    )
    quick: bool = Field(default=False, description="only the quick inputs' workloads")
    runner: Literal["auto", "docker", "local"] = "auto"
    root: str = Field(default_factory=default_root, description="data root (fsspec URL)")
    catalog: str | None = Field(
        default=None, description="catalog file; configs/workloads.yaml when empty"
    )
    config: str | None = Field(
        default=None, description="allocators config; configs/allocators.yaml when empty"
    )
    mlflow: bool = Field(default=True, description="log one MLflow run")
    table_model: str = Field(
        default="champion",
        min_length=1,
        description="the registered version whose table the table-guided layer reads (an alias "
        "or a version number); the night measures the version it registered",
    )
    table_file: str | None = Field(
        default=None,
        description="a layer table file (native/TABLE.md) the table-guided layer reads instead "
        "of a registered version's, its model version from its header: a table distilled apart "
        "(studies/table_sites/table_sites.py --table-out) measured without touching the registry",
    )
