"""MLflow's real UI, in headless Chromium, over a store holding two real training runs.

GIVEN two nights trained for real on synthetic events (the smallest config of
test_register_pipeline), each registered and replayed by the whatif stage, in one store
WHEN scripts/mlflow-server.sh serves that store and Chromium opens the experiment's chart view
(where MLflow 3 compares the runs it lists), the compare page of the two runs and a run's page
THEN the chart view's first section is `headline`: the model against the best baseline on each
table and what the predictions bought, a bar per night; the compare page lists the headline
metrics for both runs; the run page shows them. Screenshots of the three pages are kept in the
folder the test prints (HEAPCAST_UI_SHOTS, else a temporary folder).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.learning.train import evaluate, train
from tasks.registry.champion import champion_config
from tasks.registry.register import register_outcome, registered_model
from tasks.registry.tracking import TrackingConfig, configure
from tasks.replay.workloads import load_catalog
from tasks.whatif.night import (
    ModelRef,
    WhatifParams,
    load_predictor,
    log_to_mlflow,
    replay_run,
    summarize,
)
from tasks.whatif.policies import GuidedConfig, LargestConfig, LruConfig, NoneConfig
from tests.localhost import mlflow_server
from tests.tasks.learning.tiny_training import tiny_train_config

pytestmark = pytest.mark.integration

NIGHTS = ("night-1", "night-2")
WHATIF_GRID = [
    NoneConfig(),
    LargestConfig(n=2),
    LruConfig(budget=1 << 16),
    GuidedConfig(budget=1 << 16, ttl_calls=16),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two nights, each trained, registered and replayed through a small policy grid."""
    base = tmp_path_factory.mktemp("ui")
    tracking = TrackingConfig(root=str(base / "store"))
    configure(tracking)
    from mlflow import MlflowClient

    data = Root.from_url(str(base / "data"))
    write_synthetic_events(data, {"alpha": 3, "beta": 2, "gamma": 2}, tokens_per_run=2000)
    runs = []
    for seed, night in enumerate(NIGHTS):
        trained = train.fn(
            data,
            tiny_train_config(
                base / f"ck{seed}",
                epochs=1,
                steps_per_epoch=2,
                ngram={"max_order": 3},
                seed=seed,
            ),
            load_catalog(),
        )
        outcome = evaluate.fn(trained)
        reg = register_outcome(outcome, tracking, run_name=night)
        params = WhatifParams(root=data.url, policies=WHATIF_GRID, idle_budget=1 << 16)
        replay = [*outcome.dataset.eval_runs, *outcome.dataset.heldout_runs]
        model = registered_model(reg, outcome.dataset)  # what registration hands on
        config = champion_config(MlflowClient(), model)  # the run's config.json
        ref = ModelRef(model, tuple(replay), config)
        predictor = load_predictor.fn(ref)
        assert predictor.error is None, predictor.error
        replays = [replay_run.fn(data, w, r, params, predictor) for w, r in replay]
        log_to_mlflow.fn(summarize.fn(replays, ref, params, None), replays, tracking)
        runs.append(reg)
    return {"root": base / "store", "runs": runs, "experiment": runs[0].experiment_id}


@pytest.fixture(scope="module")
def server(store):
    with mlflow_server(store["root"]) as server:
        yield server.url


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("HEAPCAST_UI_SHOTS") or tmp_path_factory.mktemp("ui-shots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nMLflow UI screenshots: {folder}")
    return folder


def browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Chromium on `url` with a fresh profile; the page's scripts run for 30 s of virtual time
    (MLflow's UI fetches the runs, then draws the charts) before the dump or screenshot."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run scripts/setup.sh (it installs Debian's)")
    shutil.rmtree(profile, ignore_errors=True)
    return subprocess.run(
        [
            path,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            # draw every frame under virtual time, so the chart cards' in-view observers fire
            "--run-all-compositor-stages-before-draw",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=30000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
    )


def page_text(url: str, tmp_path: Path, keep: Path) -> str:
    """The rendered page's text (scripts and styles dropped), as one line; also in `keep`."""
    # tall enough for the headline section's rows of charts (they draw when in view)
    r = browse(url, tmp_path / "profile", "--dump-dom", "--window-size=2400,2200")
    assert "<html" in r.stdout, f"no page from {url} (rc {r.returncode}): {r.stderr[-2000:]}"
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", r.stdout, flags=re.S)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())
    keep.write_text(text)
    return text


def screenshot(url: str, tmp_path: Path, shot: Path, height: int = 1400) -> None:
    from PIL import Image

    r = browse(url, tmp_path / "profile", f"--screenshot={shot}", f"--window-size=2400,{height}")
    assert shot.is_file(), f"no screenshot of {url} (rc {r.returncode}): {r.stderr[-2000:]}"
    with Image.open(shot) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50, f"{shot}: a blank page"


def headline_keys(store) -> list[str]:
    """The `headline/` metrics both runs carry (what the charts must show)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    keys = [{k for k in client.get_run(r.run_id).data.metrics} for r in store["runs"]]
    both = sorted(k for k in keys[0] & keys[1] if k.startswith("headline/"))
    tables = {k.split("/")[1].split(".")[0] for k in both} - {
        "whatif_causal"
    }  # the default horizon 1: causal
    # 4 a table (the model, the best baseline, the margin, the model hedged with the counter);
    # whatif: best heuristic, guided by the model, its gain, guided by the questions' reuse
    # network (the network is logged with each version)
    assert len(both) == 4 * len(tables) + 4 and len(tables) >= 2, both
    assert "headline/unseen_runs.top1.model_hedged" in both
    assert "headline/whatif_causal.hit_rate.guided_questions" in both
    return both


def chart_titles(text: str) -> list[str]:
    return re.findall(r"headline/[A-Za-z_]+\.[a-z0-9_]+\.[a-z_]+", text)


def test_the_chart_view_opens_on_the_headline_with_both_nights(server, store, shots, tmp_path):
    url = f"{server}/#/experiments/{store['experiment']}/runs?compareRunsMode=CHART"
    # The chart cards draw as they scroll into view, after the runs' metrics arrive; on a
    # loaded machine a dump came once before the first card (1 run in 3): look again, at most
    # three times in all.
    for _ in range(3):
        text = page_text(url, tmp_path, shots / "mlflow-compare-charts.txt")
        if chart_titles(text):
            break
    # the first section is the headline: the 4 top-1 figures of each table (here unseen runs
    # and unseen programs: the held-out workload is a program of its own) and the 4 whatif ones
    # (best heuristic, guided by the model, its gain, guided by the questions' reuse network)
    sections = re.findall(r"\b([a-z_]+) \((\d+)\) Add chart", text)
    assert sections[0] == ("headline", "12"), sections
    assert [s for s, _ in sections[:5]] == ["headline", "log_loss", "plots", "promotion", "train"]
    titles = chart_titles(text)
    for want in headline_keys(store):
        assert want in titles, (want, titles)
    # every chart drawn has a bar (and a legend entry) per night
    for title in dict.fromkeys(titles):
        after = text.split(title, 1)[1].split("headline/", 1)[0]
        assert all(n in after for n in NIGHTS), (title, after[:300])
    screenshot(url, tmp_path, shots / "mlflow-compare-charts.png", height=2200)


def test_the_compare_page_lists_the_headline_for_both_runs(server, store, shots, tmp_path):
    ids = json.dumps([r.run_id for r in store["runs"]], separators=(",", ":"))
    exp = json.dumps([store["experiment"]])
    url = f"{server}/#/compare-runs?runs={ids}&experiments={exp}"
    text = page_text(url, tmp_path, shots / "mlflow-compare-runs.txt")
    assert all(n in text for n in NIGHTS)
    for want in ("headline/unseen_runs.top1.model", "headline/whatif_causal.hit_rate.gain"):
        assert want in text, want
    screenshot(url, tmp_path, shots / "mlflow-compare-runs.png", height=2400)


def test_the_run_page_shows_the_headline_and_the_version(server, store, shots, tmp_path):
    run = store["runs"][1]
    url = f"{server}/#/experiments/{store['experiment']}/runs/{run.run_id}"
    text = page_text(url, tmp_path, shots / "mlflow-run.txt")
    assert "night-2" in text and "headline/unseen_runs.top1.model" in text
    screenshot(url, tmp_path, shots / "mlflow-run.png", height=1800)
    charts = f"{url}/model-metrics"
    screenshot(charts, tmp_path, shots / "mlflow-run-charts.png", height=1800)
    version = f"{server}/#/models/{run.model_name}/versions/{run.model_version}"
    text = page_text(version, tmp_path, shots / "mlflow-version.txt")
    assert "Champion decision" in text, text[:2000]
    screenshot(version, tmp_path, shots / "mlflow-version.png", height=1400)
