"""The evaluation's answers kept for whatif: read back only on the calls they were made on."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.synthetic_events import events_table
from tasks.dataset.token_runs import head_rows, token_run
from tasks.learning.answers import (
    AnswersError,
    RunAnswers,
    merged,
    rows_digest,
    tokens_digest,
)


@pytest.fixture
def table() -> pa.Table:
    rng = np.random.default_rng(1)
    return events_table([rng.integers(0, 64, 60), rng.integers(0, 64, 40)], pid=5)


def test_answers_round_trip_and_apply_only_to_the_calls_they_were_made_on(table):
    run = token_run(table, "w", "r")
    top = np.arange(len(run.tokens) * 5, dtype=np.uint8).reshape(-1, 5)
    soon = np.where(np.arange(table.num_rows) % 2 == 0, 0.5, np.nan)
    a = RunAnswers("w", "r", tokens_digest(run), top, rows_digest(table), soon)
    back = RunAnswers.from_bytes(a.to_bytes(), "here")
    np.testing.assert_array_equal(back.top_for(run), top)
    np.testing.assert_array_equal(back.soon_for(table), soon)  # exact: whatif keeps at >= 1/2
    # other calls (a shorter cap of the same run, the rows in another order) get nothing
    shorter = head_rows(table, 70)
    assert back.top_for(token_run(shorter, "w", "r")) is None
    assert back.soon_for(shorter) is None
    assert back.soon_for(table.take(np.arange(table.num_rows)[::-1])) is None


def test_a_corrupt_or_foreign_file_is_refused_naming_it(table):
    with pytest.raises(AnswersError, match="answers/w/r.npz: not an answers file"):
        RunAnswers.from_bytes(b"PK\x03\x04 garbage", "answers/w/r.npz")
    buf = io.BytesIO()
    head = {"format": 99, "workload": "w", "run": "r"}
    np.savez(buf, head=np.frombuffer(json.dumps(head).encode(), np.uint8))
    with pytest.raises(AnswersError, match="format 99, this heapcast reads 1"):
        RunAnswers.from_bytes(buf.getvalue(), "answers/w/r.npz")


def test_the_models_and_the_networks_answers_merge_per_run(table):
    run = token_run(table, "w", "r")
    top = np.zeros((len(run.tokens), 5), np.uint8)
    soon = np.full(table.num_rows, 0.25)
    got = merged(
        [RunAnswers("w", "r", rows_digest=rows_digest(table), soon=soon)],
        [RunAnswers("w", "r", tokens_digest(run), top), RunAnswers("v", "r", "x", top)],
    )
    assert [a.key for a in got] == [("v", "r"), ("w", "r")]
    assert got[1].top_for(run) is top and got[1].soon_for(table) is soon
