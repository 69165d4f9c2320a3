"""A program built to fool the next-call network: what the product scores on it (the network,
the hedged mix, the online counter) when the network is confidently wrong from the first call.

The network trains on programs whose threads walk a cycle of tokens upwards (after k comes k+1)
and is scored on an unseen program whose threads walk the same tokens downwards: everything the
network learned is wrong there, with confidence, while the counter learns the new cycle within a
lap. The hedged mix (tasks/learning/nextcall/hedge.py) must notice inside each thread.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("keras")

from tasks.dataset.token_runs import TokenRun
from tasks.learning.evaluate import UNSEEN_PROGRAMS  # noqa: E402
from tasks.learning.nextcall.training import evaluate_model, fit_model  # noqa: E402
from tasks.learning.scores import HEDGED_NEXT, MODEL, ONLINE_COUNTER, OVERALL  # noqa: E402
from tasks.learning.split import Split  # noqa: E402
from tests.tasks.learning.tiny_training import tiny_train_config  # noqa: E402

pytestmark = [pytest.mark.backends, pytest.mark.slow]

CYCLE = 12  # tokens 0..11


def walking(workload: str, run: str, step: int, threads: int = 4, length: int = 600) -> TokenRun:
    """`threads` threads, each walking the cycle by `step` from its own start."""
    parts = [(s + step * np.arange(length)) % CYCLE for s in range(threads)]
    tokens = np.concatenate(parts).astype(np.uint8)
    return TokenRun(workload, run, tokens, np.arange(threads + 1, dtype=np.int64) * length)


def test_a_network_fooled_by_an_unseen_program_costs_the_product_nothing(tmp_path):
    # GIVEN a network trained on upward walks until it is sure of them
    split = Split(
        train=[walking("up", f"r{i}", +1) for i in range(3)],
        validation=[walking("up", "v", +1, threads=2)],
        evaluation=[walking("up", "e", +1)],
        heldout=[],
        unseen_programs=[walking("down", "r0", -1), walking("down", "r1", -1, threads=3)],
    )
    cfg = tiny_train_config(
        tmp_path / "ckpt",
        model={"units": [16]},
        epochs=12,
        steps_per_epoch=20,
        learning_rate=0.02,
        data={"heldout_workloads": []},
    )
    model, _ = fit_model(cfg, split, tmp_path / "ckpt")
    evaluation, _ = evaluate_model(model, cfg, split)

    def on(predictor: str, table: str = UNSEEN_PROGRAMS):
        return evaluation.get(predictor, OVERALL, table)

    majority = on("majority")
    # the trap holds (the test can fail): right on the runs it trained on, the network is
    # confidently wrong on the downward program, far worse than the majority
    assert on(MODEL, "unseen_runs").top1 > 0.95
    assert on(MODEL).log_loss > majority.log_loss + 1.0
    # THEN the hedged mix the product scores is never worse than the majority in log-loss
    hedged = on(HEDGED_NEXT)
    assert hedged.log_loss < majority.log_loss
    # AND it noticed within the threads: about as good as the counter, which learned the walk
    counter = on(ONLINE_COUNTER)
    assert counter.top1 > 0.9
    assert hedged.top1 >= counter.top1 - 0.02
    # AND its top-5 is never below the counter's, the network's input
    assert hedged.top5 >= counter.top5
    # AND on the runs the network knows, the mix keeps what the network knows
    assert on(HEDGED_NEXT, "unseen_runs").log_loss < on(ONLINE_COUNTER, "unseen_runs").log_loss
