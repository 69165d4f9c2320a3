"""What the learning tests share: the synthetic events the tiny training reads."""

from __future__ import annotations

import pytest

from tasks.core.storage import Root
from tasks.dataset.synthetic_events import write_synthetic_events
from tests.tasks.learning.tiny_training import TINY_WORKLOADS


@pytest.fixture(scope="module")
def events_root(tmp_path_factory) -> Root:
    """A module's own root of TINY_WORKLOADS' runs, 3,000 tokens each."""
    root = Root.from_url(str(tmp_path_factory.mktemp("events")))
    write_synthetic_events(root, TINY_WORKLOADS, tokens_per_run=3000)
    return root
