"""The next-call network corrected inside the thread: a mixture of the network, the online counter
and the training majority, weighted by how well each has predicted this thread's calls so far.

Each call's answer is known as soon as it is made, so after every call each predictor's weight is
multiplied by the probability it gave the true token (Bayes' rule over experts), with the fixed
share of the questions' hedge (tasks/learning/hedge.py: SHARE, FLOOR, the same update) so that a
weight can recover when the thread changes. A thread starts from equal weights. The majority is
an expert: where the network and the counter are both confidently wrong, the mixture's log-loss
stays within about log(3) plus the share's cost of the majority's, whatever they say.

Causal: the answer at a call reads the predictors' answers at that call and the true tokens of
the same thread's earlier scored calls, nothing later (tests/tasks/learning/test_next_hedge.py
changes the later tokens). The predictor's name in the tables is HEDGED_NEXT.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.hedge import FLOOR, SHARE, _share, _weights
from tasks.learning.predictions import TOP_K, Predictions

HEDGED_NEXT = "model_hedged"


@njit(cache=True)
def _mix(thread, truth, experts, share, floor, out):
    """out[i] = the experts' distributions at i mixed by the weights their answers at the same
    thread's earlier rows earned; rows grouped by thread, in call order within a thread.
    experts float64 [E, n, 64]."""
    n_exp, n, k = experts.shape
    logw = np.zeros(n_exp)
    w = np.empty(n_exp)
    fac = np.empty(n_exp)
    for i in range(n):
        if i == 0 or thread[i] != thread[i - 1]:
            logw[:] = 0.0
        _weights(logw, w)
        for j in range(k):
            s = 0.0
            for e in range(n_exp):
                s += w[e] * experts[e, i, j]
            out[i, j] = s
        y = truth[i]
        for e in range(n_exp):
            fac[e] = np.log(max(experts[e, i, y], floor))
        _share(logw, fac, share, w)


def hedged_next(
    experts: list[np.ndarray], thread: np.ndarray, truth: np.ndarray, share: float = SHARE
) -> Predictions:
    """The mixture's top-5 and p(true token) at n scored calls of one run: `experts`, each
    float [n, 64] (rows summing to 1), `thread` [n] each call's thread (rows grouped by thread,
    in call order), `truth` [n] the tokens. Ties in the top-5: the lower token first."""
    n = len(truth)
    if any(np.shape(e) != (n, N_TOKENS) for e in experts) or len(thread) != n:
        shapes = [np.shape(e) for e in experts]
        raise ValueError(
            f"experts {shapes}, {len(thread)} threads: arrays of [{n}, {N_TOKENS}] and {n} "
            "threads expected (one row a scored call)"
        )
    stacked = np.ascontiguousarray(np.stack([np.asarray(e, np.float64) for e in experts]))
    mixed = np.zeros((n, N_TOKENS), np.float64)
    _mix(
        np.ascontiguousarray(thread, np.int64),
        np.ascontiguousarray(truth, np.int64),
        stacked,
        float(share),
        FLOOR,
        mixed,
    )
    # a stable sort of -p: equal probabilities keep the lower token first
    top = np.argsort(-mixed, axis=1, kind="stable")[:, :TOP_K].astype(np.uint8)
    return Predictions(top, mixed[np.arange(n), truth])


def thread_of(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The thread (index into a TokenRun's threads) of each position."""
    return np.searchsorted(offsets, positions, side="right") - 1
