"""The trained network stepped one call at a time: the recurrent state carried per thread.

Two staggered states per thread compute exactly the chunked function the evaluation tables score
(tasks.learning.nextcall.chunks.eval_chunks), at two cell steps per call, from the token, the n-gram
features and the online counter's answer. No TensorFlow here: `step_weights` reads a Keras
model's weights as numpy arrays.

Which function, the inputs, the cells: docs/learning-nextcall.md#the-network-one-call-at-a-time
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit
from threadpoolctl import ThreadpoolController

from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.online import ANSWER_WIDTH

# columns of the per-state feature vector: the token, the n-gram's 4, the online counter's 4
_FEATURE_LAYERS = (
    "onehot",
    "ngram_top1",
    "ngram_order",
    "ngram_count",
    "ngram_share",
    "online_top1",
    "online_order",
    "online_count",
    "online_share",
)
# then the online counter's candidates 2..5 (64 = none), read by copy paths only
_RANK_COL = len(_FEATURE_LAYERS)
_N_COLS = _RANK_COL + 4
# NGramFeatures' context keys (tasks/learning/nextcall/model.py says why these constants)
_P1, _B1, _C1 = 2147483647, 1103515245, 40503
_P2, _B2, _C2 = 1000000007, 911382323, 69069


@dataclass(frozen=True, eq=False)
class StepWeights:
    """A Keras next-call model's weights in the form the compiled step reads."""

    lstm: bool
    units: tuple[int, ...]
    group_col: np.ndarray  # int64 [g]: the feature column each input group reads
    group_off: np.ndarray  # int64 [g]: its first row in kernels[0]
    kernels: tuple[np.ndarray, ...]  # float32 [rows, G*u]: layer 0 folded (rows per value)
    recurrent: tuple[np.ndarray, ...]  # float32 [u, G*u]
    bias_in: tuple[np.ndarray, ...]  # float32 [G*u]
    bias_rec: tuple[np.ndarray, ...]  # float32 [G*u] (zeros for an LSTM)
    out_kernel: np.ndarray  # float32 [u_last, 64]
    out_bias: np.ndarray  # float32 [64]
    # the copy path, one row per source (n-gram, online); zero rows when there is none
    src_top_col: np.ndarray  # int64 [S]
    src_conf_col: np.ndarray  # int64 [S, 3]
    src_conf_off: np.ndarray  # int64 [S, 3]: rows in gate_conf
    gate_h: np.ndarray  # float32 [S, u_last]
    gate_conf: np.ndarray  # float32 [rows]
    gate_bias: np.ndarray  # float32 [S]
    copy: np.ndarray  # float32 [S, 65, 64]
    # the n-gram table inside the model (empty: no n-gram features)
    # int64 [2^b >= 2m, 4]: (context key, top1, count1, total) by open addressing, key -1 empty
    ngram_rows: np.ndarray
    ngram_order: int  # 0: none
    online_orders: tuple[int, ...]  # () : no online features
    count_buckets: int
    share_buckets: int


def _layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _layers(layer)


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x), np.float32)


def _recurrent_layers(model, layers: dict) -> tuple[list, bool]:
    """The model's recurrent layers and whether they are LSTMs; ValueError, naming the model, for
    what the compiled step cannot run (no one-hot input, mixed kinds, other activations)."""
    rec = [
        layer
        for layer in _layers(model)
        if type(layer).__name__ in ("LSTM", "GRU") and hasattr(layer, "cell")
    ]
    if not rec or "onehot" not in layers:
        raise ValueError(
            f"model {model.name}: no recurrent layer over a one-hot token input; only heapcast's "
            "next-call networks (tasks/learning/nextcall/model.py) can be stepped"
        )
    kinds = {type(layer).__name__ for layer in rec}
    if len(kinds) != 1:
        raise ValueError(f"model {model.name}: mixed recurrent kinds {sorted(kinds)}")
    lstm = kinds == {"LSTM"}
    for layer in rec:
        cfg = layer.get_config()
        if cfg.get("activation") != "tanh" or cfg.get("recurrent_activation") != "sigmoid":
            raise ValueError(f"model {model.name}: layer {layer.name} has other activations")
        if not lstm and not cfg.get("reset_after", True):
            raise ValueError(f"model {model.name}: GRU {layer.name} without reset_after")
    return rec, lstm


def _recurrent_weights(rec: list, lstm: bool) -> tuple[list, list, list, list]:
    """Per recurrent layer: kernel, recurrent kernel, input bias, recurrent bias (an LSTM has
    one bias: the recurrent one is zeros)."""
    kernels, recurrent, bias_in, bias_rec = [], [], [], []
    for layer in rec:
        k, r, b = (_f32(v) for v in layer.get_weights())
        b_in, b_rec = (b, np.zeros_like(b)) if lstm else (b[0], b[1])
        kernels.append(k)
        recurrent.append(r)
        bias_in.append(np.ascontiguousarray(b_in))
        bias_rec.append(np.ascontiguousarray(b_rec))
    return kernels, recurrent, bias_in, bias_rec


def _folded_inputs(model, layers: dict, kernel: np.ndarray) -> tuple[np.ndarray, list, np.ndarray]:
    """Layer 0's kernel with each one-hot group's embedding folded into its rows: (the folded
    kernel, each group's feature column, each group's first row)."""
    folded, cols, row = [], [], 0
    for c, name in enumerate(_FEATURE_LAYERS):
        if name not in layers:
            continue
        emb = _f32(layers[name].get_weights()[0])
        folded.append(emb @ kernel[row : row + emb.shape[1]])
        cols.append(c)
        row += emb.shape[1]
    if row != kernel.shape[0]:
        raise ValueError(
            f"model {model.name}: its first recurrent layer takes {kernel.shape[0]} inputs, "
            f"its one-hot features give {row}"
        )
    offs = np.cumsum([0] + [f.shape[0] for f in folded[:-1]]).astype(np.int64)
    return np.ascontiguousarray(np.concatenate(folded).astype(np.float32)), cols, offs


def _copy_sources(layers: dict, u_last: int) -> dict:
    """The copy gates' weights, one row per copy source present: (its layers' prefix, its top
    column, whose confidence gates it); the counter's candidate r has its own column and the
    top-1's confidence. The output layer is next_logits when any source is mixed in."""
    sources = [
        (s, top, conf)
        for s, top, conf in (
            ("ngram", 1, "ngram"),
            ("online", 5, "online"),
            *((f"online_rank{r}", _RANK_COL + r - 2, "online") for r in range(2, 6)),
        )
        if f"{s}_gate" in layers
    ]
    out_k, out_b = (_f32(v) for v in layers["next_logits" if sources else "next"].get_weights())
    top_col, conf_col, conf_off, gate_h, gate_conf, gate_b, copy = [], [], [], [], [], [], []
    row = 0
    for s, top, conf_src in sources:
        base = 1 if conf_src == "ngram" else 5  # the confidence's columns follow its top-1's
        gk, gb = (_f32(v) for v in layers[f"{s}_gate"].get_weights())
        top_col.append(top)
        conf_col.append([base + 1, base + 2, base + 3])
        gate_h.append(gk[:u_last, 0])
        offs_s, at = [], u_last
        for name in ("order", "count", "share"):
            emb = _f32(layers[f"{conf_src}_{name}"].get_weights()[0])
            gate_conf.append(emb @ gk[at : at + emb.shape[1], 0])
            offs_s.append(row)
            row += emb.shape[0]
            at += emb.shape[1]
        conf_off.append(offs_s)
        gate_b.append(gb[0])
        copy.append(_f32(layers[f"{s}_copy"].get_weights()[0]))
    n = len(sources)
    return dict(
        out_kernel=out_k,
        out_bias=out_b,
        src_top_col=np.array(top_col, np.int64),
        src_conf_col=np.array(conf_col, np.int64).reshape(n, 3),
        src_conf_off=np.array(conf_off, np.int64).reshape(n, 3),
        gate_h=np.array(gate_h, np.float32).reshape(n, u_last),
        gate_conf=np.concatenate(gate_conf).astype(np.float32)
        if gate_conf
        else np.zeros(0, np.float32),
        gate_bias=np.array(gate_b, np.float32),
        copy=np.array(copy, np.float32).reshape(n, N_TOKENS + 1, N_TOKENS),
    )


def _ngram_table(model, ngram_layer) -> tuple[np.ndarray, int]:
    """The model's back-off n-gram table as hashed rows, and its order (none: empty, 0)."""
    ngram = next((layer for layer in _layers(model) if isinstance(layer, ngram_layer)), None)
    if ngram is None:
        return _hashed_rows(np.stack([np.zeros(0, np.int64)] * 4, axis=1)), 0
    m = ngram.n_keys
    keys, top1, count1, total = (np.asarray(v) for v in ngram.get_weights())
    arrays = [a[:m].astype(np.int64) for a in (keys, top1, count1, total)]
    return _hashed_rows(np.stack(arrays, axis=1)), int(ngram.max_order)


def step_weights(model) -> StepWeights:
    """The weights of a (registered) Keras next-call model, for the compiled step.

    ValueError, naming the model, for an architecture the step does not know."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import (
        _COUNT_BUCKETS,
        _SHARE_BUCKETS,
        NGramFeatures,
        online_orders,
        refuse_frames,
        takes_online,
    )

    refuse_frames(model, "the stepped stream (step_weights)")

    layers = {layer.name: layer for layer in _layers(model)}
    rec, lstm = _recurrent_layers(model, layers)
    units = tuple(int(layer.get_config()["units"]) for layer in rec)
    kernels, recurrent, bias_in, bias_rec = _recurrent_weights(rec, lstm)
    kernels[0], cols, offs = _folded_inputs(model, layers, kernels[0])
    ngram_rows, ngram_order = _ngram_table(model, NGramFeatures)
    return StepWeights(
        lstm=lstm,
        units=units,
        group_col=np.array(cols, np.int64),
        group_off=offs,
        kernels=tuple(kernels),
        recurrent=tuple(recurrent),
        bias_in=tuple(bias_in),
        bias_rec=tuple(bias_rec),
        **_copy_sources(layers, units[-1]),
        ngram_rows=ngram_rows,
        ngram_order=ngram_order,
        online_orders=online_orders(model) if takes_online(model) else (),
        count_buckets=_COUNT_BUCKETS,
        share_buckets=_SHARE_BUCKETS,
    )


# Up to this many threads a step runs as one compiled call (_network_few); beyond, each layer's
# products run batched (_network_batched). Measured here, quick-config model, CPU us a
# prediction, one call against batched: 1 thread 84 / 195, 8 threads 36 / 49, 16 threads
# 35 / 31, 32 threads 23 / 22: they cross between 8 and 16.
FEW_THREADS = 12

# --- compiled step ------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _sigmoid(x):
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


@njit(cache=True, inline="always")
def _buckets(order, c1, tot, count_buckets, share_buckets):
    """(count bucket, share bucket) as tasks.learning.nextcall.model._bucketed computes them."""
    if order <= 0:
        return 0, 0
    cb = 0
    for j in range(1, count_buckets):
        if tot >= (np.int64(1) << j):
            cb += 1
    sb = 0
    for j in range(1, share_buckets):
        if share_buckets * c1 >= j * tot:
            sb += 1
    return cb, sb


# The n-gram table's rows are found through open addressing, each row's key and answer in one
# 32-byte entry: one cache miss per order looked up (mostly), where a binary search over the
# sorted keys and then the answer's three arrays cost a dozen. Up to 16 orders are looked up
# per call.
_MIX = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15, Fibonacci hashing


@njit(cache=True, inline="always")
def _home(key, mask):
    return ((key * _MIX) >> np.int64(24)) & mask


@njit(cache=True)
def _hashed_rows(rows):
    """int64 [2^b >= 2m, 4]: the m rows (key, top1, count1, total) by linear probing on the key
    (keys are >= 0); key -1: an empty entry."""
    cap = 16
    while cap < 2 * rows.shape[0]:
        cap *= 2
    out = np.full((cap, 4), -1, np.int64)
    mask = np.int64(cap - 1)
    for i in range(rows.shape[0]):
        j = _home(rows[i, 0], mask)
        while out[j, 0] >= 0:
            j = (j + 1) & mask
        out[j] = rows[i]
    return out


@njit(cache=True, inline="always")
def _find(table, key):
    """The entry of `key` in a _hashed_rows table, -1 if absent."""
    mask = np.int64(table.shape[0] - 1)
    j = _home(key, mask)
    while True:
        k = table[j, 0]
        if k == key:
            return j
        if k < 0:
            return -1
        j = (j + 1) & mask


@njit(cache=True)
def _ngram_lookup(hist, avail, table, max_order, f_top, f_c1, f_tot):
    """f_*[k] for k = 1..min(max_order, avail): the table's row of the context of the last k
    calls (hist[-k:]), f_top[k] = 64 where absent. NGramFeatures' keys, in int64.

    The table holds every order's context at each position it was fitted on
    (NGramTable.fit), so a context absent at order k is absent at every higher order (a longer
    context seen would have put its suffix in): the search stops at the first miss. Only a false
    match of the 62-bit double hash of orders > 9 could break this, at odds of about m / 2^62."""
    h_len = hist.shape[0]
    key = np.int64(0)
    h1 = np.int64(0)
    h2 = np.int64(0)
    pw1 = np.int64(1)
    pw2 = np.int64(1)
    missed = False
    for k in range(1, max_order + 1):
        f_top[k] = N_TOKENS
        if k > avail or missed:
            continue
        prev = np.int64(hist[h_len - k])
        h1 = (h1 + (prev + 1) * pw1) % _P1
        h2 = (h2 + (prev + 1) * pw2) % _P2
        pw1 = (pw1 * _B1) % _P1
        pw2 = (pw2 * _B2) % _P2
        if k <= 9:
            key = key | (prev << (6 * (k - 1)))
            full = key | (np.int64(1) << (6 * k))
        else:
            full = (np.int64(1) << 62) | (((h1 + k * _C1) % _P1) * _P2 + (h2 + k * _C2) % _P2)
        j = _find(table, full)
        if j < 0:
            missed = True
        else:
            f_top[k] = table[j, 1]
            f_c1[k] = table[j, 2]
            f_tot[k] = table[j, 3]


@njit(cache=True)
def _prepare(
    idx, tokens, online, context, n_seen, hist,
    ngram_rows, ngram_order, count_buckets, share_buckets, feats, reset, answering,
):  # fmt: skip
    """Thread slot idx[b] observes tokens[b]: its history and call count advance, and
    - feats[b, s]: the 9 input features of its state s (0, 1) for this call;
    - reset[b, s]: state s's chunk starts at this call (the state is zeroed before its step);
    - answering[b]: the state whose chunk holds the next call.

    online[b]: the online counter's (top1, order index, count, total, top-5) after that call. A state
    whose first chunk has not begun yet (state 1 before call c) is stepped all the same: it is
    zeroed when its chunk starts, and it answers no call before then."""
    h_len = hist.shape[1]
    f_top = np.zeros(ngram_order + 1, np.int64)
    f_c1 = np.zeros(ngram_order + 1, np.int64)
    f_tot = np.ones(ngram_order + 1, np.int64)
    for b in range(idx.shape[0]):
        t = idx[b]
        i = n_seen[t]  # this call's index in its thread
        for j in range(h_len - 1):
            hist[t, j] = hist[t, j + 1]
        hist[t, h_len - 1] = tokens[b]
        # online counter's answer after this call (the same for both states)
        on_order = online[b, 1]
        on_cb, on_sb = _buckets(
            on_order, online[b, 2], max(online[b, 3], 1), count_buckets, share_buckets
        )
        if ngram_order > 0:
            _ngram_lookup(
                hist[t], min(i + 1, h_len), ngram_rows, ngram_order, f_top, f_c1, f_tot,
            )  # fmt: skip
        answering[b] = max(0, i // context - 1) % 2
        for s in range(2):
            m = i // context
            if m % 2 != s:
                m -= 1
            reset[b, s] = i == m * context
            in_chunk = i - m * context + 1
            f = feats[b, s]
            f[0] = tokens[b]
            f[1] = N_TOKENS
            f[2] = 0
            f[3] = 0
            f[4] = 0
            for k in range(min(ngram_order, in_chunk), 0, -1):
                if f_top[k] < N_TOKENS:
                    f[1] = f_top[k]
                    f[2] = k
                    f[3], f[4] = _buckets(k, f_c1[k], f_tot[k], count_buckets, share_buckets)
                    break
            f[5] = online[b, 0]
            f[6] = on_order
            f[7] = on_cb
            f[8] = on_sb
            for j in range(4):
                r = online[b, 5 + j]
                f[_RANK_COL + j] = r if r < N_TOKENS else N_TOKENS
        n_seen[t] = i + 1


@njit(cache=True, fastmath=True)
def _gather_rows(feats, group_col, group_off, kernel, bias, x):
    """x[n] = bias + the sum over input groups g of kernel[group_off[g] + feats[n, group_col[g]]]:
    the first layer's input projection, each one-hot embedding folded into the kernel's rows."""
    width = x.shape[1]
    for n in range(x.shape[0]):
        for j in range(width):
            x[n, j] = bias[j]
        for g in range(group_col.shape[0]):
            row = group_off[g] + feats[n, group_col[g]]
            for j in range(width):
                x[n, j] += kernel[row, j]


# A cell's transcendental functions run as numpy's vectorised tanh over the whole batch (about
# 2 ns an element here, against 10 ns or more for a compiled scalar exp or tanh per element):
# sigmoid(v) = (1 + tanh(v / 2)) / 2. The compiled parts only prepare and combine.


@njit(cache=True, fastmath=True)
def _gates_in(lstm, x, r, t):
    """t[n] = each gate's tanh argument before the candidate's: halved sums of input and
    recurrent projections for the sigmoid gates; an LSTM's candidate (its whole argument is
    known) at full scale. A GRU's candidate needs its reset gate first (_candidate_in)."""
    half = np.float32(0.5)
    for n in range(x.shape[0]):
        if lstm:
            u = x.shape[1] // 4
            for j in range(2 * u):
                t[n, j] = half * (x[n, j] + r[n, j])
            for j in range(2 * u, 3 * u):
                t[n, j] = x[n, j] + r[n, j]
            for j in range(3 * u, 4 * u):
                t[n, j] = half * (x[n, j] + r[n, j])
        else:
            u = x.shape[1] // 3
            for j in range(2 * u):
                t[n, j] = half * (x[n, j] + r[n, j])


@njit(cache=True, fastmath=True)
def _candidate_in(x, r, t, cand):
    """A GRU's candidate argument, reset_after: x_h + reset * r_h, reset = (1 + t_r) / 2."""
    half = np.float32(0.5)
    u = cand.shape[1]
    for n in range(x.shape[0]):
        for j in range(u):
            rr = half + half * t[n, u + j]
            cand[n, j] = x[n, 2 * u + j] + rr * r[n, 2 * u + j]


@njit(cache=True, fastmath=True)
def _gru_out(t, cand, h):
    """h = z * h + (1 - z) * tanh(candidate), z = (1 + t_z) / 2 (cand holds the tanh)."""
    half = np.float32(0.5)
    one = np.float32(1.0)
    u = h.shape[1]
    for n in range(h.shape[0]):
        for j in range(u):
            z = half + half * t[n, j]
            h[n, j] = z * h[n, j] + (one - z) * cand[n, j]


@njit(cache=True, fastmath=True)
def _lstm_cell(t, c):
    """c = f * c + i * g (t holds tanh of the gates' arguments: i, f, o halved, g whole)."""
    half = np.float32(0.5)
    u = c.shape[1]
    for n in range(c.shape[0]):
        for j in range(u):
            i_g = half + half * t[n, j]
            f_g = half + half * t[n, u + j]
            c[n, j] = f_g * c[n, j] + i_g * t[n, 2 * u + j]


@njit(cache=True, fastmath=True)
def _lstm_out(t, tanh_c, h):
    """h = o * tanh(c)."""
    half = np.float32(0.5)
    u = h.shape[1]
    for n in range(h.shape[0]):
        for j in range(u):
            h[n, j] = (half + half * t[n, 3 * u + j]) * tanh_c[n, j]


def _cells(lstm: bool, x: np.ndarray, r: np.ndarray, h: np.ndarray, c: np.ndarray) -> None:
    """One LSTM / GRU (reset_after) step of every row: x = input projection + bias_in,
    r = h @ U + bias_rec (both [n, G*u]); h and c [n, u] updated in place."""
    t = np.empty_like(x)
    _gates_in(lstm, x, r, t)
    if lstm:
        np.tanh(t, out=t)
        _lstm_cell(t, c)
        _lstm_out(t, np.tanh(c), h)
    else:
        u = h.shape[1]
        np.tanh(t[:, : 2 * u], out=t[:, : 2 * u])
        cand = np.empty_like(h)
        _candidate_in(x, r, t, cand)
        np.tanh(cand, out=cand)
        _gru_out(t, cand, h)


@njit(cache=True, fastmath=True)
def _cell(lstm, x, r, h, c, u):
    """_cells for one state, scalar (the few-threads path): x, r [G*u]; h, c updated in place."""
    if lstm:
        for j in range(u):
            i_g = _sigmoid(x[j] + r[j])
            f_g = _sigmoid(x[u + j] + r[u + j])
            g_g = np.tanh(x[2 * u + j] + r[2 * u + j])
            o_g = _sigmoid(x[3 * u + j] + r[3 * u + j])
            c[j] = f_g * c[j] + i_g * g_g
            h[j] = o_g * np.tanh(c[j])
    else:
        for j in range(u):
            z = _sigmoid(x[j] + r[j])
            rr = _sigmoid(x[u + j] + r[u + j])
            hh = np.tanh(x[2 * u + j] + rr * r[2 * u + j])
            h[j] = z * h[j] + (np.float32(1.0) - z) * hh


@njit(cache=True, fastmath=True)
def _matvec(v, mat, bias, out):
    """out = v @ mat + bias (mat [n, m] row-major: the inner loop runs over contiguous m)."""
    m = out.shape[0]
    for j in range(m):
        out[j] = bias[j]
    for k in range(v.shape[0]):
        a = v[k]
        if a != 0:
            for j in range(m):
                out[j] += a * mat[k, j]


@njit(cache=True)
def _network_few(
    lstm, idx, feats, reset, answering, h, c, group_col, group_off, kernels, recurrent,
    bias_in, bias_rec, out_kernel, out_bias, top, logits,
):  # fmt: skip
    """What step_calls' batched products compute, state by state in one compiled call: for a
    few threads, one call costs less than a dozen numpy calls. top[b], logits[b]: the answering
    state's top layer and its output logits (before the copy sources)."""
    n_layers = len(h)
    width = 0
    for layer in range(n_layers):
        width = max(width, kernels[layer].shape[1])
    x = np.zeros(width, np.float32)
    r = np.zeros(width, np.float32)
    for b in range(idx.shape[0]):
        t = idx[b]
        for s in range(2):
            f = feats[b, s]
            for layer in range(n_layers):
                hl = h[layer][t, s]
                cl = c[layer][t, s]
                if reset[b, s]:
                    hl[:] = 0.0
                    cl[:] = 0.0
                gw = kernels[layer].shape[1]
                if layer == 0:
                    k0 = kernels[0]
                    for j in range(gw):
                        x[j] = bias_in[0][j]
                    for g in range(group_col.shape[0]):
                        row = group_off[g] + f[group_col[g]]
                        for j in range(gw):
                            x[j] += k0[row, j]
                else:
                    _matvec(h[layer - 1][t, s], kernels[layer], bias_in[layer], x[:gw])
                _matvec(hl, recurrent[layer], bias_rec[layer], r[:gw])
                _cell(lstm, x, r, hl, cl, hl.shape[0])
        a = h[n_layers - 1][t, answering[b]]
        top[b] = a
        _matvec(a, out_kernel, out_bias, logits[b])


@njit(cache=True)
def _answer(
    logits, top, feats, src_top_col, src_conf_col, src_conf_off, gate_h, gate_conf, gate_bias,
    copy, out,
):  # fmt: skip
    """out[b]: the softmax of logits[b] (top[b] @ the output kernel + its bias) plus each copy
    source's gated row, the gate read from top[b] and the source's confidence features[b]."""
    for b in range(logits.shape[0]):
        f = feats[b]
        for q in range(src_top_col.shape[0]):
            gate = gate_bias[q]
            for j in range(top.shape[1]):
                gate += top[b, j] * gate_h[q, j]
            for c3 in range(3):
                gate += gate_conf[src_conf_off[q, c3] + f[src_conf_col[q, c3]]]
            row = f[src_top_col[q]]
            for j in range(N_TOKENS):
                logits[b, j] += gate * copy[q, row, j]
        mx = logits[b, 0]
        for j in range(1, N_TOKENS):
            mx = max(mx, logits[b, j])
        total = np.float32(0.0)
        for j in range(N_TOKENS):
            e = np.exp(logits[b, j] - mx)
            out[b, j] = e
            total += e
        for j in range(N_TOKENS):
            out[b, j] /= total


def step_calls(
    w: StepWeights,
    context: int,
    n_seen: np.ndarray,
    hist: np.ndarray,
    h: list[np.ndarray],
    c: list[np.ndarray],
    idx: np.ndarray,
    tokens: np.ndarray,
    online: np.ndarray,
) -> np.ndarray:
    """Thread slot idx[b] observes tokens[b] (distinct slots); float32 [B, 64]: each one's next
    call. State, per slot, updated in place: n_seen [cap], hist [cap, k] (its last calls),
    h[layer] and c[layer] [cap, 2, units] (the two staggered states; c unused by a GRU).
    online[b]: the online counter's (top1, order index, count, total, top-5 without fallback)
    after that call (OnlineStreams.push_answer's row).

    The per-thread work (history, n-gram lookups, features) runs compiled thread by thread. The
    network runs in one compiled call for up to FEW_THREADS threads; beyond, each layer's
    products run once for the batch's 2B states as one matrix product (BLAS), which is what makes
    a prediction cheaper the more threads are batched. Both give the same answers, up to float
    rounding (tests/tasks/learning/serving/test_stepping.py runs every case through both)."""
    n = len(idx)
    if online.shape != (n, ANSWER_WIDTH):
        raise ValueError(f"online {online.shape}: one (top1, order, count, total, top-5) per call")
    feats = np.empty((n, 2, _N_COLS), np.int64)
    reset = np.empty((n, 2), np.bool_)
    answering = np.empty(n, np.int64)
    _prepare(
        idx, tokens.astype(np.uint8), online, context, n_seen, hist,
        w.ngram_rows, w.ngram_order, w.count_buckets, w.share_buckets, feats, reset, answering,
    )  # fmt: skip
    if n <= FEW_THREADS:
        top = np.empty((n, w.units[-1]), np.float32)
        logits = np.empty((n, N_TOKENS), np.float32)
        _network_few(
            w.lstm, idx, feats, reset, answering, tuple(h), tuple(c), w.group_col, w.group_off,
            w.kernels, w.recurrent, w.bias_in, w.bias_rec, w.out_kernel, w.out_bias, top, logits,
        )  # fmt: skip
        answers = feats[np.arange(n), answering]
    else:
        top, logits, answers = _network_batched(w, idx, feats, reset, answering, h, c)
    out = np.empty((n, N_TOKENS), np.float32)
    _answer(
        logits, top, answers, w.src_top_col, w.src_conf_col, w.src_conf_off, w.gate_h,
        w.gate_conf, w.gate_bias, w.copy, out,
    )  # fmt: skip
    return out


@functools.cache
def _blas() -> ThreadpoolController:
    # made on first use: it scans the loaded libraries once
    return ThreadpoolController()


def _network_batched(w: StepWeights, idx, feats, reset, answering, h, c):
    """step_calls' network for many threads: each layer's products for all 2B states as one
    matrix product. (top, logits, features) of each thread's answering state.

    On one BLAS thread: the products are small (about 12 M multiply-adds for 256 threads) and
    OpenBLAS's other threads spin between calls. Measured at 256 threads: 11.7 us a prediction
    on one BLAS thread, against 13.4 us wall and 26.5 us of CPU on two."""
    with _blas().limit(limits=1, user_api="blas"):
        return _network_batched_products(w, idx, feats, reset, answering, h, c)


def _network_batched_products(w: StepWeights, idx, feats, reset, answering, h, c):
    n = len(idx)
    rows = feats.reshape(2 * n, _N_COLS)
    # slots 0..n-1 in order (every thread of a stream that steps them all, the usual batch): the
    # states are stepped in place, without gathering and scattering them (2 x 3 copies a layer)
    in_place = n <= len(h[0]) and np.array_equal(idx, np.arange(n))
    keep = None if in_place else (~reset).reshape(2 * n, 1).astype(np.float32)
    starts = np.flatnonzero(reset.reshape(2 * n)) if in_place else None
    below = None
    for layer, u in enumerate(w.units):
        if in_place:
            hl = h[layer][:n].reshape(2 * n, u)
            hl[starts] = 0.0
            cl = c[layer][:n].reshape(2 * n, u) if w.lstm else hl
            cl[starts] = 0.0
        else:
            hl = h[layer][idx].reshape(2 * n, u) * keep
            cl = c[layer][idx].reshape(2 * n, u) * keep if w.lstm else hl
        if layer == 0:
            x = np.empty((2 * n, w.kernels[0].shape[1]), np.float32)
            _gather_rows(rows, w.group_col, w.group_off, w.kernels[0], w.bias_in[0], x)
        else:
            x = below @ w.kernels[layer]
            x += w.bias_in[layer]
        r = hl @ w.recurrent[layer]
        r += w.bias_rec[layer]
        _cells(w.lstm, x, r, hl, cl)
        if not in_place:
            h[layer][idx] = hl.reshape(n, 2, u)
            if w.lstm:
                c[layer][idx] = cl.reshape(n, 2, u)
        below = hl
    answer = 2 * np.arange(n) + answering
    top = below[answer]
    logits = top @ w.out_kernel
    logits += w.out_bias
    return top, logits, rows[answer]
