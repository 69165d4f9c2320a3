"""whatif reads a run of the events dataset once, through the dataset's one reader."""

from __future__ import annotations

import pytest

from tasks.core.storage import Root
from tasks.dataset import events_reader
from tasks.dataset.events_reader import EventsNotFound
from tasks.dataset.synthetic_events import write_synthetic_events
from tasks.whatif.events import COLUMNS, read_events
from tasks.whatif.night import WhatifParams, replay_run
from tasks.whatif.policies import GuidedConfig, NoneConfig

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Root:
    root = Root.from_url(str(tmp_path_factory.mktemp("whatif-events")))
    write_synthetic_events(root, {"alpha": 1}, tokens_per_run=600)
    return root


def test_read_events_has_the_simulator_columns_and_the_image(root):
    t = read_events(root, "alpha", "r0")
    assert t.column_names == [*COLUMNS, "image"]
    assert t.num_rows > 0 and set(t.column("image").to_pylist()) == {0}
    with pytest.raises(EventsNotFound, match="alpha/r9"):
        read_events(root, "alpha", "r9")


def test_a_run_is_read_once_for_the_simulator_and_the_predictors(root, monkeypatch):
    # GIVEN a count of the runs the dataset's reader resolves
    opened: list[str] = []
    of_run = events_reader.RunParts.of_run.__func__

    def counted(cls, root, workload, run):
        opened.append(f"{workload}/{run}")
        return of_run(cls, root, workload, run)

    monkeypatch.setattr(events_reader.RunParts, "of_run", classmethod(counted))
    params = WhatifParams(
        root=root.url, policies=[NoneConfig(), GuidedConfig(budget=1 << 16)], idle_budget=1 << 16
    )
    # WHEN a run is replayed through plain and guided policies (tokens for the predictors)
    replay = replay_run.fn(root, "alpha", "r0", params)
    # THEN it was read once, and replayed
    assert replay.ok, replay.error
    assert opened == ["alpha/r0"]
    assert {"none", "guided"} <= set(replay.rows["policy"])
