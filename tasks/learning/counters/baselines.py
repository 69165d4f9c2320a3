"""The baselines a model must beat, scored on exactly the positions the model is scored on.

Every predictor answers with the same `Predictions`: its 5 best tokens per position (best
first) and the probability it gave the true token (smoothed so a log-loss stays finite). The
positions are given by the caller (tasks.dataset.token_runs.eval_positions), never chosen here.

- majority: the training data's most frequent tokens.
- repeat_last: the thread's previous token (then the most recent other tokens).
- ngram: back-off count tables of (previous k tokens -> next), k = 1..K chosen on the validation
  runs; contexts hashed, every order a sort and a searchsorted (docs/learning.md#the-baselines).
- ngram_online: the online counter (tasks/learning/counters/online.py): counts of the thread's own past.

No TensorFlow in this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.online import OnlineCounter
from tasks.learning.predictions import (  # noqa: F401  (the answer format, re-exported)
    NONE,
    TOP_K,
    Predictions,
    fill_top,
    ranking,
    token_counts,
)

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier (golden ratio)


def _concat(runs: list[TokenRun]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, position in thread) of several runs, boundaries kept via the positions."""
    if not runs:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    return (
        np.concatenate([r.tokens for r in runs]),
        np.concatenate([r.position_in_thread() for r in runs]),
    )


# --- majority -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Majority:
    probs: np.ndarray  # float64 [64], smoothed training distribution
    ranking: np.ndarray  # uint8 [64], most frequent first

    @classmethod
    def fit(cls, train: list[TokenRun], smoothing: float = 0.1) -> Majority:
        return cls.from_counts(token_counts(train), smoothing)

    @classmethod
    def from_counts(cls, counts: np.ndarray, smoothing: float = 0.1) -> Majority:
        """The majority of training data whose tokens occurred `counts` [64] times."""
        counts = np.asarray(counts, np.float64)
        probs = (counts + smoothing) / (counts.sum() + smoothing * N_TOKENS)
        return cls(probs, ranking(counts))

    def predict(self, run: TokenRun, positions: np.ndarray) -> Predictions:
        n = len(positions)
        top = np.broadcast_to(self.ranking[:TOP_K], (n, TOP_K)).copy()
        return Predictions(top, self.probs[run.tokens[positions]])


# --- repeat the last token ------------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatLast:
    p_repeat: float  # how often the next token equals the last one in training (smoothed)
    ranking: np.ndarray  # global ranking, to fill top-k
    lookback: int = 16

    @classmethod
    def fit(cls, train: list[TokenRun], smoothing: float = 0.1) -> RepeatLast:
        tokens, pos = _concat(train)
        ok = pos >= 1
        same = float((tokens[1:][ok[1:]] == tokens[:-1][ok[1:]]).sum()) if len(tokens) else 0.0
        n = float(ok.sum())
        p = (same + smoothing) / (n + 2 * smoothing)
        return cls(p, Majority.fit(train).ranking)

    def predict(self, run: TokenRun, positions: np.ndarray) -> Predictions:
        pos_in = run.position_in_thread()[positions]
        lags = np.arange(1, self.lookback + 1)
        idx = positions[:, None] - lags[None, :]
        cand = run.tokens[np.maximum(idx, 0)]
        cand = np.where(lags[None, :] <= pos_in[:, None], cand, NONE).astype(np.uint8)
        top = fill_top(cand, self.ranking[:TOP_K])
        last = cand[:, 0]
        y = run.tokens[positions]
        p_true = np.where(y == last, self.p_repeat, (1.0 - self.p_repeat) / (N_TOKENS - 1))
        return Predictions(top, p_true)


# --- n-gram with back-off -------------------------------------------------------------------------


def iter_context_hashes(
    run_tokens: np.ndarray, pos_in_thread: np.ndarray, positions: np.ndarray | None, max_order: int
):
    """Yield (k, hash, valid) for k = 1..max_order at `positions` (None: every token).

    hash_k[p] = sum_{j=1..k} (tokens[p-j] + 1) * B^(j-1)  (mod 2^64), one gather per order;
    valid[p] says p has k previous tokens in its thread (elsewhere the hash is meaningless).
    One order at a time, so memory stays at a few arrays of the positions' size.
    """
    t1 = run_tokens.astype(np.uint64) + np.uint64(1)
    if positions is None:
        positions = np.arange(len(run_tokens), dtype=np.int64)
    pos_in = pos_in_thread[positions]
    h = np.zeros(len(positions), np.uint64)
    mult = np.uint64(1)
    with np.errstate(over="ignore"):
        for k in range(1, max_order + 1):
            h = h + t1[np.maximum(positions - k, 0)] * mult
            mult = mult * _HASH_BASE
            yield k, _mix(h), pos_in >= k


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection that spreads every input bit over the high bits.

    The tables key on the top 58 bits (the low 6 hold the next token), so a short context's
    small polynomial value must not live in the low bits alone.
    """
    with np.errstate(over="ignore"):
        x = h ^ (h >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class _OrderTable:
    contexts: np.ndarray  # uint64 [m], sorted distinct context hashes (58 bits)
    totals: np.ndarray  # int64 [m]
    top: np.ndarray  # uint8 [m, TOP_K]
    pairs: np.ndarray  # uint64 [q], sorted (context << 6 | next)
    pair_counts: np.ndarray  # int64 [q]


def _build_table(h: np.ndarray, nxt: np.ndarray) -> _OrderTable:
    pair = ((h >> np.uint64(6)) << np.uint64(6)) | nxt.astype(np.uint64)
    pairs, counts = np.unique(pair, return_counts=True)
    ctx = pairs >> np.uint64(6)
    tok = (pairs & np.uint64(63)).astype(np.uint8)
    contexts, first, n_per = np.unique(ctx, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, first) if len(first) else np.zeros(0, np.int64)
    group = np.repeat(np.arange(len(contexts)), n_per)
    order = np.lexsort((-counts, group))  # by context, then most frequent next first
    rank = np.arange(len(order)) - first[group[order]]
    keep = rank < TOP_K
    top = np.full((len(contexts), TOP_K), NONE, np.uint8)
    top[group[order][keep], rank[keep]] = tok[order][keep]
    return _OrderTable(contexts, totals.astype(np.int64), top, pairs, counts.astype(np.int64))


def _lookup(table: _OrderTable, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found mask, index into table.contexts) for context hashes h."""
    key = h >> np.uint64(6)
    if not len(table.contexts):
        return np.zeros(len(h), bool), np.zeros(len(h), np.int64)
    i = np.minimum(np.searchsorted(table.contexts, key), len(table.contexts) - 1)
    return table.contexts[i] == key, i


def _pair_count(table: _OrderTable, h: np.ndarray, y: np.ndarray) -> np.ndarray:
    key = ((h >> np.uint64(6)) << np.uint64(6)) | y.astype(np.uint64)
    if not len(table.pairs):
        return np.zeros(len(h), np.int64)
    i = np.minimum(np.searchsorted(table.pairs, key), len(table.pairs) - 1)
    return np.where(table.pairs[i] == key, table.pair_counts[i], 0)


@dataclass
class NGram:
    """Back-off n-gram over hashed contexts; `order` is the highest order used."""

    tables: list[_OrderTable]  # index k-1 -> order k
    majority: Majority
    smoothing: float
    order: int
    validation_top1: dict[int, float] = field(default_factory=dict)

    @classmethod
    def fit(cls, train: list[TokenRun], max_order: int = 16, smoothing: float = 0.1) -> NGram:
        tokens, pos = _concat(train)
        tables = [
            _build_table(h[ok], tokens[ok])
            for _, h, ok in iter_context_hashes(tokens, pos, None, max_order)
        ]
        return cls(tables, Majority.fit(train, smoothing), smoothing, max_order)

    def _found(self, run: TokenRun, positions: np.ndarray, max_order: int):
        """Yield (k, found, index into order k's table, hash) for k = 1..max_order."""
        pos_in = run.position_in_thread()
        for k, h, valid in iter_context_hashes(run.tokens, pos_in, positions, max_order):
            found, i = _lookup(self.tables[k - 1], h)
            yield k, found & valid, i, h

    def predict(
        self, run: TokenRun, positions: np.ndarray, order: int | None = None
    ) -> Predictions:
        """Back-off: each position is answered by the highest order <= `order` that knows it."""
        order = self.order if order is None else order
        y = run.tokens[positions]
        n = len(positions)
        resolved = np.zeros(n, bool)
        cand = np.full((n, TOP_K), NONE, np.uint8)
        count_y = np.zeros(n, np.float64)
        total = np.zeros(n, np.float64)
        for k, found, i, h in self._found(run, positions, order):
            t = self.tables[k - 1]
            # a higher order overwrites a lower one: iterate up, keep the last found
            cand[found] = t.top[i[found]]
            total[found] = t.totals[i[found]]
            count_y[found] = _pair_count(t, h[found], y[found])
            resolved |= found
        top = fill_top(cand, self.majority.ranking[:TOP_K])
        eps = self.smoothing
        p_ctx = (count_y + eps) / (total + eps * N_TOKENS)
        p_true = np.where(resolved, p_ctx, self.majority.probs[y])
        return Predictions(top, p_true)

    def choose_order(self, validation: list[TokenRun], positions: list[np.ndarray]) -> int:
        """The order in 1..max_order with the best top-1 on the validation runs (ties: lowest).

        One pass: the answer with back-off at max order K is the answer at order k <= K that
        was found last going up, so the top-1 of every K falls out of one sweep over k.
        """
        max_order = len(self.tables)
        correct = np.zeros(max_order + 1)
        n = 0
        for run, pos in zip(validation, positions):
            y = run.tokens[pos]
            n += len(pos)
            answer = np.full(len(pos), self.majority.ranking[0], np.uint8)
            for k, found, i, _ in self._found(run, pos, max_order):
                answer = np.where(found, self.tables[k - 1].top[i, 0], answer)
                correct[k] += (answer == y).sum()
        scores = {K: float(correct[K] / max(n, 1)) for K in range(1, max_order + 1)}
        self.validation_top1 = scores
        self.order = max(scores, key=lambda K: (scores[K], -K))
        return self.order


@dataclass
class Baselines:
    majority: Majority
    repeat_last: RepeatLast
    ngram: NGram
    online: OnlineCounter

    @classmethod
    def fit(
        cls,
        train: list[TokenRun],
        validation: list[TokenRun],
        max_order: int = 16,
        smoothing: float = 0.1,
    ) -> Baselines:
        """Fit all four on `train`; the n-gram's order is chosen on `validation` (the online
        counter takes only its fallback ranking from `train`: it learns as it predicts)."""

        ngram = NGram.fit(train, max_order, smoothing)
        if validation:
            ngram.choose_order(validation, [eval_positions(r) for r in validation])
        return cls(
            Majority.fit(train, smoothing),
            RepeatLast.fit(train, smoothing),
            ngram,
            OnlineCounter.fit(train, smoothing=smoothing),
        )

    def predict(self, run: TokenRun, positions: np.ndarray) -> dict[str, Predictions]:
        return self._predict(run, positions, self.online.predict(run, positions))

    def predict_with_counter(
        self, run: TokenRun, positions: np.ndarray
    ) -> tuple[dict[str, Predictions], np.ndarray]:
        """`predict`'s answers and the online counter's whole distribution at each position
        (float64 [n, 64]; OnlineCounter.predict_distribution), from one pass of the counter."""
        online, dist = self.online.predict_distribution(run, positions)
        return self._predict(run, positions, online), dist

    def _predict(self, run: TokenRun, positions: np.ndarray, online: Predictions):
        return {
            "majority": self.majority.predict(run, positions),
            "repeat_last": self.repeat_last.predict(run, positions),
            "ngram": self.ngram.predict(run, positions),
            "ngram_online": online,
        }
