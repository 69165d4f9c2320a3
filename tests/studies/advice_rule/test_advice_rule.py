"""studies/advice_rule/advice_rule.py: the rule of the rounds run many times on draws from
measured run times: it names a clear winner where the rule it replaced could not, and picks a
false one no more often than alpha."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import REPO
from studies.advice_rule import advice_rule as bench
from tests.studies.study_script import run_writing_nothing

BENCH = REPO / "studies" / "advice_rule" / "advice_rule.py"
pytestmark = pytest.mark.slow  # the study's trials: about 20 s of one core
# numpy temporaries' wall seconds as a loaded machine measured them (layer_seeds.json's
# medians and ranges): glibc with a slow outlier, tcmalloc about 0.7x
RUNS = {
    "glibc": [0.490, 0.470, 0.809, 0.512, 0.478],
    "tcmalloc": [0.352, 0.328, 0.479, 0.340, 0.361],
    "jemalloc": [0.49, 0.47, 0.52, 0.50, 0.48],
}


@pytest.fixture(scope="module")
def result():
    return bench.study(RUNS, trials=300, seed=0, fast="tcmalloc")


def test_no_design_picks_a_false_winner_more_often_than_alpha(result):
    for name, row in result["designs"].items():
        assert row["aa"]["rule"]["winner_rate"] <= bench.ALPHA, name


def test_the_seeds_night_names_a_clear_winner_the_old_rule_never_could(result):
    seeds = result["designs"]["seeds"]
    assert "rounds 6 and 8" in seeds["plan"]
    twins = seeds["twins"]
    # the old rule: 11 candidates, 5 rounds, two-sided: 2/252 never passes 0.05/11
    assert twins["old rule"]["winner_rate"] == 0.0
    assert twins["rule"]["winner_rate"] > 0.5
    # only the twins ever win, and neither is favoured by the rule
    wins = twins["rule"]["wins"]
    assert set(wins) == {"twin-a", "twin-b"}
    assert abs(wins["twin-a"] - wins["twin-b"]) < 0.25 * sum(wins.values())


def test_the_quick_seeds_never_decide_and_say_what_they_would_need(result):
    quick = result["designs"]["quick seeds"]
    assert "it needs 5 rounds (2 more)" in quick["plan"]
    assert quick["twins"]["rule"]["winner_rate"] == 0.0
    assert quick["twins"]["rule"]["rounds_max"] == 3


def test_help_runs_nothing(tmp_path):
    p = run_writing_nothing(BENCH, tmp_path, "--help")
    assert p.returncode == 0 and "--trials" in p.stdout


def test_a_runs_file_without_the_baseline_is_named(tmp_path):
    bad = tmp_path / "runs.json"
    bad.write_text(json.dumps({"tcmalloc": [0.3, 0.4]}))
    p = run_writing_nothing(BENCH, tmp_path, "--runs", str(bad))
    assert p.returncode == 2 and str(bad) in p.stderr and "'glibc'" in p.stderr
