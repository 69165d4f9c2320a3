"""The answers, written down: Parquet tables, a markdown table, plots, an MLflow run.

Under the data root (`tasks.core.storage.Root`), one folder per measurement (`night`):

  allocators/summary/night=<stamp>/part-0.parquet   one row per (case, allocator): status, output
                                                     check, median and spread of each metric,
                                                     ratios to the baseline, the case's
                                                     recommendation, its heap features
  allocators/samples/night=<stamp>/part-0.parquet   one row per measured run
  allocators/reports/night=<stamp>/allocators.md    the markdown table (also a Prefect artifact)
  allocators/reports/night=<stamp>/allocators.png   time against peak memory, one panel per case
  allocators/reports/night=<stamp>/plots/<case>.png the same, one file per case
  allocators/reports/night=<stamp>/measurements.json  everything measured, as measured

`pyarrow.dataset.dataset(<root>/allocators/summary, partitioning="hive")` reads every night;
`last_advice` reads the newest recommendation per case from them (the nightly summary's section).
MLflow: one run per measurement in the config's experiment (its own, not the models'), metrics
`<case>.<allocator>.wall_s`, `.peak_rss_mb`, `.cpu_s` (medians), `<case>.margin`, tags
`recommended.<case>`, and the report folder as artifacts.
"""

from __future__ import annotations

import io
import posixpath
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from pydantic import BaseModel

from tasks.allocators.config import MIN_REPETITIONS, AllocatorsConfig, current_allocator
from tasks.allocators.heap import HeapFeatures, features_for
from tasks.allocators.measure import Measurements, run_logger
from tasks.allocators.stats import METRICS, PairSummary, Recommendation, analyse, samples_frame
from tasks.core.storage import Root
from tasks.registry.tracking import TrackingConfig, configure, tracking_for

SPREAD_FIELDS = ("median", "min", "max", "q1", "q3")


class AllocatorsOutcome(BaseModel):
    """What `publish` wrote and found; the flow reports it."""

    night: str
    summary_path: str
    samples_path: str
    report_dir: str
    markdown: str
    recommendations: list[Recommendation]
    pairs: list[PairSummary]
    features: dict[str, HeapFeatures | None]
    mlflow_run_id: str | None = None
    failed: list[str]  # "<case> under <allocator>: why" for each failed or unavailable pair


class Advice(BaseModel):
    """A case's recommendation as its night's summary table holds it (`last_advice`)."""

    night: str
    case: str
    recommendation: str | None  # None: no allocator ran cleanly
    baseline: str
    objective: str | None  # time or memory; None in tables written before it was recorded
    margin: float | None
    margin_low: float | None
    margin_high: float | None
    beyond_noise: bool | None
    best_challenger: str | None
    # the recommended candidate's line to paste before a command (`Allocator.line`, "" for
    # the C library as it is); None in tables written before it was recorded
    line: str | None
    report: str  # the night's markdown table
    experiment: str | None  # the MLflow experiment of the measurement's run
    rounds: int | None = None  # the baseline's runs in that measurement (None: not recorded)
    # the rule's plan could not reach its bar: the rounds it would need (None: it could, or
    # a table written before the rule recorded it)
    rounds_needed: int | None = None
    rounds_stop: str | None = None  # why the rounds stopped (None: not recorded)

    @property
    def can_decide(self) -> bool:
        """Whether the measurement's rounds could reach the rule's bar (a quick seeds
        measurement's 3 cannot); tables written before the rule recorded it: whether they
        had MIN_REPETITIONS rounds."""
        if self.rounds_stop is not None:
            return self.rounds_needed is None
        return self.rounds is None or self.rounds >= MIN_REPETITIONS


class LastAdvice(BaseModel):
    """The newest recommendation per case over every night, and each table that was unreadable."""

    advice: list[Advice]
    problems: list[str]  # "<path>: why"

    @property
    def last_night(self) -> str | None:
        return max((a.night for a in self.advice), default=None)


def features_for_cases(
    root: Root, m: Measurements, large_block_bytes: int
) -> dict[str, HeapFeatures | None]:
    """{case label: heap features from the events dataset, or None where it lacks the workload}."""
    return {c.label: features_for(root, c.workload, c.input, large_block_bytes) for c in m.cases}


def safe_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


# ----------------------------------------------------------------------------------- tables


def summary_table(
    m: Measurements,
    pairs: list[PairSummary],
    recs: list[Recommendation],
    features: dict[str, HeapFeatures | None],
    experiment: str,
) -> pa.Table:
    by_case = {r.case: r for r in recs}
    allocators = {a.name: a for a in m.allocators}
    rows = []
    for p in pairs:
        r = by_case.get(p.case)
        f = features.get(p.case)
        row = {
            "night": m.night,
            "case": p.case,
            "workload": p.workload,
            "input": p.input,
            "allocator": p.allocator,
            "baseline": m.baseline,
            "runner": m.runner,
            "status": p.status,
            "reason": p.reason,
            "output": p.output,
            "runs": p.runs,
            "ok_runs": p.ok_runs,
            "time_vs_baseline": p.time_vs_baseline,
            "memory_vs_baseline": p.memory_vs_baseline,
            "recommended": p.recommended,
            "recommendation": r.allocator if r else None,
            "margin": r.margin if r else None,
            "p_value": r.p_value if r else None,
            "p_adjusted": r.p_adjusted if r else None,
            "margin_low": r.margin_low if r else None,
            "margin_high": r.margin_high if r else None,
            "best_challenger": r.best_challenger if r else None,
            "ranges_overlap": r.ranges_overlap if r else None,
            "beyond_noise": r.beyond_noise if r else None,
            "objective": r.objective if r else None,
            # the rule of the rounds: how many its decision needed, why they stopped, the
            # rounds a plan that could not reach the bar would need, and this candidate's way
            # out of the race
            "rounds": r.rounds if r else None,
            "rounds_stop": r.stop if r else None,
            "rounds_needed": r.needed_rounds if r else None,
            "level": r.level if r else None,
            "out_of_race": _dropped(m, p.case).get(p.allocator),
            # this row's candidate as one pastes it (the measured definition, not today's config)
            "line": allocators[p.allocator].line() if p.allocator in allocators else None,
            "experiment": experiment,
        }
        for metric in METRICS:
            s = p.stats.get(metric)
            for k in SPREAD_FIELDS:
                row[f"{metric}_{k}"] = getattr(s, k) if s else None
        for k in HeapFeatures.model_fields:
            if k not in ("workload",):
                row[f"heap_{k}"] = getattr(f, k) if f else None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=_summary_schema())


def _dropped(m: Measurements, case: str) -> dict[str, str]:
    r = m.rounds.get(case)
    return r.dropped if r else {}


def _summary_schema() -> pa.Schema:
    fields = [
        ("night", pa.string()),
        ("case", pa.string()),
        ("workload", pa.string()),
        ("input", pa.string()),
        ("allocator", pa.string()),
        ("baseline", pa.string()),
        ("runner", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("output", pa.string()),
        ("runs", pa.int64()),
        ("ok_runs", pa.int64()),
        ("time_vs_baseline", pa.float64()),
        ("memory_vs_baseline", pa.float64()),
        ("recommended", pa.bool_()),
        ("recommendation", pa.string()),
        ("margin", pa.float64()),
        ("p_value", pa.float64()),
        ("p_adjusted", pa.float64()),
        ("margin_low", pa.float64()),
        ("margin_high", pa.float64()),
        ("best_challenger", pa.string()),
        ("ranges_overlap", pa.bool_()),
        ("beyond_noise", pa.bool_()),
        ("objective", pa.string()),
        ("rounds", pa.int64()),
        ("rounds_stop", pa.string()),
        ("rounds_needed", pa.int64()),
        ("level", pa.float64()),
        ("out_of_race", pa.string()),
        ("line", pa.string()),
        ("experiment", pa.string()),
    ]
    fields += [(f"{m}_{k}", pa.float64()) for m in METRICS for k in SPREAD_FIELDS]
    heap_types = {
        "run": pa.string(),
        "events": pa.int64(),
        "allocations": pa.int64(),
        "large_block_bytes": pa.int64(),
        "processes": pa.int64(),
        "threads": pa.int64(),
    }
    fields += [
        (f"heap_{k}", heap_types.get(k, pa.float64()))
        for k in HeapFeatures.model_fields
        if k != "workload"
    ]
    return pa.schema(fields)


def samples_table(m: Measurements) -> pa.Table:
    df = samples_frame(m)
    df.insert(0, "night", m.night)
    return pa.Table.from_pandas(df, preserve_index=False)


# ----------------------------------------------------------------------------------- markdown


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.1f} s"
    if x >= 1e3:
        return f"{x / 1e3:.1f} ms"
    return f"{x:.1f} µs"


def _pair_cell(p: PairSummary, baseline: str, time_metric: str, mem_metric: str) -> str:
    if p.status == "unavailable":
        return "missing (see below)"
    if p.status == "failed":
        return "**failed** (see below)"
    mark = " ★" if p.recommended else ""
    if p.allocator == baseline:
        t, mem = p.stats.get(time_metric), p.stats.get(mem_metric)
        if t is None or mem is None:
            return "-"
        return f"{_fmt_s(t.median)} [{t.min:.3g}–{t.max:.3g}] · {mem.median:.1f} MB{mark}"
    if p.time_vs_baseline is None or p.memory_vs_baseline is None:
        t, mem = p.stats.get(time_metric), p.stats.get(mem_metric)
        return f"{_fmt_s(t.median if t else None)} · {mem.median if mem else 0:.1f} MB{mark}"
    return f"{p.time_vs_baseline:.2f}× time · {p.memory_vs_baseline:.2f}× mem{mark}"


def _rec_cell(r: Recommendation) -> str:
    if r.allocator is None:
        return "none: " + r.note
    if r.allocator == r.baseline or r.margin is None:
        interval = (
            f"; {r.best_challenger}: {r.margin_low * 100:+.1f}% to {r.margin_high * 100:+.1f}%, "
            f"Holm p={r.p_adjusted:.3f}"
            if r.best_challenger and r.margin_low is not None and r.p_adjusted is not None
            else ""
        )
        return f"**{r.allocator}**" + (f" ({r.note}{interval})" if r.note else "") + _rounds(r)
    on_memory = r.objective == "memory"
    if on_memory:
        word = "less memory" if r.margin >= 0 else "more memory"
    else:
        word = "faster" if r.margin >= 0 else "slower"
    noise = "beyond noise" if r.beyond_noise else "within noise"
    p = f"p={r.p_value:.3f}" if r.p_value is not None else ""
    if r.p_adjusted is not None:
        p += f", Holm-adjusted {r.p_adjusted:.3f} over {r.compared}"
    if r.margin_low is not None:
        p += f", margin {r.margin_low * 100:.1f}% to {r.margin_high * 100:.1f}%"
    overlap = "ranges overlap" if r.ranges_overlap else "ranges apart"
    mem = (
        f", {r.memory_vs_baseline:.2f}× memory"
        if r.memory_vs_baseline is not None and not on_memory  # on memory: the margin says it
        else ""
    )
    return (
        f"**{r.allocator}**: {abs(r.margin) * 100:.1f}% {word} than {r.baseline}{mem}; "
        f"{noise} ({p}, {overlap})" + _rounds(r)
    )


def _rounds(r: Recommendation) -> str:
    """How many rounds the decision needed and why they stopped."""
    if r.rounds is None:
        return ""
    why = f": {r.stop}" if r.stop else ""
    return f"; {r.rounds} rounds{why}"


def stepped_aside(m: Measurements) -> list[str]:
    """Per workload and layer candidate whose runs kept nothing because no process gave the
    layer its proof (layer.c hl_ghost_hit): in how many runs, and in how many processes."""
    runs: dict[tuple[str, str], list] = {}
    for s in m.samples:
        if s.ok and s.layer_processes and s.layer_proven is not None:
            runs.setdefault((s.case, s.allocator), []).append(s)
    out = []
    for (case, allocator), got in sorted(runs.items()):
        aside = [
            s for s in got if (s.layer_unproven or 0) > 0 and s.layer_proven < s.layer_processes
        ]
        if not aside:
            continue
        procs = sum(s.layer_processes - s.layer_proven for s in aside)
        total = sum(s.layer_processes for s in aside)
        out.append(
            f"{case} under {allocator}: in {len(aside)} of {len(got)} runs "
            f"({procs} of {total} processes kept nothing)"
        )
    return out


def _plan_lines(m: Measurements) -> list[str]:
    """The rule of the rounds as planned before any run, once per distinct plan."""
    plans = list(dict.fromkeys(r.plan.describe() for r in m.rounds.values()))
    bound = max((r.plan.bound for r in m.rounds.values()), default=m.repetitions)
    if not plans:
        return []
    more = (
        f" Rounds added, up to {bound}, for the candidates still in the race while the rule had "
        "not decided."
        if bound > m.repetitions
        else ""
    )
    return [f"The rounds' rule: {'; '.join(plans)}.{more}"]


def markdown(
    m: Measurements,
    pairs: list[PairSummary],
    recs: list[Recommendation],
    features: dict[str, HeapFeatures | None],
    config: AllocatorsConfig,
) -> str:
    rule = config.rule
    names = [a.name for a in m.allocators]
    sources = sorted({s.peak_source for s in m.samples if s.peak_source})
    lines = [
        f"## Allocators ({m.night})",
        "",
        f"Runner: {m.runner} ({m.runner_detail}) on {m.host}; "
        f"{m.repetitions} rounds per workload after {m.warmup} warm-up run(s), every allocator "
        f"once per round, the order rotated each round; {'traced' if m.traced else 'untraced'}.",
        *_plan_lines(m),
        f"Time: median {rule.time} of the program itself; memory: median {rule.memory} "
        f"({', '.join(sources) or 'no source'}). {m.baseline} cell: median [min–max] and "
        f"memory; other cells: ratio of medians to {m.baseline}'s (below 1: less). ★ recommended.",
        f"Rule: {rule.describe()}.",
        *(
            f"{w}, judged on {o} (`objectives`): {config.rule_for(w).describe()}."
            for w, o in sorted(config.objectives.items())
            if o != rule.objective and w in {c.workload for c in m.cases}
        ),
        "",
        "| workload | sizes % ≤64B/≤1K/<128K/≥128K | threads | median life | realloc | "
        + " | ".join(names)
        + " | recommendation |",
        "|" + "---|" * (6 + len(names)),
    ]
    by_case = {r.case: r for r in recs}
    for c in m.cases:
        f = features.get(c.label)
        if f is not None:
            heap = [
                f.size_mix() + ("" if f.run == c.input else f" (run {f.run})"),
                f"{f.threads}" + (f" ×{f.processes} proc" if f.processes > 1 else ""),
                _fmt_us(f.median_lifetime_us),
                f"{f.realloc_share * 100:.0f}%",
            ]
        else:
            heap = ["not in the events dataset", "-", "-", "-"]
        cells = []
        for name in names:
            p = next((q for q in pairs if q.case == c.label and q.allocator == name), None)
            cells.append(_pair_cell(p, m.baseline, rule.time, rule.memory) if p else "-")
        rec = by_case.get(c.label)
        lines.append(
            f"| {c.label} | " + " | ".join(heap + cells) + f" | {_rec_cell(rec) if rec else '-'} |"
        )
    aside = stepped_aside(m)
    if aside:
        lines += [
            "",
            "Where heapcast's layer stepped aside (it keeps nothing until the program has asked "
            "again for blocks it freed: `proof` in native/README.md):",
            "",
            *(f"- {line}" for line in aside),
        ]
    problems = [p for p in pairs if p.status != "ok"]
    unchecked = sorted({(p.case, p.output) for p in pairs if p.output.startswith("unchecked:")})
    if problems:
        lines += ["", "Not measured or failed:", ""]
        lines += [f"- {p.case} under {p.allocator}: {p.status}: {p.reason}" for p in problems]
    if unchecked:
        lines += ["", "Output checks:", ""]
        lines += [f"- {case}: {why}" for case, why in unchecked if why != "unchecked: not run"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- plots


def _draw_case(ax, case: str, pairs: list[PairSummary], time_metric: str, mem_metric: str, colors):
    for p in pairs:
        t, mem = p.stats.get(time_metric), p.stats.get(mem_metric)
        if t is None or mem is None:
            continue
        marker = "*" if p.recommended else ("x" if p.status == "failed" else "o")
        size = 14 if p.recommended else 7
        ax.errorbar(
            mem.median,
            t.median,
            xerr=[[mem.median - mem.min], [mem.max - mem.median]],
            yerr=[[t.median - t.min], [t.max - t.median]],
            fmt=marker,
            markersize=size,
            capsize=3,
            color=colors.get(p.allocator),
            label=p.allocator + (" (failed)" if p.status == "failed" else ""),
        )
        ax.annotate(p.allocator, (mem.median, t.median), textcoords="offset points", xytext=(5, 5))
    ax.set_title(case)
    ax.set_xlabel(f"{mem_metric} (median, min–max)")
    ax.set_ylabel(f"{time_metric} (median, min–max)")
    ax.grid(True, alpha=0.3)


def plots(m: Measurements, pairs: list[PairSummary], config: AllocatorsConfig) -> dict[str, bytes]:
    """{file name: PNG}: `allocators.png` (one panel per case) and `plots/<case>.png`."""
    # deferred: imported on first use, for start-up time
    import matplotlib

    matplotlib.use("Agg")
    # deferred: imported on first use, for start-up time
    import matplotlib.pyplot as plt

    rule = config.rule
    out: dict[str, bytes] = {}
    colors = {a.name: f"C{i}" for i, a in enumerate(m.allocators)}  # one colour per allocator

    def png(fig) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        return buf.getvalue()

    for c in m.cases:
        fig, ax = plt.subplots(figsize=(5.5, 4.2), layout="constrained")
        case_pairs = [p for p in pairs if p.case == c.label]
        _draw_case(ax, c.label, case_pairs, rule.time, rule.memory, colors)
        out[f"plots/{safe_name(c.label)}.png"] = png(fig)
    if m.cases:
        n = len(m.cases)
        cols = min(3, n)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(
            rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False, layout="constrained"
        )
        for ax, c in zip(axes.flat, m.cases):
            case_pairs = [p for p in pairs if p.case == c.label]
            _draw_case(ax, c.label, case_pairs, rule.time, rule.memory, colors)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(f"allocators {m.night}: time against peak memory (★ recommended)")
        out["allocators.png"] = png(fig)
    return out


# ----------------------------------------------------------------------------------- MLflow


def mlflow_metrics(pairs: list[PairSummary], recs: list[Recommendation]) -> dict[str, float]:
    """`<case>.<allocator>.wall_s` / `.peak_rss_mb` / `.cpu_s` (medians of measured pairs) and
    `<case>.margin` (the recommendation's, where there is one)."""
    out: dict[str, float] = {}
    for p in pairs:
        for metric in ("wall_s", "peak_rss_mb", "cpu_s"):
            v = p.median(metric)
            if v is not None:
                out[f"{p.case}.{p.allocator}.{metric}"] = float(v)
    for r in recs:
        if r.margin is not None:
            out[f"{r.case}.margin"] = float(r.margin)
    return out


def log_mlflow(
    root: Root,
    m: Measurements,
    pairs: list[PairSummary],
    recs: list[Recommendation],
    config: AllocatorsConfig,
    artifacts_dir: Path | None = None,
    tracking: TrackingConfig | None = None,
) -> str:
    """One MLflow run for this measurement in the config's experiment (tracking: `tracking`,
    else configs/tracking.yaml for this root, as the other stages); returns its id."""

    tracking = (tracking or tracking_for(root)).model_copy(update={"experiment": config.experiment})
    configure(tracking)
    # deferred: imported on first use, for start-up time
    import mlflow

    with mlflow.start_run(run_name=f"allocators-{m.night}") as run:
        mlflow.log_params(
            {
                "allocators": ",".join(a.name for a in m.allocators),
                "baseline": m.baseline,
                "repetitions": m.repetitions,
                "warmup": m.warmup,
                "runner": m.runner,
                "traced": m.traced,
                "rule.time": config.rule.time,
                "rule.memory": config.rule.memory,
                "rule.memory_tolerance": config.rule.memory_tolerance,
                "rule.noise": config.rule.noise,
                "rule.alpha": config.rule.alpha,
                "cases": ",".join(c.label for c in m.cases),
            }
        )
        tags = {"heapcast.stage": "allocators", "night": m.night, "host": m.host}
        tags.update({f"recommended.{r.case}": r.allocator or "none" for r in recs})
        tags.update({f"status.{p.case}.{p.allocator}": p.status for p in pairs if p.status != "ok"})
        mlflow.set_tags(tags)
        metrics = mlflow_metrics(pairs, recs)
        if metrics:
            mlflow.log_metrics(metrics)
        if artifacts_dir is not None:
            mlflow.log_artifacts(str(artifacts_dir))
        return run.info.run_id


# ----------------------------------------------------------------------------------- publish


def write_outcome(
    root: Root,
    m: Measurements,
    config: AllocatorsConfig,
    *,
    to_mlflow: bool = True,
    tracking: TrackingConfig | None = None,
) -> AllocatorsOutcome:
    """Analyse `m` (tasks.allocators.stats), gather the heap features, and write everything
    (see the module); with `to_mlflow`, log the run too."""
    log = run_logger()
    pairs, recs = analyse(m, config)
    features = features_for_cases(root, m, config.large_block_bytes)
    md = markdown(m, pairs, recs, features, config)
    fs = root.fs
    part = f"night={m.night}"
    summary_path = root.join("allocators", "summary", part, "part-0.parquet")
    samples_path = root.join("allocators", "samples", part, "part-0.parquet")
    report_dir = root.join("allocators", "reports", part)
    for path, table in (
        (summary_path, summary_table(m, pairs, recs, features, config.experiment)),
        (samples_path, samples_table(m)),
    ):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            pq.write_table(table, f)
    run_id = None
    with tempfile.TemporaryDirectory(prefix="heapcast-allocators-") as tmp:
        local = Path(tmp)
        (local / "allocators.md").write_text(md)
        (local / "measurements.json").write_text(m.model_dump_json(indent=1))
        for name, data in plots(m, pairs, config).items():
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        for p in sorted(local.rglob("*")):
            if p.is_file():
                dest = f"{report_dir}/{p.relative_to(local).as_posix()}"
                fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
                fs.put_file(str(p), dest)
        if to_mlflow:
            run_id = log_mlflow(root, m, pairs, recs, config, local, tracking)
    failed = [f"{p.case} under {p.allocator}: {p.reason}" for p in pairs if p.status != "ok"]
    for line in failed:
        log.warning(line)
    return AllocatorsOutcome(
        night=m.night,
        summary_path=summary_path,
        samples_path=samples_path,
        report_dir=report_dir,
        markdown=md,
        recommendations=recs,
        pairs=pairs,
        features=features,
        mlflow_run_id=run_id,
        failed=failed,
    )


@task(name="publish-allocators", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10)
def publish(
    measurements: Measurements,
    root: Root,
    config: AllocatorsConfig,
    to_mlflow: bool = True,
    tracking: TrackingConfig | None = None,
) -> AllocatorsOutcome:
    """Write the tables, the markdown table and the plots under <root>/allocators/, log one
    MLflow run (`tracking`: configs/tracking.yaml's when None), and publish the markdown as the
    Prefect artifact `allocators`."""
    outcome = write_outcome(root, measurements, config, to_mlflow=to_mlflow, tracking=tracking)

    if FlowRunContext.get() or TaskRunContext.get():  # called as `publish.fn` outside: no API
        create_markdown_artifact(
            outcome.markdown,
            key="allocators",
            description="which allocator suits each workload, measured",
        )
    return outcome


# ----------------------------------------------------------------------------------- reading


ADVICE_COLUMNS = (
    "case",
    "allocator",
    "baseline",
    "recommendation",
    "objective",
    "margin",
    "margin_low",
    "margin_high",
    "beyond_noise",
    "best_challenger",
    "line",
    "experiment",
    "runs",
    "rounds_needed",
    "rounds_stop",
)


def _night_advice(root: Root, night: str, path: str) -> list[Advice]:
    with root.fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        # tables written before `objective`, `line` and `experiment` were recorded lack them
        cols = [c for c in ADVICE_COLUMNS if c in pf.schema_arrow.names]
        rows = pf.read(columns=cols).to_pylist()
    # a night's former candidate names (RENAMED_POLICIES) as the candidates' names now
    for row in rows:
        for k in ("allocator", "baseline", "recommendation", "best_challenger"):
            if row.get(k) is not None:
                row[k] = current_allocator(row[k])
    report = root.url_of("allocators", "reports", f"night={night}", "allocators.md")
    out: dict[str, Advice] = {}
    rounds = {r["case"]: r.get("runs") for r in rows if r["allocator"] == r["baseline"]}
    for row in rows:
        case = row["case"]
        rec = row["recommendation"]
        if case in out and row["allocator"] != rec:
            continue
        out[case] = Advice(
            night=night,
            case=case,
            recommendation=rec,
            baseline=row["baseline"],
            objective=row.get("objective"),
            margin=row["margin"],
            margin_low=row["margin_low"],
            margin_high=row["margin_high"],
            beyond_noise=row["beyond_noise"],
            best_challenger=row["best_challenger"],
            line=row.get("line") if row["allocator"] == rec else None,
            report=report,
            experiment=row.get("experiment"),
            rounds=rounds.get(case),
            rounds_needed=row.get("rounds_needed"),
            rounds_stop=row.get("rounds_stop"),
        )
    return list(out.values())


def last_advice(root: Root) -> LastAdvice:
    """The newest recommendation per case under `<root>/allocators/summary` (every night, newest
    first) among the measurements with rounds enough to decide (a quick seeds measurement's 3
    rounds cannot: it is the case's advice only when nothing else measured it); a table that
    cannot be read is a problem named with its path, never an error."""
    folder = root.join("allocators", "summary")
    fs = root.fs
    if not fs.isdir(folder):
        return LastAdvice(advice=[], problems=[])
    nights = sorted(
        (
            posixpath.basename(p.rstrip("/")).removeprefix("night=")
            for p in fs.ls(folder, detail=False)
            if posixpath.basename(p.rstrip("/")).startswith("night=")
        ),
        reverse=True,
    )
    seen: dict[str, Advice] = {}
    problems: list[str] = []
    for night in nights:
        path = posixpath.join(folder, f"night={night}", "part-0.parquet")
        try:
            found = _night_advice(root, night, path)
        except Exception as err:  # any unreadable table: reported, the others still read
            problems.append(
                f"{root.url_of('allocators', 'summary', f'night={night}')}: "
                f"{type(err).__name__}: {err}"
            )
            continue
        for a in found:
            held = seen.get(a.case)
            if held is None or (not held.can_decide and a.can_decide):
                seen[a.case] = a
    return LastAdvice(advice=sorted(seen.values(), key=lambda a: a.case), problems=problems)
