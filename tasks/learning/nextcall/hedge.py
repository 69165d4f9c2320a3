"""The next-call network corrected inside the thread: a mixture of the network, the online counter
and the training majority, weighted by how well each has predicted this thread's calls so far.

Each call's answer is known as soon as it is made, so after every call each predictor's weight is
multiplied by the probability it gave the true token (Bayes' rule over experts), with a fixed
share (NEXT_SHARE; tasks/learning/questions/hedge.py's FLOOR and update) so that a weight can recover when
the thread changes. A thread starts from equal weights. The majority is
an expert: where the network and the counter are both confidently wrong, the mixture's log-loss
stays within about log(3) plus the share's cost of the majority's, whatever they say.

The top-5: the candidate lists it is given, the online counter's first and then the network's.
The counter's is kept whole in the top-5 until, in this thread, the network's has held the true
call at LEAD more calls than it; the mixture's most probable other tokens fill any slot the list
leaves empty, and all five are in the mixture's order. So on a program new to the network the
top-5 is the counter's, and on a program it knows it is the network's. Its top-1 is the mixture's
favourite among those five. The probabilities are the mixture's, unchanged.

Causal: the answer at a call reads the predictors' answers at that call and the true tokens of
the same thread's earlier scored calls, nothing later (tests/tasks/learning/nextcall/test_hedge.py
changes the later tokens). The predictor's name in the tables is HEDGED_NEXT.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.online import DEFAULT_ORDERS
from tasks.learning.predictions import TOP_K, Predictions
from tasks.learning.questions.hedge import FLOOR, _share, _weights
from tasks.learning.scores import HEDGED_NEXT

__all__ = [
    "HEDGED_NEXT",
    "HEDGE_ARTIFACT",
    "LEAD",
    "HedgeStreams",
    "hedge_settings",
    "hedged_next",
    "thread_of",
]

# A candidate list replaces the first (the counter's) once it has held the true call at this many
# more of the thread's calls: a lead that a lucky start on a program new to the network cannot
# give (the counter knows nothing of a thread's first calls), and one a network that knows the
# program earns within a few hundred calls.
LEAD = 8

# The fixed share moved back evenly after each call: smaller than the questions' hedge's, since
# a thread's behaviour rarely changes in a way that needs a weight back within tens of calls and
# every share costs log-loss where the network already leads (the study that chose it and its
# figures: studies/next_share/, docs/learning-nextcall.md#the-next-call-hedge).
NEXT_SHARE = 0.01

# What the hedge needs beyond the network's weights, logged beside each registered model: the
# training data's token counts (the majority expert and the counter's fallback ranking), the
# counters' smoothing and the online counter's orders (tasks.learning.serving.streaming.HedgedStream).
HEDGE_ARTIFACT = "next_hedge.json"


def hedge_settings(token_counts: np.ndarray, smoothing: float) -> dict:
    """HEDGE_ARTIFACT's content for a model trained on data with these token counts [64]."""
    return {
        "token_counts": [int(c) for c in np.asarray(token_counts)],
        "smoothing": float(smoothing),
        "counter_orders": list(DEFAULT_ORDERS),
    }


@njit(cache=True, inline="always")
def _ahead(rank, mixed, j, q):
    """Token j ranks before token q: a candidate (rank 1) before others, then the mixture."""
    return rank[j] > rank[q] or (rank[j] == rank[q] and mixed[j] > mixed[q])


@njit(cache=True)
def _answer(logw, w, hits, rows, fixed, lists, lead_by, mixed, rank, top):
    """mixed = the mixture of one call's experts (rows float32 [E, 64], fixed float64 [F, 64])
    under the log-weights logw; top [5] its top-5: the first candidate list (lists [L, c], >= 64:
    none), or another whose hits lead the first's by lead_by, the mixture's most probable others
    in the slots it leaves, all in the mixture's order (ties: the lower token first)."""
    n_rows = rows.shape[0]
    k = mixed.shape[0]
    _weights(logw, w)
    for j in range(k):
        s = 0.0
        for e in range(n_rows):
            s += w[e] * rows[e, j]
        for f in range(fixed.shape[0]):
            s += w[n_rows + f] * fixed[f, j]
        mixed[j] = s
        rank[j] = 0  # 1 for a candidate, 0 otherwise
    n_lists = lists.shape[0]
    if n_lists > 0:
        lead = 0
        for li in range(1, n_lists):
            if hits[li] >= hits[lead] + lead_by:
                lead = li
        for c in range(lists.shape[1]):
            if lists[lead, c] < k:
                rank[lists[lead, c]] = 1
    # the five best by (candidate first, then the mixture), ties the lower token first: one
    # pass, each token inserted below every kept one at least as good, the list cut at five
    n_top = top.shape[0]
    n = 0
    for j in range(k):
        if n == n_top and not _ahead(rank, mixed, j, top[n_top - 1]):
            continue
        q = min(n, n_top - 1)
        while q > 0 and _ahead(rank, mixed, j, top[q - 1]):
            top[q] = top[q - 1]
            q -= 1
        top[q] = j
        n = min(n + 1, n_top)
    # the chosen five in the mixture's order (ties: the lower token first)
    for a in range(1, top.shape[0]):
        t = top[a]
        b = a - 1
        while b >= 0 and (mixed[top[b]] < mixed[t] or (mixed[top[b]] == mixed[t] and top[b] > t)):
            top[b + 1] = top[b]
            b -= 1
        top[b + 1] = t


@njit(cache=True)
def _learn(logw, w, fac, hits, rows, fixed, lists, y, share, floor):
    """The call's true token y is known: each candidate list that held it gains a hit, each
    expert's log-weight gains log p(y), then the fixed share."""
    n_rows = rows.shape[0]
    for li in range(lists.shape[0]):
        for c in range(lists.shape[1]):
            if lists[li, c] == y:
                hits[li] += 1
                break
    for e in range(n_rows):
        fac[e] = np.log(max(rows[e, y], floor))
    for f in range(fixed.shape[0]):
        fac[n_rows + f] = np.log(max(fixed[f, y], floor))
    _share(logw, fac, share, w)


@njit(cache=True)
def _mix(thread, truth, rows, fixed, lists, lead_by, share, floor, top, p_true):
    """top[i], p_true[i]: the mixture at row i of the experts `rows` (float32 [E, n, 64], one
    distribution a row) and `fixed` (float64 [F, 64], the same at every row), weighted by what
    each gave the true tokens at the same thread's earlier rows; rows grouped by thread, in call
    order within a thread; lists [L, n, c] the candidate lists (_answer)."""
    n_rows, n, k = rows.shape
    n_exp = n_rows + fixed.shape[0]
    logw = np.zeros(n_exp)
    w = np.empty(n_exp)
    fac = np.empty(n_exp)
    hits = np.zeros(lists.shape[0], np.int64)
    mixed = np.empty(k)
    rank = np.empty(k, np.int64)
    for i in range(n):
        if i == 0 or thread[i] != thread[i - 1]:
            logw[:] = 0.0
            hits[:] = 0
        row = rows[:, i, :]
        listed = lists[:, i, :]
        _answer(logw, w, hits, row, fixed, listed, lead_by, mixed, rank, top[i])
        p_true[i] = mixed[truth[i]]
        _learn(logw, w, fac, hits, row, fixed, listed, truth[i], share, floor)


@njit(cache=True)
def _stream_mix(
    slots, tokens, answered, logws, hitss, prev_rows, prev_lists, rows, fixed, lists, lead_by,
    share, floor, top, mixed_out,
):  # fmt: skip
    """For each b: thread slot slots[b] (distinct) learns tokens[b] against its previous answer
    (prev_rows [S, E, 64], prev_lists [S, L, c]; none while answered[s] is 0), then answers its
    next call from rows [E, B, 64] and lists [L, B, c] (kept as its previous answer):
    mixed_out[b] and top[b]. _mix's rows, one thread's call at a time."""
    n_exp = logws.shape[1]
    w = np.empty(n_exp)
    fac = np.empty(n_exp)
    k = rows.shape[2]
    mixed = np.empty(k)
    rank = np.empty(k, np.int64)
    for b in range(slots.shape[0]):
        s = slots[b]
        if answered[s]:
            _learn(
                logws[s], w, fac, hitss[s], prev_rows[s], fixed, prev_lists[s], tokens[b],
                share, floor,
            )  # fmt: skip
        row = rows[:, b, :]
        listed = lists[:, b, :]
        _answer(logws[s], w, hitss[s], row, fixed, listed, lead_by, mixed, rank, top[b])
        for j in range(k):
            mixed_out[b, j] = mixed[j]
        prev_rows[s] = row
        prev_lists[s] = listed
        answered[s] = 1


def hedged_next(
    experts: list[np.ndarray],
    thread: np.ndarray,
    truth: np.ndarray,
    share: float = NEXT_SHARE,
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


class HedgeStreams:
    """hedged_next over many threads fed call by call: slot s's answers are hedged_next's at its
    thread's calls, given the same experts' answers and candidate lists (the caller maps thread
    names to slots, as OnlineStreams). `fixed`: the experts that answer the same at every call
    (the majority's distribution); `n_rows` experts and `n_lists` candidate lists come per call."""

    def __init__(
        self,
        n_rows: int,
        fixed: list[np.ndarray],
        n_lists: int,
        share: float = NEXT_SHARE,
        capacity: int = 16,
    ) -> None:
        self.fixed = np.ascontiguousarray(np.stack(fixed) if fixed else np.zeros((0, N_TOKENS)))
        if self.fixed.shape[1:] != (N_TOKENS,):
            raise ValueError(f"fixed experts {self.fixed.shape}: [F, {N_TOKENS}] expected")
        self.n_rows, self.n_lists, self.share = int(n_rows), int(n_lists), float(share)
        self._answered = np.zeros(0, np.int64)
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        n = len(self._answered)
        n_exp = self.n_rows + len(self.fixed)
        extra = capacity - n
        self._answered = np.concatenate([self._answered, np.zeros(extra, np.int64)])
        grown = [
            (np.zeros((extra, n_exp)), "_logw"),
            (np.zeros((extra, self.n_lists), np.int64), "_hits"),
            (np.zeros((extra, self.n_rows, N_TOKENS), np.float32), "_prev_rows"),
            (np.zeros((extra, self.n_lists, TOP_K), np.uint8), "_prev_lists"),
            (np.zeros((extra, TOP_K), np.uint8), "_top"),
        ]
        for new, name in grown:
            old = getattr(self, name, None)
            setattr(self, name, new if old is None else np.concatenate([old, new]))

    def reset(self, slot: int) -> None:
        """Slot `slot` starts a new thread: equal weights, no hits (grown to hold it if needed)."""
        if slot >= len(self._answered):
            self._grow(max(slot + 1, 2 * len(self._answered)))
        self._answered[slot] = 0
        self._logw[slot] = 0.0
        self._hits[slot] = 0

    def step(
        self, slots: np.ndarray, tokens: np.ndarray, rows: np.ndarray, lists: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Thread slots[b] (distinct) made the call tokens[b]; rows (float32 [n_rows, B, 64])
        and lists (uint8 [n_lists, B, 5]) are the experts' answers and candidate lists for its
        next call. Returns (float64 [B, 64], uint8 [B, 5]): the mixture's distribution and top-5
        for that call."""
        b = len(slots)
        if rows.shape != (self.n_rows, b, N_TOKENS) or rows.dtype != np.float32:
            raise ValueError(f"rows {rows.dtype}{rows.shape}: float32 [{self.n_rows}, {b}, 64]")
        if lists.shape != (self.n_lists, b, TOP_K) or lists.dtype != np.uint8:
            raise ValueError(f"lists {lists.dtype}{lists.shape}: uint8 [{self.n_lists}, {b}, 5]")
        mixed = np.empty((b, N_TOKENS))
        top = np.empty((b, TOP_K), np.uint8)
        _stream_mix(
            np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(tokens, np.int64),
            self._answered, self._logw, self._hits, self._prev_rows, self._prev_lists,
            np.ascontiguousarray(rows), self.fixed, np.ascontiguousarray(lists), LEAD, self.share,
            FLOOR, top, mixed,
        )  # fmt: skip
        self._top[slots] = top
        return mixed, top

    def top(self, slot: int) -> np.ndarray:
        """uint8 [5]: the top-5 of slot `slot`'s last answer (its last step)."""
        return self._top[slot].copy()
