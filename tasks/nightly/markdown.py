"""The night's summary as one Markdown page, every table in full: the Prefect artifact
`nightly-summary`, the summary file under the root (tasks/nightly/night_summary.py:
publish_summary). The terminal (tasks/nightly/terminal.py) shows one screen of it.

The page: the verdict (tasks/nightly/verdict.py), a row per stage, the champion, the headline,
the failed replays, the evaluation, the allocator's questions, what the predictions bought, what
the layer bought, the allocator advice, the heap reports.
"""

from __future__ import annotations

from tasks.nightly.advice import advice_section
from tasks.nightly.summary_model import NightlySummary
from tasks.nightly.verdict import verdict_lines
from tasks.report.page import fmt_bytes
from tasks.whatif.night import AtBudget


def markdown_text(s: NightlySummary) -> str:
    """The whole page (see the module)."""
    sections = [
        head(s),
        stage_table(s),
        champion(s),
        headline(s),
        failed_replays(s),
        evaluation(s),
        allocator_questions(s),
        predictions_bought(s),
        layer_bought(s),
        advice_section(s.allocator_advice),
        heap_reports(s),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def head(s: NightlySummary) -> list[str]:
    """The title, the verdict, when and where, the MLflow UI."""
    ok = sum(st.ok for st in s.stages)
    lines = [
        f"# heapcast nightly: {ok} of {len(s.stages)} stages completed"
        + ("" if s.trained else " (no model trained)"),
        "",
        *(f"- {line}" for line in verdict_lines(s)),
        "",
        f"Finished {s.finished_at}. Data root: `{s.root}`.",
    ]
    if s.mlflow_ui_url:
        start = f"`{s.mlflow_ui}`, then " if s.mlflow_ui else ""
        lines.append(f"MLflow UI: {start}{s.mlflow_ui_url}.")
    return lines


def stage_table(s: NightlySummary) -> list[str]:
    lines = ["| stage | state | what ran | why it failed |", "|---|---|---|---|"]
    for st in s.stages:
        state = "ok" if st.ok else f"**{st.state.lower()}**"
        lines.append(f"| {st.name} | {state} | {_cell(st.detail)} | {_cell(st.error or '')} |")
    return lines


def champion(s: NightlySummary) -> list[str]:
    """The champion before and after, the registration's decision, or why nothing registered."""
    lines = ["## Champion", ""]
    if s.champion_changed:
        lines.append(
            f"**The champion changed**: version {s.champion_before or '(none)'} "
            f"→ version {s.champion_after}."
        )
    elif s.champion_after is not None:
        lines.append(f"The champion did not change: version {s.champion_after}.")
    else:
        lines.append("No champion in the registry.")
    if s.registration:
        lines.append(f"Registration: {s.registration}")
    if s.not_registered:
        lines += [
            "",
            f"**Nothing was registered tonight**: {s.not_registered}. The champion is left alone.",
        ]
    return lines


def headline(s: NightlySummary) -> list[str]:
    if not s.headline:
        return []
    return [
        "## Headline (the model's MLflow run: tasks/registry/headline.py)",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {v:.6g} |" for k, v in s.headline.items()),
    ]


def failed_replays(s: NightlySummary) -> list[str]:
    if not s.replays_failed:
        return []
    return [
        "## Failed replays",
        "",
        "| run | why |",
        "|---|---|",
        *(f"| {k} | {_cell(v)} |" for k, v in s.replays_failed.items()),
    ]


def evaluation(s: NightlySummary) -> list[str]:
    if not s.evaluation_markdown:
        return []
    return ["## Evaluation (runs never seen in training)", "", s.evaluation_markdown.strip()]


def allocator_questions(s: NightlySummary) -> list[str]:
    """Reuse and lifetime per evaluation table, then per program never trained on."""
    lines = []
    if s.allocator_questions:
        lines += [
            "## The allocator's questions: the network against the counters",
            "",
            "Reuse: at a free, is its class requested again soon in the process? Lifetime: "
            "at an allocation, how long will the block live? Every answer is causal.",
            "",
            *(f"- {line}" for line in s.allocator_questions),
        ]
    if s.program_questions:
        lines += [
            *([""] if lines else []),
            "Per program never trained on, the best of the model's answers (network, "
            "network_survival, network_hedged) against the best baseline (majority, "
            "class_online, site_online, site_survival), and whether network_hedged alone "
            "(the one answer, not picked per cell) is ahead of that baseline:",
            "",
            *(f"- {line}" for line in s.program_questions),
        ]
    return lines


BOUGHT_HEADER = (
    "best heuristic | guided by the model | guided by the reuse network | oracle (bound) |"
)


def predictions_bought(s: NightlySummary) -> list[str]:
    """What the predictions bought: per workload, hit rates at the whatif idle budget; then
    all workloads pooled, at each sweep budget."""
    if not s.whatif_at_budget or s.whatif_budget is None:
        return []
    lines = [
        f"## What the predictions bought (whatif, at {fmt_bytes(s.whatif_budget)} held idle)",
        "",
        "Causal: each guided decision is made at the free, from what the cache has then "
        "(the model's next-call top-k; the reuse network's P(class requested again within "
        "16 calls) >= 1/2).",
        "",
        f"| workload | {BOUGHT_HEADER}",
        "|---|---|---|---|---|",
        *(bought_row(a.workload, a) for a in s.whatif_at_budget),
    ]
    if s.whatif_by_budget:
        lines += [
            "",
            "All workloads, by idle budget (which policy wins depends on it; where every",
            "policy keeps every freed block, they tie):",
            "",
            f"| held idle | {BOUGHT_HEADER}",
            "|---|---|---|---|---|",
            *(bought_row(fmt_bytes(a.budget or 0), a) for a in s.whatif_by_budget),
        ]
    return lines


def bought_row(first: str, a: AtBudget) -> str:
    best = _rate(a.best_heuristic_hit_rate)
    if a.best_heuristic is not None:
        best = f"{a.best_heuristic} {best}"
    return (
        f"| {first} | {best} | {_rate(a.guided_hit_rate)} | {_rate(a.questions_hit_rate)} | "
        f"{_rate(a.oracle_hit_rate)} |"
    )


def layer_bought(s: NightlySummary) -> list[str]:
    lines = ["## What the layer bought, measured (seeds' cases; medians, ms and MB)", ""]
    if s.seed_lines:
        return lines + [f"- {line}" for line in s.seed_lines]
    return lines + [
        "Not measured tonight: the night's `seeds` option is off (the scheduled night "
        "and `make run`'s quick night, with fewer rounds, turn it on; "
        "`python -m flows.allocators --seeds` measures them)."
    ]


def heap_reports(s: NightlySummary) -> list[str]:
    if s.heap_reports is None:
        return []
    return ["## Heap reports (evaluation runs)", "", s.heap_reports.markdown()]


def _rate(hit_rate: float | None) -> str:
    return "n/a" if hit_rate is None else f"{hit_rate:.4f}"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:400]
