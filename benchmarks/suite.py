"""The benchmarks, listed once: the maintained speed benchmarks `make bench` runs, and the studies.

A speed benchmark measures heapcast beside a reference in one run, costs a few minutes on two
cores, and needs no GPU and no container image; `python -m benchmarks` runs every one into
benchmarks/results/ (the file named here, nothing else lives there). A study answered a question
once, on a full night's data, in containers or on a GPU: it lives outside the product, in its own
folder studies/<name>/ (its script, its result, a README with the command that made it), listed
here so that `python -m benchmarks --list` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.harness import REPO


@dataclass(frozen=True)
class Benchmark:
    """One maintained speed benchmark: the script, its arguments, the file it writes."""

    name: str
    script: str = ""  # relative to the repository; default benchmarks/bench_<name>.py
    args: tuple[str, ...] = ()
    result: str = ""  # under benchmarks/results/; default <name>.json
    minutes: float = 1.0  # about, on the shared 2-core machine
    needs: tuple[str, ...] = field(default=())  # paths under the repository it cannot run without

    def __post_init__(self) -> None:
        if not self.script:
            object.__setattr__(self, "script", f"benchmarks/bench_{self.name}.py")

    @property
    def result_file(self) -> str:
        return self.result or f"{self.name}.json"

    def command(self) -> list[str]:
        return ["python", self.script, *self.args]

    def missing(self) -> list[str]:
        return [n for n in self.needs if not (REPO / n).exists()]


@dataclass(frozen=True)
class Study:
    """A one-off study: its folder studies/<name>/ holds its script (when it has one of its own),
    its results and a README.md with the command that made each result."""

    name: str
    why: str  # why it is not a maintained speed benchmark
    # relative to the repository, default studies/<name>/<name>.py; None: its results came from
    # the product
    script: str | None = ""

    def __post_init__(self) -> None:
        if self.script == "":
            object.__setattr__(self, "script", f"{self.folder}/{self.name}.py")

    @property
    def folder(self) -> str:
        return f"studies/{self.name}"


# Cheapest first. Every one writes through the harness (write_result, with the reference it
# measures beside heapcast), so every file under benchmarks/results/ has the one shape.
SPEED: tuple[Benchmark, ...] = (
    Benchmark("cli", minutes=1),
    Benchmark("online", minutes=1.5),
    Benchmark("policy_core", minutes=1),
    Benchmark("tracer", minutes=3),
    Benchmark("report", minutes=3),
    Benchmark("convert", minutes=3),
    Benchmark("streaming", minutes=2),
    Benchmark("layer", minutes=3),
    Benchmark("place", minutes=4),
    # placement by the calling context on a wrapper program (part 1c) and the context's cost
    Benchmark(
        "place_wrapper",
        script="benchmarks/bench_place.py",
        args=(
            "--reps",
            "8",
            "--parts",
            "wrapper,cost",
            "--out",
            "benchmarks/results/place_wrapper.json",
        ),
        minutes=3,
    ),
    Benchmark("place_servers", minutes=7),
    Benchmark("tune", minutes=2),
    # without events under data/, on a synthetic run
    Benchmark("whatif", args=("--root", "data"), minutes=3),
    # not a speed: the replay's counters against the layer's, cheap and kept up
    Benchmark("whatif_threads", minutes=1),
    Benchmark("train", args=("--root", "data"), minutes=4),
    Benchmark("events_reader", args=("--root", "data"), minutes=2, needs=("data/events",)),
    Benchmark("layer_table", args=("--root", "data"), minutes=2, needs=("data/events",)),
)

STUDIES: tuple[Study, ...] = (
    Study("advice_rule", "2,000 races, 2 minutes"),
    Study("allocators", "containers, 20+ minutes"),
    Study("context_counters", "a night's data with call stacks, 15 minutes"),
    Study("context_depth", "a night's data with call stacks"),
    Study("crossfit", "a full night's data"),
    Study("fault_drill", "a drill, not a speed; as root"),
    Study("gpu_training", "a GPU"),
    Study("hedge", "a night's data and its champion"),
    Study(
        "layer_core_ab", "two layer builds, valgrind", script="studies/layer_core_ab/layer_ab.py"
    ),
    Study("layer_proof", "the allocators stage, containers", script=None),
    Study("layer_seeds", "containers"),
    Study("layer_zero_hit", "valgrind, 10 minutes"),
    Study("layer_context_table", "the cache layer with two tables, 2 minutes"),
    Study("night_context_table", "a quick night's data with call stacks, 3 minutes"),
    Study("lifetime_table", "a registered model"),
    Study("network_stacks", "trains two networks, 10 minutes"),
    Study("place_context", "containers, 15 minutes"),
    Study("context_speed", "an old commit's modules beside the new, 3 minutes"),
    Study("model_variants", "trains every variant"),
    Study("next_share", "a night's data, champion"),
    Study("nextcall_stacks", "trains two next-call networks, 15 minutes"),
    Study("place_catalog", "containers, 40 minutes"),
    Study("questions", "a full night's data"),
    Study("replay_stacks", "containers, 5 minutes"),
    Study("reuse_threads", "a full night's data"),
    Study("scaling", "a network a point, 20+ minutes"),
    Study(
        "stream_step_ab",
        "an old commit's streaming.py beside the new, 4 minutes",
        script="studies/stream_step_ab/stream_ab.py",
    ),
    Study("table_bound", "a registered model"),
    Study("table_context", "a trained network"),
    Study("table_sites", "a registered model"),
    Study("tune_catalog", "heapcast tune, containers", script=None),
    Study("whatif_answers", "a registered champion"),
    Study("whatif_causal", "a registered champion"),
    Study("whatif_guided", "ratios, no timing"),
    Study("whatif_layer", "containers"),
    Study("whatif_model", "a night's whatif table"),
)


def by_name(names: list[str]) -> list[Benchmark]:
    """The speed benchmarks named (all when none), in the suite's order; an unknown name fails
    with the list of known ones."""
    known = {b.name: b for b in SPEED}
    unknown = [n for n in names if n not in known]
    if unknown:
        studies = {s.name for s in STUDIES}
        hint = [f"{n} is a study (studies/{n}/README.md)" for n in unknown if n in studies]
        raise SystemExit(
            f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(known)}"
            + ("; " + "; ".join(hint) if hint else "")
        )
    return [b for b in SPEED if not names or b.name in names]
