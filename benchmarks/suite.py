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
    script: str  # relative to the repository
    args: tuple[str, ...] = ()
    result: str = ""  # under benchmarks/results/; default <name>.json
    minutes: float = 1.0  # about, on the shared 2-core machine
    needs: tuple[str, ...] = field(default=())  # paths under the repository it cannot run without

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
    script: str | None  # relative to the repository; None: its results came from the product
    why: str  # why it is not a maintained speed benchmark

    @property
    def folder(self) -> str:
        return f"studies/{self.name}"


# Cheapest first. Every one writes through the harness (write_result, with the reference it
# measures beside heapcast), so every file under benchmarks/results/ has the one shape.
SPEED: tuple[Benchmark, ...] = (
    Benchmark("cli", "benchmarks/bench_cli.py", minutes=1),
    Benchmark("online", "benchmarks/bench_online.py", minutes=1.5),
    Benchmark("policy_core", "benchmarks/bench_policy_core.py", minutes=1),
    Benchmark("tracer", "benchmarks/bench_tracer.py", minutes=3),
    Benchmark("report", "benchmarks/bench_report.py", minutes=3),
    Benchmark("convert", "benchmarks/bench_convert.py", minutes=3),
    Benchmark("streaming", "benchmarks/bench_streaming.py", minutes=2),
    Benchmark("layer", "benchmarks/bench_layer.py", minutes=3),
    Benchmark("place", "benchmarks/bench_place.py", minutes=4),
    Benchmark("place_servers", "benchmarks/bench_place_servers.py", minutes=7),
    Benchmark("tune", "benchmarks/bench_tune.py", minutes=2),
    Benchmark(  # without events under data/, on a synthetic run
        "whatif",
        "benchmarks/bench_whatif.py",
        args=("--root", "data"),
        minutes=3,
    ),
    Benchmark(  # not a speed: the replay's counters against the layer's, cheap and kept up
        "whatif_threads",
        "benchmarks/bench_whatif_threads.py",
        minutes=1,
    ),
    Benchmark("train", "benchmarks/bench_train.py", args=("--root", "data"), minutes=4),
    Benchmark(
        "events_reader",
        "benchmarks/bench_events_reader.py",
        args=("--root", "data"),
        minutes=2,
        needs=("data/events",),
    ),
    Benchmark(
        "layer_table",
        "benchmarks/bench_layer_table.py",
        args=("--root", "data"),
        minutes=2,
        needs=("data/events",),
    ),
)

STUDIES: tuple[Study, ...] = (
    Study("advice_rule", "studies/advice_rule/advice_rule.py", "2,000 races, 2 minutes"),
    Study("allocators", "studies/allocators/allocators.py", "containers, 20+ minutes"),
    Study("crossfit", "studies/crossfit/crossfit.py", "a full night's data"),
    Study("fault_drill", "studies/fault_drill/fault_drill.py", "a drill, not a speed; as root"),
    Study("gpu_training", "studies/gpu_training/gpu_training.py", "a GPU"),
    Study("hedge", "studies/hedge/hedge.py", "a night's data and its champion"),
    Study("layer_core_ab", "studies/layer_core_ab/layer_ab.py", "two layer builds, valgrind"),
    Study("layer_proof", None, "the allocators stage, containers"),
    Study("layer_seeds", "studies/layer_seeds/layer_seeds.py", "containers"),
    Study("lifetime_table", "studies/lifetime_table/lifetime_table.py", "a registered model"),
    Study("model_variants", "studies/model_variants/model_variants.py", "trains every variant"),
    Study("next_share", "studies/next_share/next_share.py", "a night's data, champion"),
    Study("place_catalog", "studies/place_catalog/place_catalog.py", "containers, 40 minutes"),
    Study("questions", "studies/questions/questions.py", "a full night's data"),
    Study("reuse_threads", "studies/reuse_threads/reuse_threads.py", "a full night's data"),
    Study("scaling", "studies/scaling/scaling.py", "a network a point, 20+ minutes"),
    Study("table_bound", "studies/table_bound/table_bound.py", "a registered model"),
    Study("table_context", "studies/table_context/table_context.py", "a trained network"),
    Study("table_sites", "studies/table_sites/table_sites.py", "a registered model"),
    Study("tune_catalog", None, "heapcast tune, containers"),
    Study("whatif_answers", "studies/whatif_answers/whatif_answers.py", "a registered champion"),
    Study("whatif_causal", "studies/whatif_causal/whatif_causal.py", "a registered champion"),
    Study("whatif_guided", "studies/whatif_guided/whatif_guided.py", "ratios, no timing"),
    Study("whatif_layer", "studies/whatif_layer/whatif_layer.py", "containers"),
    Study("whatif_model", "studies/whatif_model/whatif_model.py", "a night's whatif table"),
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
