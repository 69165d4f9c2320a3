"""The night's summary in a terminal: the verdict first, nothing wider than 100 columns.

GIVEN a night with every section present (replays with a failure, converted runs, a trained and
promoted model over a previous champion, what-if, allocators, the layer's cases, heap reports,
allocator advice), built with the stages' own types and the tests' factories; and nights that
trained nothing or kept the champion
WHEN the summary is rendered for the terminal (`terminal_text`) and as markdown (`markdown_text`)
THEN the first 25 terminal lines say whether the champion changed and by how much against the
previous champion and the online counter, what the what-if and the layer bought, and where the
pages are; no terminal line is over 100 characters; on the whole catalog the terminal stays one
screen (at most 50 lines: the verdicts and the rows that differ from them); the markdown keeps
every wide table and every row.
"""

from __future__ import annotations

import subprocess

import pytest

from tasks.allocators.config import load_allocators_config
from tasks.allocators.report import write_outcome
from tasks.allocators.seeds import SeedsOutcome, seed_lines
from tasks.core.storage import Root
from tasks.learning.outcome import RegisteredModel, TrainResult
from tasks.nightly.markdown import markdown_text
from tasks.nightly.night_summary import StageOutcome, publish_summary, skipped, summarize
from tasks.nightly.params import NightContext
from tasks.nightly.summary_model import NightlySummary, StageReport
from tasks.nightly.terminal import _fold_command, terminal_text
from tasks.registry import headline
from tasks.registry.champion import PromotionDecision, decision_json
from tasks.registry.register import TAG_DECISION
from tasks.registry.tracking import TrackingConfig, resolve_target
from tasks.replay.replays import ReplayOutcome, TraceSummary
from tasks.replay.workloads import load_catalog
from tasks.report.night_reports import NightReports, RunReport
from tasks.whatif.night import AtBudget, WhatifSummary
from tests.tasks.allocators.tables import make_measurements, written_table
from tests.tasks.registry.outcome_factory import make_outcome, tiny_model

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

NAME = "heapcast-next-call"
WIDTH = 100
FIRST_SCREEN = 25


def model_run_with_decision(tracking: TrackingConfig, decision: PromotionDecision) -> str:
    """An MLflow run in the night's store carrying the decision as registration tags it."""
    from mlflow import MlflowClient

    target = resolve_target(tracking)
    client = MlflowClient(target.tracking_uri, target.registry_uri)
    experiment = client.create_experiment("nightly-terminal-test")
    run = client.create_run(experiment)
    client.set_tag(run.info.run_id, TAG_DECISION, decision_json(decision))
    return run.info.run_id


def whatif_summary() -> WhatifSummary:
    def at(workload: str, budget: int | None = None, **rates) -> AtBudget:
        return AtBudget(workload=workload, budget=budget, best_heuristic="largest", **rates)

    rates = dict(
        best_heuristic_hit_rate=0.7500,
        guided_hit_rate=0.8125,
        questions_hit_rate=0.7900,
        oracle_hit_rate=0.9300,
    )
    bought = headline.WhatifHeadline(1, 1 << 16, best_heuristic=0.75, guided_model=0.8125)
    return WhatifSummary(
        model_name=NAME,
        model_version="7",
        model_run_id="r",
        table_url="/data/whatif/v7/policies.parquet",
        runs_ok=["sqlite3/medium", "numpy_training_loop/small", "redis/small"],
        idle_budget=1 << 16,
        metrics=headline.whatif_metrics(bought),
        at_budget=[at(w, **rates) for w in ("sqlite3", "numpy_training_loop", "redis", "all")],
        by_budget=[at("all", 1 << k, **rates) for k in (12, 14, 16, 18, 20)],
    )


def seeds_outcome(root: Root, tmp_path) -> SeedsOutcome:
    """The seeds' three cases, 3 rounds (the quick night), every compared pair measured; the
    model's table against the online counter: -20 ms, +10 ms, -40 ms (medians)."""
    cfg = load_allocators_config().with_model_table(written_table(tmp_path, 7))

    def runs(table_vs_counter_s: float) -> dict[str, list[tuple[float, float]]]:
        rounds = (0.0, 0.01, -0.01)
        at = lambda wall, mb: [(wall + d, mb) for d in rounds]  # noqa: E731
        return {
            "glibc": at(1.31, 100.0),
            "tcmalloc": at(1.01, 110.0),
            "layer-largest": at(1.00, 104.0),
            "layer-guided": at(0.95, 102.0),
            "layer-table": at(0.95 + table_vs_counter_s, 101.0),
            "layer-guided-regret": at(0.97, 103.0),
            "layer-table-regret": at(0.94, 101.0),
        }

    cases = {
        "numpy_temporaries": runs(-0.020),
        "numpy_training_loop": runs(+0.010),
        "numpy_pipeline": runs(-0.040),
    }
    m = make_measurements({}, cases=cases, config=cfg)
    published = write_outcome(root, m, cfg, to_mlflow=False)
    return SeedsOutcome(lines=seed_lines(m, cfg), allocators=published)


def heap_reports(root: Root) -> NightReports:
    folder = root.join("reports", "2026-11-24T035200Z")
    return NightReports(
        folder=folder,
        reports=[
            RunReport(
                run=run,
                table=table,
                path=f"{folder}/{run.replace('/', '-')}.html",
                events=1_234_567,
                peak_bytes=48 << 20,
                leaks=12,
                leak_bytes=4096,
                processes=1,
            )
            for run, table in (
                ("sqlite3/medium", "unseen_runs"),
                ("numpy_training_loop/small", "unseen_programs"),
                ("redis/small", "heldout_workloads"),
            )
        ],
        failed={"git/small": "ValueError: " + "a very long reason " * 30},
    )


def context_at(folder) -> NightContext:
    root = Root.from_url(str(folder / "data"))
    return NightContext(root=root, tracking=TrackingConfig(root=root.url), catalog=load_catalog())


@pytest.fixture
def context(tmp_path) -> NightContext:
    return context_at(tmp_path)


@pytest.fixture(scope="module")
def full_night(tmp_path_factory) -> NightlySummary:
    """Every section present: tonight's v7 replaces v6 by +0.0150 top-1 (built once: the
    tests only read it)."""
    tmp_path = tmp_path_factory.mktemp("full-night")
    context = context_at(tmp_path)
    root = context.root
    outcome = make_outcome(tiny_model(), 0.92)
    d = outcome.dataset
    decision = PromotionDecision(
        promoted=True,
        decision="promoted",
        reason="candidate v7 top1=0.920000; champion v6 top1=0.905000",
        metric="top1",
        candidate_version="7",
        candidate_score=0.92,
        previous_champion_version="6",
        champion_score=0.905,
        champion_reevaluated=True,
    )
    run_id = model_run_with_decision(context.tracking, decision)
    scores = headline.training_metrics(outcome.evaluation, 3.0, 12_000.0)
    model = RegisteredModel(
        NAME, "7", run_id, tuple(d.eval_runs), tuple(d.unseen_program_runs), tuple(d.heldout_runs),
        decision="promoted", reason=decision.reason, headline=tuple(sorted(scores.items())),
    )  # fmt: skip
    trace = TraceSummary(
        runner="local",
        runner_reason="no container engine answered: bubblewrap",
        tracer="/t/libheapcast.so",
        root=root.url,
        runs=[
            ReplayOutcome(workload="sqlite3", input="medium", ok=True, events=10_000),
            ReplayOutcome(workload="redis", input="small", ok=True, events=9_000),
            ReplayOutcome(
                workload="git", input="small", ok=False, error="exit code 3, " + "why " * 200
            ),
        ],
    )
    converted = [
        {"workload": "sqlite3", "run": "medium", "rows": 10_000},
        {"workload": "redis", "run": "small", "rows": 9_000},
    ]
    seeds = seeds_outcome(root, tmp_path)
    # Prefect's ephemeral API, whatever an earlier test's harness left in the settings (a night
    # on a server links its flow run: test_a_night_on_a_prefect_server_links_its_flow_run)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tasks.nightly.night_summary.prefect_ui_url", lambda: "")
        return _summarize(context, trace, converted, outcome, model, seeds, root)


def _summarize(context, trace, converted, outcome, model, seeds, root) -> NightlySummary:
    return summarize.fn(
        context,
        [
            StageOutcome("trace", "COMPLETED", None, trace),
            StageOutcome("dataset", "COMPLETED", None, converted),
            StageOutcome("train", "COMPLETED", None, TrainResult(outcome, model)),
            StageOutcome("whatif", "COMPLETED", None, whatif_summary()),
            StageOutcome("allocators", "COMPLETED", None, seeds.allocators),
            StageOutcome("seeds", "COMPLETED", None, seeds),
        ],
        "6",
        "7",
        heap_reports=heap_reports(root),
    )


# the whole catalog's night: a what-if row per workload (the model behind the best heuristic on
# BEHIND, even on EVEN, ahead on the rest) and a heap report per evaluation run (one run of each
# workload and of each held-out program: 56 pages)
BEHIND = {"redis": -0.0400, "git": -0.0210, "gcc": -0.0150, "lua": -0.0090, "php": -0.0060}
EVEN = {"sed": 0.0010, "m4": -0.0020}
HELD_OUT = ("perl", "redis", "freeciv", "lua", "jq", "dot", "nasm", "ghostscript", "numpy_stack")


@pytest.fixture(scope="module")
def whole_catalog(full_night) -> NightlySummary:
    """`full_night` on every catalog workload: 47 what-if rows and the pooled one, 56 heap
    reports (the scheduled night's shape; its terminal summary was 176 lines)."""
    workloads = [w.name for w in load_catalog().workloads]
    pooled = next(a for a in full_night.whatif_at_budget if a.workload == "all")
    at_budget = [
        pooled.model_copy(
            update={
                "workload": w,
                "guided_hit_rate": pooled.best_heuristic_hit_rate
                + BEHIND.get(w, EVEN.get(w, 0.05)),
            }
        )
        for w in workloads
    ]
    one = full_night.heap_reports.reports[0]
    runs = [f"{w}/medium" for w in workloads] + [f"{p}/small" for p in HELD_OUT]
    reports = [one.model_copy(update={"run": run}) for run in runs]
    # under a root of the usual length (the pytest folder's is twice as long)
    tmp, root = full_night.root, "/srv/heapcast/data"
    return full_night.model_copy(
        update={
            "root": root,
            "summary_file": full_night.summary_file.replace(tmp, root),
            "mlflow_ui": full_night.mlflow_ui.replace(tmp, root),
            "whatif_at_budget": [*at_budget, pooled],
            "heap_reports": full_night.heap_reports.model_copy(
                update={
                    "reports": reports,
                    "folder": full_night.heap_reports.folder.replace(tmp, root),
                }
            ),
        }
    )


def test_a_night_on_a_prefect_server_links_its_flow_run(full_night):
    run = "http://127.0.0.1:4200/runs/flow-run/0b1c"
    top = first_screen(terminal_text(full_night.model_copy(update={"prefect_ui": run})))
    assert "Prefect UI (artifact `nightly-summary`)" in top and run in top
    assert "services.sh up" not in top


def first_screen(text: str) -> str:
    return "\n".join(text.splitlines()[:FIRST_SCREEN])


def test_the_first_screen_gives_the_verdict_the_bought_and_the_pages(full_night):
    text = terminal_text(full_night)
    top = first_screen(text)
    flat = top.replace("\n  ", " ")  # the verdict's lines unwrapped
    # did tonight's model win, against the previous champion and the online counter
    assert top.splitlines()[2].startswith(
        "CHAMPION CHANGED: v7 replaces v6: top-1 on unseen runs 0.9200 vs v6's 0.9050 (+0.0150;"
    )
    assert "v6 re-scored on them" in flat
    unseen = next(t for t in full_night.tables if t.table == "unseen_runs")
    assert unseen.online_counter == pytest.approx(0.88)  # outcome_factory's ngram_online
    assert "Against the online counter: top-1 0.9200 vs 0.8800 (+0.0400, unseen runs" in flat
    assert "mixed with it per thread 0.9050" in flat  # outcome_factory's model_hedged
    # what the predictions bought: the pooled what-if and the layer's measured ms
    assert (
        "What-if (64.00 KiB held idle, all workloads, causal): hit rate guided by the model "
        "0.8125 vs best heuristic largest 0.7500 (+0.0625); oracle 0.9300." in flat
    )
    assert "Layer, the model's table vs the online counter (3 rounds: too few" in flat
    assert "temporaries -20 ms (p=0.2), training_loop +10 ms (p=0.5), pipeline -40 ms" in flat
    # where the pages are, each whole (a long one folded with the shell's continuation)
    pages = top[top.index("\nPages\n") :]
    joined = pages.replace("\\\n", "").replace(" \\\n", " ")
    assert "heap reports (3 page(s), 1 failed):" in pages
    assert full_night.heap_reports.folder in " ".join(joined.split())
    assert "MLflow UI: .venv/bin/mlflow ui" in pages
    assert f"{full_night.mlflow_ui}" in " ".join(joined.split())
    assert f"then open http://127.0.0.1:5000/#/models/{NAME}/versions/7" in pages
    assert (
        'Prefect UI (http://127.0.0.1:4200 once started): eval "$(scripts/services.sh up)"' in pages
    )
    assert full_night.summary_file in " ".join(joined.split())
    # then the stages, one line each
    lines = text.splitlines()
    stages = lines.index("Stages")
    assert [line.split()[0] for line in lines[stages + 1 : stages + 7]] == [
        "trace", "dataset", "train", "whatif", "allocators", "seeds",
    ]  # fmt: skip


def test_no_terminal_line_is_over_100_characters(full_night):
    text = terminal_text(full_night)
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    # the detail is there, narrow: what failed, the what-if per workload and budget, the advice
    assert "  replay git/small: exit code 3" in text and "  heap report git/small: " in text
    assert "What-if at 64.00 KiB held idle, model vs best heuristic on 3 workloads:" in text
    assert "All workloads by idle budget, model - best heuristic: 4.00 KiB +0.0625" in text
    assert "Allocator advice (last measured" in text
    assert text.splitlines()[-1].startswith("Every table in full: the full summary, the artifact")
    # and the markdown is wider: it keeps what the terminal leaves out
    assert max(len(line) for line in markdown_text(full_night).splitlines()) > WIDTH


def test_the_whole_catalog_stays_one_screen(whole_catalog):
    text = terminal_text(whole_catalog)
    lines = text.splitlines()
    # GIVEN 47 what-if rows and 56 heap reports (176 terminal lines before)
    # THEN one screen: the verdicts, the pooled what-if and the workloads off its verdict
    assert len(lines) <= 50, text
    assert all(len(line) <= WIDTH for line in lines)
    assert "model vs best heuristic on 47 workloads: ahead 40, even 2, behind 5" in text
    table = [p for p in map(str.split, lines) if len(p) == 7 and p[1:3] == ["largest", "0.7500"]]
    rows = {p[0] for p in table}
    assert rows == {"all", "redis", "git", "gcc"}  # the widest margins against the verdict
    assert "  and 2 more off the pooled verdict" in text  # lua, php; the even sed, m4 are not
    assert "heap reports (56 page(s), 1 failed):" in text
    # AND the markdown keeps every row: each workload's what-if, each heap report
    page = markdown_text(whole_catalog)
    for a in whole_catalog.whatif_at_budget:
        assert f"| {a.workload} | largest 0.7500 | " in page
    for r in whole_catalog.heap_reports.reports:
        assert f"| {r.run} | {r.table} | 1,234,567 |" in page


def test_a_narrower_terminal_is_respected_too(full_night):
    too_wide = [line for line in terminal_text(full_night, width=80).splitlines() if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)


def test_the_markdown_keeps_every_wide_table(full_night):
    page = markdown_text(full_night)
    # the verdict opens the page too
    assert page.splitlines()[2].startswith("- CHAMPION CHANGED: v7 replaces v6")
    # the evaluation per workload and predictor, the headline, the what-if, the layer's lines
    assert "| workload | positions | model top-1 | model top-5 |" in page
    assert "| headline/unseen_runs.top1.model | 0.92 |" in page
    assert "## What the predictions bought (whatif, at 64.00 KiB held idle)" in page
    assert "| all | largest 0.7500 | 0.8125 | 0.7900 | 0.9300 |" in page
    assert "All workloads, by idle budget" in page
    assert "## What the layer bought, measured (seeds' cases; medians, ms and MB)" in page
    for line in full_night.seed_lines:
        assert f"- {line}" in page
    assert "| git/small | exit code 3, why why" in page
    assert "## Heap reports (evaluation runs)" in page
    assert "MLflow UI: `.venv/bin/mlflow ui --backend-store-uri " in page


def test_publishing_writes_the_full_markdown_to_the_summary_file(full_night, prefect_harness):
    root = Root.from_url(full_night.root)
    markdown = publish_summary(full_night, root)
    assert full_night.summary_file.startswith(root.url_of("nightly") + "/")
    with root.fs.open(full_night.summary_file) as f:
        assert f.read().decode() == markdown == markdown_text(full_night)


def bare_night(**fields) -> NightlySummary:
    return NightlySummary(
        root="/data",
        finished_at="2026-11-24T03:52:00+00:00",
        mlflow_ui=".venv/bin/mlflow ui --backend-store-uri sqlite:////data/mlflow/mlflow.db",
        mlflow_ui_url="http://127.0.0.1:5000",
        **fields,
    )


def test_a_night_that_trained_nothing_says_so_first():
    why = "EvaluationTooSmall: 2,000 positions, fewer than data.min_eval_positions=50,000"
    night = bare_night(
        stages=[
            StageReport(name="trace", state="FAILED", ok=False, error="no such workload " * 40),
            StageReport(name="dataset", state="COMPLETED", ok=True, detail="0 run(s) converted"),
            StageReport(name="train", state="FAILED", ok=False, error=why),
            StageReport(name="whatif", state="SKIPPED", ok=False, error="no model tonight"),
        ],
        trained=False,
        not_registered=why,
        champion_before="3",
        champion_after="3",
    )
    text = terminal_text(night)
    lines = text.splitlines()
    assert lines[0] == "heapcast nightly, 2026-11-24 03:52 UTC: 1 of 4 stages ok, NO MODEL TRAINED"
    assert lines[2].startswith(f"NO MODEL TRAINED: {why}.")
    assert "the champion stays v3." in first_screen(text)
    assert "What-if: the whatif stage skipped: no model tonight." in first_screen(text)
    assert "Layer: not measured tonight (the `seeds` option is off)." in first_screen(text)
    # a failed stage's error is on its lines, at most three, none too wide
    trace = [line for line in lines if line.startswith("  trace")]
    assert trace and "FAILED" in trace[0]
    assert all(len(line) <= WIDTH for line in lines)
    assert "(no model trained)" in markdown_text(night)


def test_a_kept_champion_says_by_how_much_tonights_model_lost():
    night = bare_night(
        stages=[StageReport(name="train", state="COMPLETED", ok=True, detail="trained")],
        trained=True,
        model_name=NAME,
        model_version="8",
        champion_before="6",
        champion_after="6",
        promotion={
            "decision": "kept",
            "metric": "top1",
            "candidate_version": "8",
            "candidate_score": 0.9,
            "previous_version": "6",
            "previous_score": 0.905,
        },
    )
    top = first_screen(terminal_text(night))
    assert (
        "Champion unchanged: tonight's v8 did not beat it; the champion stays v6: top-1 on "
        "unseen runs 0.9000 vs v6's 0.9050 (-0.0050)." in top.replace("\n  ", " ")
    )


def test_a_promotion_decision_that_cannot_be_read_is_said_not_fatal(context):
    outcome = make_outcome(tiny_model(), 0.92)
    d = outcome.dataset
    model = RegisteredModel(
        NAME, "1", "no-such-run", tuple(d.eval_runs), tuple(d.unseen_program_runs),
        tuple(d.heldout_runs), decision="first", reason="no champion yet",
    )  # fmt: skip
    night = summarize.fn(
        context,
        [
            StageOutcome("train", "COMPLETED", None, TrainResult(outcome, model)),
            skipped("whatif", "no runs to replay"),
        ],
        None,
        "1",
    )
    assert night.promotion is None and night.promotion_unread
    top = first_screen(terminal_text(night)).replace("\n  ", " ")
    assert "CHAMPION: v1 is the first champion (the scores could not be read: " in top
    assert "What-if: the whatif stage skipped: no runs to replay." in top


@pytest.mark.parametrize("width", [40, 80, 100])
def test_a_folded_command_pastes_back_to_the_same_words(width):
    """A command wider than the terminal is folded with the shell's line continuations: the
    shell reads the same words back, and no line is over the width."""
    cmd = (
        ".venv/bin/mlflow ui --backend-store-uri sqlite:////tmp/pytest-of-someone/pytest-12/"
        "a-test-with-a-long-name0/data/mlflow/mlflow.db --host 127.0.0.1 --port 5000"
    )
    lines = _fold_command(cmd, width, "      ", "    ")
    assert len(lines) > 1 and all(len(line) <= width for line in lines)
    echoed = subprocess.run(
        ["bash", "-c", 'printf "%s\\n" ' + "\n".join(lines)], capture_output=True, text=True
    )
    assert echoed.stdout.split("\n")[:-1] == cmd.split()


def test_what_the_context_bought_is_in_the_verdict_of_both_renderings():
    # GIVEN a night whose questions' counters had stacks (night_summary: context_line)
    said = "The calling context on unseen runs, one frame (site_online) -> the context: x."
    night = bare_night(stages=[], trained=False, not_registered="why", context=said)
    # THEN the terminal's first screen and the markdown page both carry it; without it, neither
    assert said in first_screen(terminal_text(night)).replace("\n  ", " ")
    assert said in markdown_text(night)
    bare = bare_night(stages=[], trained=False, not_registered="w")
    assert "calling context" not in terminal_text(bare)
