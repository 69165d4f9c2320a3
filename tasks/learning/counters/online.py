"""The online counter: a back-off n-gram that learns each thread's own history as it goes.

Nothing is trained offline (only a fallback ranking for a thread's first call). Per thread and
position: predict from the longest context order seen before in the thread, then count the true
token under every order. Compiled (numba), all threads of a run in one call; no TensorFlow.
`OnlineCounter.predict`, `online_features`, `OnlineState` (one thread).

The rules (the back-off, the tie rule, the tables): docs/learning.md#the-online-counter
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir
from numba import njit, objmode, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.typed import List

from tasks.dataset.token_runs import TokenRun
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.predictions import NONE, TOP_K, Predictions, ranking, token_counts

DEFAULT_ORDERS: tuple[int, ...] = (12, 8, 6, 4, 3, 2, 1)
NO_TOKEN = N_TOKENS  # online_features' top1 when nothing answered

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U6 = np.uint64(6)
_U8 = np.uint64(8)
_U255 = np.uint64(255)
_BASE = np.uint64(0x9E3779B97F4A7C15)  # polynomial base and Fibonacci-hashing multiplier
_SALT = np.uint64(0xD6E8FEB86659FD93)  # separates the orders
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

# context-table row: key, total, distinct next tokens, then TOP_K entries (count << 8 | token)
_KEY, _TOTAL, _NDIST, _TOP = 0, 1, 2, 3
_ROW = 8
assert _TOP + TOP_K <= _ROW
# meta: log2 of the context table's size, its entries, the same for the pair table
_CLOG, _CCOUNT, _PLOG, _PCOUNT = 0, 1, 2, 3
_MIN_LOG2 = 6
_CTX_LOG2_START_MAX = 12  # a thread's first context table: <= 4096 rows (256 KiB), then x2
_PAIR_LOG2_START_MAX = 12
_STREAM_CTX_LOG2 = 10
_STREAM_PAIR_LOG2 = 8
_AHEAD = 4  # positions ahead whose context rows are prefetched (batch)
_RING = 8  # > _AHEAD, a power of 2


# --- compiled steps -------------------------------------------------------------------------------


@intrinsic
def _borrowed(typingctx, arr):
    """A view of `arr` that holds no reference (its meminfo is null).

    numba counts references to every array a function gets or passes on, with atomic
    increments and decrements that its pruning pass fails to remove from the per-position loop
    (about 60% of the time). A view without a meminfo makes them no-ops. The caller keeps the
    owning array alive for as long as the view is used.
    """

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, value=args[0])
        out = context.make_array(sig.return_type)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, name, getattr(src, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()

    return arr(arr), codegen


@intrinsic
def _prefetch_row(typingctx, tab, row):
    """Ask the CPU to bring row `row` of a 2-D table into cache (llvm.prefetch; no effect on
    results)."""

    def codegen(context, builder, sig, args):
        tabty = sig.args[0]
        ary = context.make_array(tabty)(context, builder, value=args[0])
        zero = context.get_constant(types.intp, 0)
        ptr = cgutils.get_item_pointer(context, builder, tabty, ary, [args[1], zero])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, high locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(tab, types.intp), codegen


@njit(cache=True, inline="always")
def _mix(h):
    """splitmix64's finaliser (a bijection of uint64)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


@njit(cache=True, inline="always")
def _ctx_key(h, k):
    """58-bit nonzero key of the context of order k whose polynomial hash is h."""
    x = _mix(h ^ (np.uint64(k) * _SALT)) >> _U6
    if x == _U0:
        x = _U1
    return x


@njit(cache=True, inline="always")
def _slot(tab, log2, key):
    """Row of `key` in an open-addressing table (linear probing), or the empty row it would take."""
    mask = (np.int64(1) << log2) - 1
    i = np.int64((key * _BASE) >> np.uint64(64 - log2))
    while True:
        k = tab[i, 0]
        if k == key or k == _U0:
            return i
        i = (i + 1) & mask


@njit(cache=True)
def _table(rows, cols):
    """np.zeros((rows, cols), uint64), allocated by numpy: large tables then get transparent
    huge pages (numpy asks for them), which spares the random probes most TLB misses."""
    with objmode(out="uint64[:, ::1]"):
        out = np.zeros((rows, cols), np.uint64)
    return out


@njit(cache=True)
def _grown(tab, log2):
    """The table rehashed into twice the rows."""
    new_log2 = log2 + 1
    new = _table(np.int64(1) << new_log2, tab.shape[1])
    for i in range(np.int64(1) << log2):
        k = tab[i, 0]
        if k != _U0:
            j = _slot(new, new_log2, k)
            for c in range(tab.shape[1]):
                new[j, c] = tab[i, c]
    return new, new_log2


@njit(cache=True)
def _reserve(ctab, ptab, meta, m):
    """Room for one position's insertions (m contexts, 2 pairs per context) at load <= 1/2."""
    while (meta[_CCOUNT] + m) * 2 > (np.int64(1) << meta[_CLOG]):
        ctab, log2 = _grown(ctab, meta[_CLOG])
        meta[_CLOG] = log2
    while (meta[_PCOUNT] + 2 * m) * 2 > (np.int64(1) << meta[_PLOG]):
        ptab, log2 = _grown(ptab, meta[_PLOG])
        meta[_PLOG] = log2
    return ctab, ptab


@njit(cache=True, inline="always")
def _keys(buf, end, avail, ext, keys):
    """keys[e] for every order ext[e] <= avail: the context buf[end - k : end] (k = ext[e]).

    ext: the orders, longest first, then 0. hash = sum_j (buf[end - j] + 1) * B^(j - 1).
    """
    m = ext.shape[0]
    keys[m - 1] = _ctx_key(_U0, 0)
    h = _U0
    mult = _U1
    j = 1
    e = m - 2
    while e >= 0 and ext[e] <= avail:
        k = ext[e]
        while j <= k:
            h = h + (np.uint64(buf[end - j]) + _U1) * mult
            mult = mult * _BASE
            j += 1
        keys[e] = _ctx_key(h, k)
        e -= 1


@njit(cache=True, inline="always")
def _find(ctab, log2, keys, ext, avail, slots):
    """slots[e]: the row of order e's context if seen, -1 if not, -2 if the thread is too short."""
    for e in range(ext.shape[0]):
        if ext[e] > avail:
            slots[e] = -2
        else:
            s = _slot(ctab, log2, keys[e])
            slots[e] = s if ctab[s, _KEY] != _U0 else -1


@njit(cache=True, inline="always")
def _answering(slots):
    """Index (into ext) of the longest seen order, or -1."""
    a = -1
    for e in range(slots.shape[0]):
        if slots[e] >= 0:
            a = e
            break
    return a


@njit(cache=True, inline="always")
def _pair_key(ctx_key, y):
    return (ctx_key << _U6) | np.uint64(y)


@njit(cache=True, inline="always")
def _count_of(ctab, ptab, plog, s, y):
    """count(context of row s, y)."""
    yy = np.uint64(y)
    n_top = min(np.int64(ctab[s, _NDIST]), TOP_K)
    c = np.int64(-1)
    for j in range(n_top):
        w = ctab[s, _TOP + j]
        if (w & _U255) == yy:
            c = np.int64(w >> _U8)
            break
    if c < 0:
        c = np.int64(0)
        if ctab[s, _NDIST] > np.uint64(TOP_K):
            c = np.int64(ptab[_slot(ptab, plog, _pair_key(ctab[s, _KEY], y)), 1])
    return c


@njit(cache=True, inline="always")
def _fill_distribution(ctab, ptab, plog, slots, a, eps, out):
    """out[y] = the answering order's (count of y + eps) / (total + 64 eps) for every token y,
    p_out's rule for each (a < 0, nothing answered: uniform). The batch pass and streaming's
    distribution() both fill through here."""
    if a < 0:
        for y in range(N_TOKENS):
            out[y] = 1.0 / N_TOKENS
        return
    s = slots[a]
    total = np.int64(ctab[s, _TOTAL])
    den = np.float64(total) + eps * N_TOKENS
    # _count_of for every y, cheaper: a context's counts sum to its total, so the top-5's are
    # set first and the pair table is probed, token by token, only while some count is unplaced
    # (most contexts have <= 5 next tokens: no probe); the same sums, so the same floats
    zero = (np.int64(0) + eps) / den
    for y in range(N_TOKENS):
        out[y] = zero
    n_top = min(np.int64(ctab[s, _NDIST]), TOP_K)
    listed = _U0
    left = total
    for j in range(n_top):
        w = ctab[s, _TOP + j]
        c = np.int64(w >> _U8)
        out[np.int64(w & _U255)] = (c + eps) / den
        listed |= _U1 << (w & _U255)
        left -= c
    y = 0
    while left > 0 and y < N_TOKENS:
        if (listed >> np.uint64(y)) & _U1 == _U0:
            c = np.int64(ptab[_slot(ptab, plog, _pair_key(ctab[s, _KEY], y)), 1])
            if c > 0:
                out[y] = (c + eps) / den
                left -= c
        y += 1


@njit(cache=True, inline="always")
def _fill_top(ctab, slots, a, fallback, out):
    """out[:TOP_K]: the answering order's tokens, then shorter orders', then the fallback."""
    # (one exit and no early return: numba then keeps the loop free of reference counting)
    used = _U0
    n = 0
    e = a if a >= 0 else slots.shape[0]
    while e < slots.shape[0] and n < TOP_K:
        s = slots[e]
        if s >= 0:
            n_top = min(np.int64(ctab[s, _NDIST]), TOP_K)
            j = 0
            while j < n_top and n < TOP_K:
                tok = ctab[s, _TOP + j] & _U255
                out[n] = np.uint8(tok)  # kept (n advances) only if new: no branch to mispredict
                n += np.int64(((used >> tok) & _U1) ^ _U1)
                used |= _U1 << tok
                j += 1
        e += 1
    j = 0
    while j < fallback.shape[0] and n < TOP_K:
        tok = np.uint64(fallback[j])
        out[n] = np.uint8(tok)
        n += np.int64(((used >> tok) & _U1) ^ _U1)
        used |= _U1 << tok
        j += 1
    while n < TOP_K:
        out[n] = np.uint8(255)
        n += 1


@njit(cache=True, inline="always")
def _set_pair(ptab, meta, key, count):
    q = _slot(ptab, meta[_PLOG], key)
    if ptab[q, 0] == _U0:
        ptab[q, 0] = key
        meta[_PCOUNT] += 1
    ptab[q, 1] = np.uint64(count)


@njit(cache=True, inline="always")
def _bubble(ctab, s, j):
    """Move entry j up past every entry with a count <= its own (it is the most recent)."""
    while j > 0 and (ctab[s, _TOP + j - 1] >> _U8) <= (ctab[s, _TOP + j] >> _U8):
        w = ctab[s, _TOP + j - 1]
        ctab[s, _TOP + j - 1] = ctab[s, _TOP + j]
        ctab[s, _TOP + j] = w
        j -= 1


@njit(cache=True, inline="always")
def _learn(ctab, ptab, meta, s, y):
    """count(context of row s, y) += 1, keeping the row's top-5 exact (see the tie rule)."""
    yy = np.uint64(y)
    ctab[s, _TOTAL] += _U1
    nd = np.int64(ctab[s, _NDIST])
    n_top = min(nd, TOP_K)
    found = -1
    for j in range(n_top):
        if (ctab[s, _TOP + j] & _U255) == yy:
            found = j
            break
    if found >= 0:
        ctab[s, _TOP + found] += _U1 << _U8
        _bubble(ctab, s, found)
    else:
        key = _pair_key(ctab[s, _KEY], y)
        c = np.int64(0)
        if nd > TOP_K:
            c = np.int64(ptab[_slot(ptab, meta[_PLOG], key), 1])
        if c == 0:
            ctab[s, _NDIST] += _U1
        c += 1
        entry = (np.uint64(c) << _U8) | yy
        if n_top < TOP_K:
            ctab[s, _TOP + n_top] = entry
            _bubble(ctab, s, n_top)
        else:
            last = ctab[s, _TOP + TOP_K - 1]
            if np.uint64(c) >= (last >> _U8):
                # y enters the top-5: the 5th leaves it for the pair table, y's count there is 0
                _set_pair(ptab, meta, _pair_key(ctab[s, _KEY], last & _U255), last >> _U8)
                q = _slot(ptab, meta[_PLOG], key)
                if ptab[q, 0] != _U0:
                    ptab[q, 1] = _U0
                ctab[s, _TOP + TOP_K - 1] = entry
                _bubble(ctab, s, TOP_K - 1)
            else:
                _set_pair(ptab, meta, key, c)


@njit(cache=True, inline="always")
def _learn_all(ctab, ptab, meta, keys, slots, y):
    """Count y after the context of every order the thread is long enough for."""
    for e in range(slots.shape[0]):
        s = slots[e]
        if s == -2:
            continue
        if s < 0:
            s = _slot(ctab, meta[_CLOG], keys[e])
            if ctab[s, _KEY] == _U0:
                ctab[s, _KEY] = keys[e]
                meta[_CCOUNT] += 1
        _learn(ctab, ptab, meta, s, y)


@njit(cache=True)
def _ceil_log2(x):
    n = 0
    while (np.int64(1) << n) < x:
        n += 1
    return n


@njit(cache=True)
def _span(
    tokens,
    a0,
    i,
    n,
    ctab,
    ptab,
    meta,
    ext,
    fallback,
    eps,
    rows,
    row_shift,
    learn,
    top_out,
    p_out,
    d_out,
    f_top1,
    f_order,
    f_count,
    f_total,
):
    """Positions a0 + i .. a0 + n - 1 of one thread (thread positions i .. n - 1), until the
    tables need to grow: returns the first position not done. Row r of the outputs (those not
    empty) gets position p's answer: r = rows[p], or p - row_shift when rows is empty; r < 0:
    none. `learn`: count each position's true token after answering it (False: answer only)."""
    m = ext.shape[0]
    return _span_loop(
        tokens, a0, i, n, ctab, ptab, meta, ext, fallback, eps, rows, row_shift, learn,
        top_out, p_out, d_out, f_top1, f_order, f_count, f_total,
        np.zeros((_RING, m), np.uint64), np.zeros(m, np.int64), np.zeros(TOP_K, np.uint8),
    )  # fmt: skip


@njit(cache=True)
def _span_loop(
    tokens,
    a0,
    i,
    n,
    ctab,
    ptab,
    meta,
    ext,
    fallback,
    eps,
    rows,
    row_shift,
    learn,
    top_out,
    p_out,
    d_out,
    f_top1,
    f_order,
    f_count,
    f_total,
    keys,
    slots,
    top5,
):
    """_span on borrowed views of its arrays (the caller owns them): no reference counting in
    the loop. keys: a ring of the context keys of the next _AHEAD positions, whose rows are
    prefetched meanwhile."""
    b = _borrowed
    tokens, ctab, ptab, meta, ext, fallback, rows = (
        b(tokens), b(ctab), b(ptab), b(meta), b(ext), b(fallback), b(rows)
    )  # fmt: skip
    top_out, p_out, d_out, f_top1, f_order, f_count, f_total = (
        b(top_out), b(p_out), b(d_out), b(f_top1), b(f_order), b(f_count), b(f_total)
    )  # fmt: skip
    keys, slots, top5 = b(keys), b(slots), b(top5)
    m = ext.shape[0]
    ring = _RING - 1
    for d in range(_AHEAD):
        if i + d < n:
            _keys(tokens, a0 + i + d, i + d, ext, keys[(i + d) & ring])
    want_top = top_out.shape[0] > 0
    want_p = p_out.shape[0] > 0
    want_d = d_out.shape[0] > 0
    want_f = f_top1.shape[0] > 0
    all_rows = rows.shape[0] == 0
    u32max = np.int64(0xFFFFFFFF)
    while i < n:
        if learn and (
            (meta[_CCOUNT] + m) * 2 > (np.int64(1) << meta[_CLOG])
            or (meta[_PCOUNT] + 2 * m) * 2 > (np.int64(1) << meta[_PLOG])
        ):
            return i
        p = a0 + i
        ahead = i + _AHEAD
        if ahead < n:
            later = keys[ahead & ring]
            _keys(tokens, a0 + ahead, ahead, ext, later)
            log2 = meta[_CLOG]
            for e in range(m):
                if ext[e] <= ahead:
                    _prefetch_row(ctab, np.int64((later[e] * _BASE) >> np.uint64(64 - log2)))
        now = keys[i & ring]
        _find(ctab, meta[_CLOG], now, ext, i, slots)
        y = tokens[p]
        r = p - row_shift if all_rows else rows[p]
        if r >= 0:
            a = _answering(slots)
            if want_top:
                _fill_top(ctab, slots, a, fallback, top5)
                for j in range(TOP_K):
                    top_out[r, j] = top5[j]
            if want_p:
                if a < 0:
                    p_out[r] = 1.0 / N_TOKENS
                else:
                    s = slots[a]
                    c = _count_of(ctab, ptab, meta[_PLOG], s, y)
                    p_out[r] = (c + eps) / (np.float64(ctab[s, _TOTAL]) + eps * N_TOKENS)
            if want_d:  # every token's p_out: the whole distribution (sums to 1)
                _fill_distribution(ctab, ptab, meta[_PLOG], slots, a, eps, d_out[r])
            if want_f:
                if a < 0:
                    f_top1[r] = NO_TOKEN
                    f_order[r] = 0
                    f_count[r] = 0
                    f_total[r] = 0
                else:
                    s = slots[a]
                    w = ctab[s, _TOP]
                    f_top1[r] = np.uint8(w & _U255)
                    f_order[r] = np.uint8(a + 1) if a < m - 1 else np.uint8(0)
                    f_count[r] = np.uint32(min(np.int64(w >> _U8), u32max))
                    f_total[r] = np.uint32(min(np.int64(ctab[s, _TOTAL]), u32max))
        if learn:
            _learn_all(ctab, ptab, meta, now, slots, y)
        i += 1
    return i


@njit(cache=True)
def _run(
    tokens,
    offsets,
    ext,
    fallback,
    eps,
    rows,
    top_out,
    p_out,
    d_out,
    f_top1,
    f_order,
    f_count,
    f_total,
):
    """All threads of a run in one call (see _span for the outputs, row_shift 0)."""
    m = ext.shape[0]
    meta = np.zeros(4, np.int64)
    ctab = np.zeros((np.int64(1) << _MIN_LOG2, _ROW), np.uint64)
    ptab = np.zeros((np.int64(1) << _MIN_LOG2, 2), np.uint64)
    for t in range(offsets.shape[0] - 1):
        a0 = offsets[t]
        n = offsets[t + 1] - a0
        if n <= 0:
            continue
        # per-thread reset; the first size follows the thread's length (capped: tables double)
        clog = min(max(_ceil_log2(2 * n * m), _MIN_LOG2), _CTX_LOG2_START_MAX)
        plog = min(max(_ceil_log2(n), _MIN_LOG2), _PAIR_LOG2_START_MAX)
        if ctab.shape[0] < (np.int64(1) << clog):
            ctab = _table(np.int64(1) << clog, _ROW)
        else:
            ctab[: np.int64(1) << clog, :] = _U0
        if ptab.shape[0] < (np.int64(1) << plog):
            ptab = _table(np.int64(1) << plog, 2)
        else:
            ptab[: np.int64(1) << plog, :] = _U0
        meta[_CLOG] = clog
        meta[_CCOUNT] = 0
        meta[_PLOG] = plog
        meta[_PCOUNT] = 0
        i = np.int64(0)
        while i < n:
            ctab, ptab = _reserve(ctab, ptab, meta, m)
            i = _span(
                tokens, a0, i, n, ctab, ptab, meta, ext, fallback, eps, rows, _I0, _YES,
                top_out, p_out, d_out, f_top1, f_order, f_count, f_total,
            )  # fmt: skip


# one signature of _span for every caller (a literal argument would compile another)
_I0 = np.int64(0)
_YES = np.bool_(True)
_NO = np.bool_(False)


# streaming: one thread; hist[:h] its last h = max(orders) calls (oldest first, the first
# h - n_seen unused while young), hist[h] the call being learnt; one _span of one position


@njit(cache=True)
def _stream_scratch(m):
    """The buffers one streamed push or answer works in (m = len(ext)), allocated once per
    stream or per batch of threads, not per call: (key ring, slots, top5, answer row, its four
    features, and the empty outputs a push passes)."""
    return (
        np.zeros((_RING, m), np.uint64),
        np.zeros(m, np.int64),
        np.zeros(TOP_K, np.uint8),
        np.zeros((1, TOP_K), np.uint8),
        np.zeros(1, np.uint8),
        np.zeros(1, np.uint8),
        np.zeros(1, np.uint32),
        np.zeros(1, np.uint32),
        np.zeros(0, np.int64),
        np.zeros((0, TOP_K), np.uint8),
        np.zeros(0, np.float64),
        np.zeros(0, np.uint8),
        np.zeros(0, np.uint32),
        np.zeros((0, N_TOKENS), np.float64),
    )


@njit(cache=True)
def _stream_push(ctab, ptab, meta, hist, n_seen, ext, fallback, y, scratch):
    h = hist.shape[0] - 1
    hist[h] = y
    ctab, ptab = _reserve(ctab, ptab, meta, ext.shape[0])
    ring, slots, top5, _, _, _, _, _, e64, etop, ef64, e8, e32, ed = scratch
    _span_loop(
        hist, h - n_seen, n_seen, n_seen + 1, ctab, ptab, meta, ext, fallback, 0.1,
        e64, _I0, _YES, etop, ef64, ed, e8, e8, e32, e32, ring, slots, top5,
    )  # fmt: skip
    for j in range(h):
        hist[j] = hist[j + 1]
    return ctab, ptab


@njit(cache=True)
def _stream_answer(ctab, ptab, meta, hist, n_seen, ext, fallback, top5_out, scratch):
    """(top1, order index, count of top1, total) for the next call, and top5_out filled."""
    h = hist.shape[0] - 1
    ring, slots, top5, top, f_top1, f_order, f_count, f_total, e64, _, ef64, _, _, ed = scratch
    _span_loop(
        hist, h - n_seen, n_seen, n_seen + 1, ctab, ptab, meta, ext, fallback, 0.1,
        e64, np.int64(h), _NO, top, ef64, ed, f_top1, f_order, f_count, f_total, ring, slots,
        top5,
    )  # fmt: skip
    for j in range(TOP_K):
        top5_out[j] = top[0, j]
    return f_top1[0], f_order[0], f_count[0], f_total[0]


@njit(cache=True)
def _stream_distribution(ctab, ptab, meta, hist, n_seen, ext, eps, out):
    m = ext.shape[0]
    h = hist.shape[0] - 1
    keys = np.zeros(m, np.uint64)
    slots = np.zeros(m, np.int64)
    avail = min(n_seen, h)
    _keys(hist, h, avail, ext, keys)
    _find(ctab, meta[_CLOG], keys, ext, avail, slots)
    _fill_distribution(ctab, ptab, meta[_PLOG], slots, _answering(slots), eps, out)


# --- Python API -------------------------------------------------------------------------------


def check_orders(orders: Sequence[int]) -> tuple[int, ...]:
    """The orders as a tuple of ints; distinct, >= 1, longest first (else ValueError)."""
    o = tuple(int(k) for k in orders)
    if any(k < 1 for k in o) or list(o) != sorted(set(o), reverse=True):
        raise ValueError(f"online orders {list(o)}: distinct orders >= 1, longest first")
    return o


def _ext(orders: tuple[int, ...]) -> np.ndarray:
    return np.array(orders + (0,), np.int64)


def _check_tokens(tokens: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.ascontiguousarray(tokens, np.uint8)
    offsets = np.ascontiguousarray(offsets, np.int64)
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
        raise ValueError("offsets must start at 0 and end at len(tokens)")
    if np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must not decrease")
    if len(tokens) and int(tokens.max()) >= N_TOKENS:
        raise ValueError(f"token {int(tokens.max())} outside 0..{N_TOKENS - 1}")
    return tokens, offsets


def _fallback_of(fallback: np.ndarray | None) -> np.ndarray:
    if fallback is None:
        return np.arange(N_TOKENS, dtype=np.uint8)
    f = np.ascontiguousarray(fallback, np.uint8)
    if f.ndim != 1 or (len(f) and int(f.max()) >= N_TOKENS):
        raise ValueError("fallback: a ranking of tokens 0..63")
    return f


# A counter without a fallback ranking: its top-5 ends where its contexts' candidates end, the
# rest NONE. The network's rank features read it so (a fallback is the baseline's guess).
NO_FALLBACK = np.zeros(0, np.uint8)
# OnlineStreams.push_answer's row: (top1, order index, count, total), then the top-5
ANSWER_WIDTH = 4 + TOP_K

_EMPTY_U8 = np.zeros(0, np.uint8)
_EMPTY_U32 = np.zeros(0, np.uint32)
_EMPTY_DIST = np.zeros((0, N_TOKENS), np.float64)


def online_features(
    tokens: np.ndarray,
    offsets: np.ndarray,
    orders: Sequence[int] = DEFAULT_ORDERS,
    ranked: bool = False,
) -> dict[str, np.ndarray]:
    """The online counter's answer at EVERY position p, from the calls before p of p's thread.

    Returns {"top1": uint8 [n] (NO_TOKEN = 64 where nothing answered: a thread's first call),
    "order": uint8 [n] (1 + index in `orders` of the answering order, 1 = longest; 0 where only
    the unigram or nothing answered), "count": uint32 [n] (the top-1's count in the answering
    context, the unigram's included), "total": uint32 [n] (that context's total)}; with
    `ranked`, also "top5": uint8 [n, 5], the counter's candidates best first (the answering
    order's, then shorter orders'; NONE = 255 past the last: no fallback ranking pads them).
    """
    tokens, offsets = _check_tokens(tokens, offsets)
    orders = check_orders(orders)
    n = len(tokens)
    out = {
        "top1": np.zeros(n, np.uint8),
        "order": np.zeros(n, np.uint8),
        "count": np.zeros(n, np.uint32),
        "total": np.zeros(n, np.uint32),
    }
    if ranked:
        out["top5"] = np.zeros((n, TOP_K), np.uint8)
    _run(
        tokens,
        offsets,
        _ext(orders),
        NO_FALLBACK,
        0.1,
        np.zeros(0, np.int64),
        out.get("top5", np.zeros((0, TOP_K), np.uint8)),
        np.zeros(0, np.float64),
        _EMPTY_DIST,
        out["top1"],
        out["order"],
        out["count"],
        out["total"],
    )
    return out


@dataclass(frozen=True, eq=False)
class OnlineCounter:
    """The online counter as a baseline (see the module doc for the rule)."""

    orders: tuple[int, ...] = DEFAULT_ORDERS
    smoothing: float = 0.1
    fallback: np.ndarray = field(default_factory=lambda: np.arange(N_TOKENS, dtype=np.uint8))

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", check_orders(self.orders))
        object.__setattr__(self, "fallback", _fallback_of(self.fallback))
        if not self.smoothing > 0:
            raise ValueError(f"smoothing {self.smoothing}: must be > 0")

    @classmethod
    def fit(
        cls,
        train: list[TokenRun],
        orders: Sequence[int] = DEFAULT_ORDERS,
        smoothing: float = 0.1,
    ) -> OnlineCounter:
        """Nothing is learnt offline: only the fallback ranking (the training majority)."""
        return cls(tuple(orders), smoothing, ranking(token_counts(train)))

    def predict(self, run: TokenRun, positions: np.ndarray) -> Predictions:
        """Top-5 and p(true token) at `positions` (indices into run.tokens, any order),
        the counter having run over the whole run."""
        return self._answers(run, positions, False)[0]

    def predict_distribution(
        self, run: TokenRun, positions: np.ndarray
    ) -> tuple[Predictions, np.ndarray]:
        """`predict`'s answers and, beside them, float64 [len(positions), 64]: the probability
        the counter gives each token at each position (each row sums to 1; the true token's is
        p_true). What a mixture of predictors needs (tasks/learning/nextcall/hedge.py)."""
        return self._answers(run, positions, True)

    def _answers(
        self, run: TokenRun, positions: np.ndarray, dist: bool
    ) -> tuple[Predictions, np.ndarray]:
        tokens, offsets = _check_tokens(run.tokens, run.offsets)
        positions = np.asarray(positions, np.int64)
        n = len(tokens)
        if len(positions) and (positions.min() < 0 or positions.max() >= n):
            raise IndexError(f"{run.name}: positions outside 0..{n - 1}")
        if len(positions) == 0:
            empty = Predictions(np.zeros((0, TOP_K), np.uint8), np.zeros(0, np.float64))
            return empty, np.zeros((0, N_TOKENS), np.float64)
        increasing = bool(np.all(positions[1:] > positions[:-1]))
        uniq, inv = (positions, None) if increasing else np.unique(positions, return_inverse=True)
        rows = np.full(n, -1, np.int64)
        rows[uniq] = np.arange(len(uniq))
        top = np.full((len(uniq), TOP_K), NONE, np.uint8)
        p = np.zeros(len(uniq), np.float64)
        d = np.zeros((len(uniq), N_TOKENS), np.float64) if dist else _EMPTY_DIST
        _run(
            tokens,
            offsets,
            _ext(self.orders),
            self.fallback,
            float(self.smoothing),
            rows,
            top,
            p,
            d,
            _EMPTY_U8,
            _EMPTY_U8,
            _EMPTY_U32,
            _EMPTY_U32,
        )
        if inv is not None:
            top, p = top[inv], p[inv]
            d = d[inv] if dist else d
        return Predictions(top, p), d

    def state(self) -> OnlineState:
        """A fresh streaming state with this counter's settings."""
        return OnlineState(self.orders, self.smoothing, self.fallback)


class OnlineState:
    """The online counter over ONE thread, fed call by call.

    After pushing a thread's tokens[:p], answer() / top() / distribution() / p(y) are exactly
    what the batch form gives at position p (online_features, OnlineCounter.predict).
    """

    def __init__(
        self,
        orders: Sequence[int] = DEFAULT_ORDERS,
        smoothing: float = 0.1,
        fallback: np.ndarray | None = None,
    ) -> None:
        self.orders = check_orders(orders)
        if not smoothing > 0:
            raise ValueError(f"smoothing {smoothing}: must be > 0")
        self.smoothing = float(smoothing)
        self.fallback = _fallback_of(fallback)
        self._ext = _ext(self.orders)
        self._ctab = np.zeros((1 << _STREAM_CTX_LOG2, _ROW), np.uint64)
        self._ptab = np.zeros((1 << _STREAM_PAIR_LOG2, 2), np.uint64)
        self._meta = np.array([_STREAM_CTX_LOG2, 0, _STREAM_PAIR_LOG2, 0], np.int64)
        self._hist = np.zeros(max(self.orders, default=0) + 1, np.uint8)
        self._scratch = _stream_scratch(len(self._ext))
        self.n_seen = 0

    def push(self, token: int) -> None:
        """Learn the thread's next call."""
        token = int(token)
        if not 0 <= token < N_TOKENS:
            raise ValueError(f"token {token} outside 0..{N_TOKENS - 1}")
        self._ctab, self._ptab = _stream_push(
            self._ctab,
            self._ptab,
            self._meta,
            self._hist,
            self.n_seen,
            self._ext,
            self.fallback,
            np.uint8(token),
            self._scratch,
        )
        self.n_seen += 1

    def answer(self) -> tuple[int, int, int, int]:
        """(top1, order index, count of top1, total) for the next call: online_features' row."""
        return self.answer_and_top()[0]

    def top(self) -> np.ndarray:
        """uint8 [TOP_K]: the next call's best tokens, best first."""
        return self.answer_and_top()[1]

    def answer_and_top(self) -> tuple[tuple[int, int, int, int], np.ndarray]:
        """(answer(), top()) from one lookup of the thread's contexts."""
        top5 = np.zeros(TOP_K, np.uint8)
        top1, order, count, total = _stream_answer(
            self._ctab,
            self._ptab,
            self._meta,
            self._hist,
            self.n_seen,
            self._ext,
            self.fallback,
            top5,
            self._scratch,
        )
        return (int(top1), int(order), int(count), int(total)), top5

    def distribution(self) -> np.ndarray:
        """float64 [64]: the probability of each token as the next call (sums to 1)."""
        out = np.zeros(N_TOKENS, np.float64)
        _stream_distribution(
            self._ctab,
            self._ptab,
            self._meta,
            self._hist,
            self.n_seen,
            self._ext,
            self.smoothing,
            out,
        )
        return out

    def p(self, token: int) -> float:
        """The probability of `token` as the next call (p_true in OnlineCounter.predict)."""
        return float(self.distribution()[int(token)])


# --- many threads streamed at once --------------------------------------------------------------


@njit(cache=True)
def _streams_push(ctabs, ptabs, metas, hists, n_seen, t, ext, fallback, y, scratch):
    """Thread slot t learns y (OnlineState.push), its grown tables kept; its (ctab, ptab)."""
    ctab, ptab = _stream_push(
        ctabs[t], ptabs[t], metas[t], hists[t], n_seen[t], ext, fallback, y, scratch
    )
    if ctab.shape[0] != ctabs[t].shape[0]:
        ctabs[t] = ctab
    if ptab.shape[0] != ptabs[t].shape[0]:
        ptabs[t] = ptab
    n_seen[t] += 1
    return ctab, ptab


@njit(cache=True)
def _streams_step(ctabs, ptabs, metas, hists, n_seen, idx, tokens, ext, fallback, out):
    """For each b: thread idx[b] learns tokens[b], then out[b] = its (top1, order index, count,
    total, top-5) for the next call; OnlineState.push then .answer and .top, for every thread in
    one call."""
    top5 = np.zeros(TOP_K, np.uint8)
    scratch = _stream_scratch(ext.shape[0])
    for b in range(idx.shape[0]):
        t = idx[b]
        meta = metas[t]
        hist = hists[t]
        ctab, ptab = _streams_push(
            ctabs, ptabs, metas, hists, n_seen, t, ext, fallback, tokens[b], scratch
        )
        top1, order, count, total = _stream_answer(
            ctab, ptab, meta, hist, n_seen[t], ext, fallback, top5, scratch
        )
        out[b, 0] = top1
        out[b, 1] = order
        out[b, 2] = count
        out[b, 3] = total
        for j in range(TOP_K):
            out[b, 4 + j] = top5[j]


@njit(cache=True)
def _streams_step_dist(
    ctabs, ptabs, metas, hists, n_seen, idx, tokens, ext, fallback, eps, top, dist
):
    """For each b: thread idx[b] learns tokens[b], then top[b] and dist[b] are its top-5 and
    whole distribution for the next call; OnlineState.push then .top and .distribution."""
    scratch = _stream_scratch(ext.shape[0])
    for b in range(idx.shape[0]):
        t = idx[b]
        meta = metas[t]
        hist = hists[t]
        ctab, ptab = _streams_push(
            ctabs, ptabs, metas, hists, n_seen, t, ext, fallback, tokens[b], scratch
        )
        _stream_answer(ctab, ptab, meta, hist, n_seen[t], ext, fallback, top[b], scratch)
        _stream_distribution(ctab, ptab, meta, hist, n_seen[t], ext, eps, dist[b])


class OnlineStreams:
    """The online counter over many threads, each fed call by call, all in one compiled call
    per batch of calls: thread i's answers are OnlineState's (tests/tasks/learning/counters/test_online.py).
    Threads are slots 0.. (the caller maps its thread names to them)."""

    def __init__(
        self,
        orders: Sequence[int] = DEFAULT_ORDERS,
        capacity: int = 16,
        smoothing: float = 0.1,
        fallback: np.ndarray | None = None,
    ) -> None:
        self.orders = check_orders(orders)
        if not smoothing > 0:
            raise ValueError(f"smoothing {smoothing}: must be > 0")
        self.smoothing = float(smoothing)
        self._ext = _ext(self.orders)
        self._fallback = _fallback_of(fallback)
        self._ctabs = List()
        self._ptabs = List()
        self._metas = List()
        self._hists = List()
        self._n_seen = np.zeros(0, np.int64)
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        n = len(self._ctabs)
        for _ in range(n, capacity):
            self._ctabs.append(np.zeros((1 << _STREAM_CTX_LOG2, _ROW), np.uint64))
            self._ptabs.append(np.zeros((1 << _STREAM_PAIR_LOG2, 2), np.uint64))
            self._metas.append(np.array([_STREAM_CTX_LOG2, 0, _STREAM_PAIR_LOG2, 0], np.int64))
            self._hists.append(np.zeros(max(self.orders) + 1, np.uint8))
        self._n_seen = np.concatenate([self._n_seen, np.zeros(capacity - n, np.int64)])

    def reset(self, slot: int) -> None:
        """Slot `slot` starts a new thread (grown to hold it if needed)."""
        if slot >= len(self._ctabs):
            self._grow(max(slot + 1, 2 * len(self._ctabs)))
        self._ctabs[slot] = np.zeros((1 << _STREAM_CTX_LOG2, _ROW), np.uint64)
        self._ptabs[slot] = np.zeros((1 << _STREAM_PAIR_LOG2, 2), np.uint64)
        self._metas[slot][:] = (_STREAM_CTX_LOG2, 0, _STREAM_PAIR_LOG2, 0)
        self._hists[slot][:] = 0
        self._n_seen[slot] = 0

    def push_answer(self, slots: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Thread slots[b] learns tokens[b] (in 0..63, checked by the caller); returns int64
        [B, 9]: each one's (top1, order index, count, total, then its top-5) for its next call,
        OnlineState's answer() and top()."""
        out = np.zeros((len(slots), ANSWER_WIDTH), np.int64)
        _streams_step(
            self._ctabs, self._ptabs, self._metas, self._hists, self._n_seen,
            np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(tokens, np.uint8),
            self._ext, self._fallback, out,
        )  # fmt: skip
        return out

    def push_distribution(
        self, slots: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Thread slots[b] learns tokens[b] (in 0..63, checked by the caller); returns (uint8
        [B, 5], float64 [B, 64]): each one's top-5 and distribution for its next call, what
        OnlineCounter.predict_distribution gives at that position."""
        top = np.zeros((len(slots), TOP_K), np.uint8)
        dist = np.zeros((len(slots), N_TOKENS), np.float64)
        _streams_step_dist(
            self._ctabs, self._ptabs, self._metas, self._hists, self._n_seen,
            np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(tokens, np.uint8),
            self._ext, self._fallback, self.smoothing, top, dist,
        )  # fmt: skip
        return top, dist
