"""The next-call network corrected inside the thread: a mixture of the network, the online counter
and the training majority, weighted by how well each has predicted this thread's calls so far.

Each call's answer is known as soon as it is made, so after every call each predictor's weight is
multiplied by the probability it gave the true token (Bayes' rule over experts), with the fixed
share of the questions' hedge (tasks/learning/hedge.py: SHARE, FLOOR, the same update) so that a
weight can recover when the thread changes. A thread starts from equal weights. The majority is
an expert: where the network and the counter are both confidently wrong, the mixture's log-loss
stays within about log(3) plus the share's cost of the majority's, whatever they say.

The top-5: the candidate lists it is given, the online counter's first and then the network's.
The counter's is kept whole in the top-5 until, in this thread, the network's has held the true
call at LEAD more calls than it; the mixture's most probable other tokens fill any slot the list
leaves empty, and all five are in the mixture's order. So on a program new to the network the
top-5 is the counter's, and on a program it knows it is the network's. Its top-1 is the mixture's
favourite among those five. The probabilities are the mixture's, unchanged.

Causal: the answer at a call reads the predictors' answers at that call and the true tokens of
the same thread's earlier scored calls, nothing later (tests/tasks/learning/test_next_hedge.py
changes the later tokens). The predictor's name in the tables is HEDGED_NEXT.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.hedge import FLOOR, SHARE, _share, _weights
from tasks.learning.outcome import HEDGED_NEXT
from tasks.learning.predictions import TOP_K, Predictions

__all__ = ["HEDGED_NEXT", "LEAD", "hedged_next", "thread_of"]

# A candidate list replaces the first (the counter's) once it has held the true call at this many
# more of the thread's calls: a lead that a lucky start on a program new to the network cannot
# give (the counter knows nothing of a thread's first calls), and one a network that knows the
# program earns within a few hundred calls.
LEAD = 8


@njit(cache=True)
def _mix(thread, truth, rows, fixed, lists, lead_by, share, floor, top, p_true):
    """top[i], p_true[i]: the mixture at row i of the experts `rows` (float32 [E, n, 64], one
    distribution a row) and `fixed` (float64 [F, 64], the same at every row), weighted by what
    each gave the true tokens at the same thread's earlier rows; rows grouped by thread, in call
    order within a thread. The top-5: the first candidate list (lists [L, n, c], >= 64: none),
    or another once it has held the true token at lead_by more of the thread's earlier rows, the
    mixture's most probable others in the slots it leaves, all in the mixture's order (ties: the
    lower token first)."""
    n_rows, n, k = rows.shape
    n_exp = n_rows + fixed.shape[0]
    n_lists = lists.shape[0]
    logw = np.zeros(n_exp)
    w = np.empty(n_exp)
    fac = np.empty(n_exp)
    hits = np.zeros(max(n_lists, 1), np.int64)
    mixed = np.empty(k)
    rank = np.empty(k, np.int64)  # 1 for a candidate, 0 otherwise; -1 once placed
    for i in range(n):
        if i == 0 or thread[i] != thread[i - 1]:
            logw[:] = 0.0
            hits[:] = 0
        _weights(logw, w)
        for j in range(k):
            s = 0.0
            for e in range(n_rows):
                s += w[e] * rows[e, i, j]
            for f in range(fixed.shape[0]):
                s += w[n_rows + f] * fixed[f, j]
            mixed[j] = s
            rank[j] = 0
        if n_lists > 0:
            lead = 0
            for li in range(1, n_lists):
                if hits[li] >= hits[lead] + lead_by:
                    lead = li
            for c in range(lists.shape[2]):
                if lists[lead, i, c] < k:
                    rank[lists[lead, i, c]] = 1
        for slot in range(top.shape[1]):
            best = -1
            for j in range(k):
                if rank[j] < 0:
                    continue
                if (
                    best < 0
                    or rank[j] > rank[best]
                    or (rank[j] == rank[best] and mixed[j] > mixed[best])
                ):
                    best = j
            top[i, slot] = best
            rank[best] = -1
        # the chosen five in the mixture's order (ties: the lower token first)
        for a in range(1, top.shape[1]):
            t = top[i, a]
            b = a - 1
            while b >= 0 and (
                mixed[top[i, b]] < mixed[t] or (mixed[top[i, b]] == mixed[t] and top[i, b] > t)
            ):
                top[i, b + 1] = top[i, b]
                b -= 1
            top[i, b + 1] = t
        y = truth[i]
        p_true[i] = mixed[y]
        for li in range(n_lists):
            for c in range(lists.shape[2]):
                if lists[li, i, c] == y:
                    hits[li] += 1
                    break
        for e in range(n_rows):
            fac[e] = np.log(max(rows[e, i, y], floor))
        for f in range(fixed.shape[0]):
            fac[n_rows + f] = np.log(max(fixed[f, y], floor))
        _share(logw, fac, share, w)


def hedged_next(
    experts: list[np.ndarray],
    thread: np.ndarray,
    truth: np.ndarray,
    share: float = SHARE,
    candidates: list[np.ndarray] | None = None,
) -> Predictions:
    """The mixture's top-5 and p(true token) at n scored calls of one run: `experts`, each
    float [n, 64] (rows summing to 1) or [64] (the same distribution at every call, as the
    majority's), `thread` [n] each call's thread (rows grouped by thread, in call order),
    `truth` [n] the tokens; `candidates`, lists of tokens uint8 [n, c] each (NONE or any value
    >= 64: none), the predictors' top-5s: at each call the first, or another that has held the
    true token at LEAD more of the thread's calls so far, is kept whole in the top-5. Ties in
    the ranking: the lower token first."""
    n = len(truth)
    rows = [np.asarray(e, np.float32) for e in experts if np.ndim(e) == 2]
    fixed = [np.asarray(e, np.float64) for e in experts if np.ndim(e) == 1]
    bad = [np.shape(e) for e in rows if e.shape != (n, N_TOKENS)]
    bad += [np.shape(e) for e in fixed if e.shape != (N_TOKENS,)]
    if bad or len(thread) != n or len(rows) + len(fixed) != len(experts):
        shapes = [np.shape(e) for e in experts]
        raise ValueError(
            f"experts {shapes}, {len(thread)} threads: arrays of [{n}, {N_TOKENS}] or "
            f"[{N_TOKENS}] and {n} threads expected (one row a scored call)"
        )
    lists = [np.asarray(c, np.uint8) for c in candidates or ()]
    if any(c.ndim != 2 or len(c) != n or c.shape[1] != lists[0].shape[1] for c in lists):
        shapes = [c.shape for c in lists]
        raise ValueError(f"candidates {shapes}: lists of [{n}, c] expected (one row a call)")
    top = np.zeros((n, TOP_K), np.uint8)
    p_true = np.zeros(n, np.float64)
    _mix(
        np.ascontiguousarray(thread, np.int64),
        np.ascontiguousarray(truth, np.int64),
        np.ascontiguousarray(np.stack(rows) if rows else np.zeros((0, n, N_TOKENS), np.float32)),
        np.ascontiguousarray(np.stack(fixed) if fixed else np.zeros((0, N_TOKENS))),
        np.ascontiguousarray(np.stack(lists) if lists else np.zeros((0, n, TOP_K), np.uint8)),
        LEAD,
        float(share),
        FLOOR,
        top,
        p_true,
    )
    return Predictions(top, p_true)


def thread_of(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The thread (index into a TokenRun's threads) of each position."""
    return np.searchsorted(offsets, positions, side="right") - 1
