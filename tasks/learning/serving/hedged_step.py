"""The streams' steps in two compiled calls: the network's (its online counter, the cell steps and
the answer, for few threads) and the hedge's (its counter and the mixture).

What it computes is what the separate calls compute (OnlineStreams.push_answer, step_calls,
OnlineStreams.push_distribution, top_of, HedgeStreams.step), in the same order, through the same
compiled functions, but for one: where the hedge's counter is the network's, counter_step looks
each thread's contexts up once for the network's row and the hedge's top-5 and distribution
(three lookups apart). What it saves is the Python between them (at one thread, a dozen
dispatches, the small arrays made for them and an argsort) and, over many threads, those two
lookups (docs/learning-nextcall.md#streaming-the-champion has the figures).
tests/tasks/learning/serving/test_streaming.py checks the answers equal the separate calls'.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.online import (
    _CLOG,
    _PLOG,
    _TOP,
    _TOTAL,
    _U8,
    _U255,
    ANSWER_WIDTH,
    NO_FALLBACK,
    NO_TOKEN,
    _answering,
    _fill_distribution,
    _fill_top,
    _find,
    _keys,
    _learn_all,
    _reserve,
    _streams_step_dist,
)
from tasks.learning.nextcall.hedge import _stream_mix
from tasks.learning.predictions import TOP_K, top_row
from tasks.learning.serving.stepping import _N_COLS, _answer, _network_few, _prepare


@njit(cache=True)
def first_bad(tokens):
    """The index of the first token outside 0..63, -1 if none."""
    for b in range(tokens.shape[0]):
        if tokens[b] < 0 or tokens[b] >= N_TOKENS:
            return b
    return -1


@njit(cache=True)
def counter_step(
    ctabs, ptabs, metas, hists, n_seen, idx, tokens, ext, fallback, hedge_fallback, eps, out,
    hedge_top, hedge_dist,
):  # fmt: skip
    """For each b: thread idx[b] learns tokens[b] (uint8), then out[b] = its (top1, order
    index, count, total, top-5) for the next call, _streams_step's row; and where hedge_dist
    has rows, the hedge's answers from the same counter (OnlineStreams.push_distribution's
    without its push): hedge_top[b], the top-5 over hedge_fallback, and hedge_dist[b], the
    distribution at smoothing eps. The thread's contexts are looked up once for all three
    (_stream_answer's and _stream_distribution's lookups, done apart, found the same rows)."""
    m = ext.shape[0]
    keys = np.zeros(m, np.uint64)
    slots = np.zeros(m, np.int64)
    top5 = np.zeros(TOP_K, np.uint8)
    hedged = hedge_dist.shape[0] > 0
    u32max = np.int64(0xFFFFFFFF)
    for b in range(idx.shape[0]):
        t = idx[b]
        ctab, ptab, meta, hist = ctabs[t], ptabs[t], metas[t], hists[t]
        h = hist.shape[0] - 1
        # the push (_streams_push's, without _span_loop's general machinery): tokens[b] is
        # counted after the contexts of the calls before it, then joins them
        y = tokens[b]
        hist[h] = y
        grown_c, grown_p = _reserve(ctab, ptab, meta, m)
        if grown_c.shape[0] != ctab.shape[0]:
            ctabs[t] = grown_c
        if grown_p.shape[0] != ptab.shape[0]:
            ptabs[t] = grown_p
        ctab, ptab = grown_c, grown_p
        avail = min(n_seen[t], h)
        _keys(hist, h, avail, ext, keys)
        _find(ctab, meta[_CLOG], keys, ext, avail, slots)
        _learn_all(ctab, ptab, meta, keys, slots, y)
        for j in range(h):
            hist[j] = hist[j + 1]
        n_seen[t] += 1
        # the answer: the contexts of the calls up to tokens[b]
        avail = min(n_seen[t], h)
        _keys(hist, h, avail, ext, keys)
        _find(ctab, meta[_CLOG], keys, ext, avail, slots)
        a = _answering(slots)
        # _span_loop's answer row (want_top, want_f)
        _fill_top(ctab, slots, a, fallback, top5)
        if a < 0:
            out[b, 0] = NO_TOKEN
            out[b, 1] = 0
            out[b, 2] = 0
            out[b, 3] = 0
        else:
            s = slots[a]
            w = ctab[s, _TOP]
            out[b, 0] = np.int64(w & _U255)
            out[b, 1] = a + 1 if a < m - 1 else 0
            out[b, 2] = min(np.int64(w >> _U8), u32max)
            out[b, 3] = min(np.int64(ctab[s, _TOTAL]), u32max)
        for j in range(TOP_K):
            out[b, 4 + j] = top5[j]
        if hedged:
            _fill_top(ctab, slots, a, hedge_fallback, hedge_top[b])
            _fill_distribution(ctab, ptab, meta[_PLOG], slots, a, eps, hedge_dist[b])


@njit(cache=True)
def hedge_part(
    idx, tokens, net, counter_top, counter, ctabs, ptabs, metas, hists, c_seen, answered, logws,
    hitss, prev_rows, prev_lists, mix_top, fixed,
):  # fmt: skip
    """After the network's answers net (float32 [B, 64]): the hedge's counter learns tokens[b]
    and answers (push_distribution) into counter_top [B, 5] and counter [B, 64], and the
    mixture of the network, the counter and the fixed experts learns and answers
    (HedgeStreams.step, its top-5 kept in mix_top). float64 [B, 64].
    `fixed`: hedge_fixed's tuple; where its `learn` is false the counter is the network's, which
    has learnt the call already (the same orders: the same tables): it answered the hedge as it
    learnt (counter_step: counter_top and counter hold its answers)."""
    learn, ext, fallback, eps, experts, lead_by, share, floor = fixed
    n = idx.shape[0]
    if learn:
        _streams_step_dist(
            ctabs, ptabs, metas, hists, c_seen, idx, tokens.astype(np.uint8), ext, fallback, eps,
            counter_top, counter,
        )  # fmt: skip
    rows = np.empty((2, n, N_TOKENS), np.float32)
    lists = np.empty((2, n, TOP_K), np.uint8)
    for b in range(n):
        for j in range(N_TOKENS):
            rows[0, b, j] = net[b, j]
            rows[1, b, j] = counter[b, j]
        for j in range(TOP_K):
            lists[0, b, j] = counter_top[b, j]
        top_row(net[b], lists[1, b])
    mixed = np.empty((n, N_TOKENS))
    top = np.empty((n, TOP_K), np.uint8)
    _stream_mix(
        idx, tokens, answered, logws, hitss, prev_rows, prev_lists, rows, experts, lists, lead_by,
        share, floor, top, mixed,
    )  # fmt: skip
    for b in range(n):
        for j in range(TOP_K):
            mix_top[idx[b], j] = top[b, j]
    return mixed


@njit(cache=True)
def network_few(
    idx, tokens, on_ctabs, on_ptabs, on_metas, on_hists, on_seen, n_seen, hist, h, c,
    hedge_top, hedge_dist, fixed,
):  # fmt: skip
    """StatefulStream._step's network for few threads (step_calls' _network_few path), the
    network's online counter included: float32 [B, 64]; where hedge_dist has rows, the
    counter's answers to the hedge too (counter_step). `fixed`: what does not change while
    the stream runs, one tuple (network_fixed's), since each argument costs a dispatch time."""
    (
        has_online, on_ext, on_fallback, hedge_fallback, eps, context, ngram_rows, ngram_order, count_buckets,
        share_buckets, lstm, group_col, group_off, kernels, recurrent, bias_in, bias_rec,
        out_kernel, out_bias, src_top_col, src_conf_col, src_conf_off, gate_h, gate_conf,
        gate_bias, copy,
    ) = fixed  # fmt: skip
    n = idx.shape[0]
    online = np.zeros((n, ANSWER_WIDTH), np.int64)
    tokens8 = tokens.astype(np.uint8)
    if has_online:
        counter_step(
            on_ctabs, on_ptabs, on_metas, on_hists, on_seen, idx, tokens8, on_ext, on_fallback,
            hedge_fallback, eps, online, hedge_top, hedge_dist,
        )  # fmt: skip
    feats = np.empty((n, 2, _N_COLS), np.int64)
    reset = np.empty((n, 2), np.bool_)
    answering = np.empty(n, np.int64)
    _prepare(
        idx, tokens8, online, context, n_seen, hist, ngram_rows, ngram_order, count_buckets,
        share_buckets, feats, reset, answering,
    )  # fmt: skip
    top = np.empty((n, h[-1].shape[2]), np.float32)
    logits = np.empty((n, N_TOKENS), np.float32)
    _network_few(
        lstm, idx, feats, reset, answering, h, c, group_col, group_off, kernels, recurrent,
        bias_in, bias_rec, out_kernel, out_bias, top, logits,
    )  # fmt: skip
    answers = np.empty((n, _N_COLS), np.int64)
    for b in range(n):
        for j in range(_N_COLS):
            answers[b, j] = feats[b, answering[b], j]
    out = np.empty((n, N_TOKENS), np.float32)
    _answer(
        logits, top, answers, src_top_col, src_conf_col, src_conf_off, gate_h, gate_conf,
        gate_bias, copy, out,
    )  # fmt: skip
    return out


def network_fixed(
    w, context: int, online, hedge_fallback: np.ndarray = NO_FALLBACK, eps: float = 0.1
) -> tuple:
    """network_few's `fixed` for the weights w (StepWeights), a context and the network's
    online counter (an OnlineStreams, or None); the hedge's fallback ranking and smoothing where
    that counter answers the hedge too."""
    return (
        online is not None,
        online._ext if online is not None else np.zeros(1, np.int64),
        online._fallback if online is not None else np.zeros(0, np.uint8),
        np.ascontiguousarray(hedge_fallback, np.uint8),
        float(eps),
        int(context), w.ngram_rows, w.ngram_order, w.count_buckets, w.share_buckets, w.lstm,
        w.group_col, w.group_off, w.kernels, w.recurrent, w.bias_in, w.bias_rec, w.out_kernel,
        w.out_bias, w.src_top_col, w.src_conf_col, w.src_conf_off, w.gate_h, w.gate_conf,
        w.gate_bias, w.copy,
    )  # fmt: skip
