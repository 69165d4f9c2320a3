"""How far an answer to the next call could go past the online counter's top-1 on a run, and how
much of that the network took.

Four figures beside the two predictors' own: how often their top-1s agree, how often each is
right where the other is wrong, the better of the two at every call (an oracle: it reads the true
call to choose) and the counter's own back-off n-gram had it read the whole thread first
(`hindsight_top1`: at each call, the counts of the same contexts at every other call of the
thread, before and after it, never the call itself). The last two read what no predictor has at
the moment it answers: they are optimistic bounds, never predictions. They say why a top-1 stops
where it does: the network cannot pass the counter by choosing between their two answers by more
than the oracle does, and the run itself says no more about a context than its hindsight counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from tasks.dataset.token_runs import TokenRun
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.online import DEFAULT_ORDERS

__all__ = ["Headroom", "hindsight_top1"]

_MUL = np.uint64(0x9E3779B97F4A7C15)
_NONE = -1  # hindsight_top1 where no order's context occurs at another call of the thread


def _context_keys(run: TokenRun, order: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys uint64 [n], valid bool [n]): a hash of each position's thread and its `order`
    previous tokens of the same thread; valid where the thread has that many before it."""
    n = run.n_tokens
    tokens = run.tokens.astype(np.uint64)
    thread = np.repeat(np.arange(run.n_threads, dtype=np.uint64), run.thread_lengths())
    keys = thread + np.uint64(1)
    with np.errstate(over="ignore"):  # the hash wraps around 2**64 by design
        for j in range(1, order + 1):
            previous = np.zeros(n, np.uint64)
            previous[j:] = tokens[:-j] + np.uint64(1)
            keys = keys * _MUL + previous
            keys ^= keys >> np.uint64(29)
    return keys, run.position_in_thread() >= order


def hindsight_top1(
    run: TokenRun, positions: np.ndarray, orders: Sequence[int] = DEFAULT_ORDERS
) -> np.ndarray:
    """int64 [len(positions)]: at each position, the most frequent next token of its longest
    context (of `orders`, longest first, as the online counter backs off) among every other
    position of the same thread with that context, before or after it (ties: the lower token);
    -1 where no order's context occurs elsewhere in the thread. An optimistic bound: it reads the
    thread's future."""
    positions = np.asarray(positions, np.int64)
    truth = run.tokens[positions].astype(np.int64)
    answer = np.full(len(positions), _NONE, np.int64)
    for order in sorted(set(orders), reverse=True):
        keys, valid = _context_keys(run, order)
        at = np.flatnonzero(valid)
        if not len(at):
            continue
        ctx, ctx_of = np.unique(keys[at], return_inverse=True)
        # per context, its tokens by count (most first, ties: the lower token): the best two
        pair, count = np.unique(
            ctx_of.astype(np.int64) * N_TOKENS + run.tokens[at], return_counts=True
        )
        pair_ctx, pair_tok = pair // N_TOKENS, pair % N_TOKENS
        order_ = np.lexsort((pair_tok, -count, pair_ctx))
        pair_ctx, pair_tok, count = pair_ctx[order_], pair_tok[order_], count[order_]
        first = np.flatnonzero(np.r_[True, pair_ctx[1:] != pair_ctx[:-1]])
        has_second = np.r_[first[1:], len(pair_ctx)] - first >= 2
        best_tok, best_n = pair_tok[first], count[first]
        second_tok = np.where(has_second, pair_tok[np.minimum(first + 1, len(pair_ctx) - 1)], 0)
        second_n = np.where(has_second, count[np.minimum(first + 1, len(pair_ctx) - 1)], 0)
        total = np.bincount(ctx_of, minlength=len(ctx))

        where = np.full(run.n_tokens, -1, np.int64)
        where[at] = ctx_of
        c = where[positions]
        open_ = (answer == _NONE) & (c >= 0)
        c = np.where(open_, c, 0)
        seen_elsewhere = open_ & (total[c] >= 2)  # the position's own call left out
        # leaving the position's own call out lowers its own token's count by one
        own_best = truth == best_tok[c]
        kept = best_n[c] - 1 > second_n[c]
        kept |= (best_n[c] - 1 == second_n[c]) & (best_tok[c] < second_tok[c])
        pick = np.where(own_best & ~kept, second_tok[c], best_tok[c])
        answer = np.where(seen_elsewhere, pick, answer)
    return answer


@dataclass(frozen=True)
class Headroom:
    """Counts over scored positions: each predictor's top-1 right, the two agreeing, each right
    alone, and the hindsight n-gram right. Added across runs; `rates` divides by positions."""

    positions: int = 0
    counter: int = 0
    network: int = 0
    agree: int = 0
    counter_alone: int = 0
    network_alone: int = 0
    hindsight: int = 0

    @classmethod
    def of(
        cls,
        truth: np.ndarray,
        counter_top1: np.ndarray,
        network_top1: np.ndarray,
        hindsight: np.ndarray,
    ) -> Headroom:
        truth = np.asarray(truth, np.int64)
        counter_top1 = np.asarray(counter_top1, np.int64)
        network_top1 = np.asarray(network_top1, np.int64)
        if not (len(truth) == len(counter_top1) == len(network_top1) == len(hindsight)):
            raise ValueError(
                f"{len(truth)} true calls, {len(counter_top1)} counter answers, "
                f"{len(network_top1)} network answers, {len(hindsight)} hindsight answers: "
                "one of each a scored position expected"
            )
        c, m = counter_top1 == truth, network_top1 == truth
        return cls(
            positions=len(truth),
            counter=int(c.sum()),
            network=int(m.sum()),
            agree=int((counter_top1 == network_top1).sum()),
            counter_alone=int((c & ~m).sum()),
            network_alone=int((m & ~c).sum()),
            hindsight=int((np.asarray(hindsight) == truth).sum()),
        )

    def __add__(self, other: Headroom) -> Headroom:
        return Headroom(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def rates(self) -> dict[str, float | int]:
        """Shares of the positions, 4 decimals; `better_of_two`: the oracle's top-1 (the counter's
        right answers and the network's alone), `hindsight` the n-gram's (both optimistic)."""
        n = max(self.positions, 1)
        share = {
            "counter": self.counter,
            "network": self.network,
            "agree": self.agree,
            "counter_alone": self.counter_alone,
            "network_alone": self.network_alone,
            "better_of_two": self.counter + self.network_alone,
            "hindsight": self.hindsight,
        }
        return {"positions": self.positions, **{k: round(v / n, 4) for k, v in share.items()}}
