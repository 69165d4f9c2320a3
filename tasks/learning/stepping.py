"""The trained network stepped one call at a time: the recurrent state carried per thread.

Which function it computes. An RNN cannot drop the oldest token of a sliding window, so "the
model over the thread's last `context` calls" (streaming.predict_window) costs a re-run of the
window per answer. The tables score another function (tasks.learning.sequences.eval_chunks):
stateless chunks of 2c calls starting at every multiple of c in the thread; the answer about call
j (j >= 1) comes from the chunk that starts at k*c, k = max(0, (j - 1) // c - 1), whose state has
seen j - k*c calls (from c + 1 to 2c past the first 2c). Two staggered states per thread compute it
exactly: state s (0 or 1) is reset to zero at the calls m*c with m % 2 == s, both are stepped on
every call, and the one whose chunk k has k % 2 == s answers. So a streamed answer is, up to float
rounding, the answer scored in the unseen-runs / unseen-programs / held-out tables, at two cell
steps per call (tests/tasks/learning/test_stepping.py holds it equal to predict_positions).

Inputs, computed per thread as calls arrive, as in the chunked batch form:
- the token (one-hot);
- the n-gram features (NGramFeatures, the table inside the model): the longest order k whose
  context (the last k calls) is in the table, k at most the calls the state's chunk has seen
  (the in-graph layer cannot see before its chunk's start); the keys are computed as the layer
  computes them (exact keys up to order 9, the double hash beyond);
- the online counter's answer over the thread's whole history (OnlineState, as in training).

The network's one-hot inputs enter a recurrent layer through its kernel, so each feature's
embedding is folded into the first layer's kernel once (a row gather per feature, no matmul);
LSTM and GRU (reset_after, Keras 3's default) cells, a dense softmax or the copy path's gates.

No TensorFlow here: `step_weights` reads a Keras model's weights as numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from tasks.dataset.tokens import N_TOKENS

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
_N_COLS = len(_FEATURE_LAYERS)
# NGramFeatures' context keys (tasks/learning/model.py says why these constants)
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
    ngram_keys: np.ndarray  # int64 [m]
    ngram_top1: np.ndarray  # int64 [m]
    ngram_count1: np.ndarray  # int64 [m]
    ngram_total: np.ndarray  # int64 [m]
    ngram_order: int  # 0: none
    online_orders: tuple[int, ...]  # () : no online features
    count_buckets: int
    share_buckets: int


def _layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _layers(layer)


def step_weights(model) -> StepWeights:
    """The weights of a (registered) Keras next-call model, for the compiled step.

    ValueError, naming the model, for an architecture the step does not know."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.model import (
        _COUNT_BUCKETS,
        _SHARE_BUCKETS,
        NGramFeatures,
        online_orders,
        takes_online,
    )

    layers = {layer.name: layer for layer in _layers(model)}
    rec = [
        layer
        for layer in _layers(model)
        if type(layer).__name__ in ("LSTM", "GRU") and hasattr(layer, "cell")
    ]
    if not rec or "onehot" not in layers:
        raise ValueError(
            f"model {model.name}: no recurrent layer over a one-hot token input; only heapcast's "
            "next-call networks (tasks/learning/model.py) can be stepped"
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
    units = tuple(int(layer.get_config()["units"]) for layer in rec)

    def w(x):
        return np.ascontiguousarray(np.asarray(x), np.float32)

    kernels, recurrent, bias_in, bias_rec = [], [], [], []
    for layer in rec:
        ws = [w(v) for v in layer.get_weights()]
        k, r, b = ws
        if lstm:
            b_in, b_rec = b, np.zeros_like(b)
        else:
            b_in, b_rec = b[0], b[1]
        kernels.append(k)
        recurrent.append(r)
        bias_in.append(np.ascontiguousarray(b_in))
        bias_rec.append(np.ascontiguousarray(b_rec))
    # layer 0: fold each one-hot group's embedding into the kernel's rows
    present = [(c, name) for c, name in enumerate(_FEATURE_LAYERS) if name in layers]
    folded, cols, offs, row = [], [], [], 0
    for c, name in present:
        emb = w(layers[name].get_weights()[0])
        folded.append(emb @ kernels[0][row : row + emb.shape[1]])
        cols.append(c)
        row += emb.shape[1]
    if row != kernels[0].shape[0]:
        raise ValueError(
            f"model {model.name}: its first recurrent layer takes {kernels[0].shape[0]} inputs, "
            f"its one-hot features give {row}"
        )
    offs = np.cumsum([0] + [f.shape[0] for f in folded[:-1]]).astype(np.int64)
    kernels[0] = np.ascontiguousarray(np.concatenate(folded).astype(np.float32))
    u_last = units[-1]
    sources = [s for s in ("ngram", "online") if f"{s}_gate" in layers]
    if sources:
        out_k, out_b = (w(v) for v in layers["next_logits"].get_weights())
    else:
        out_k, out_b = (w(v) for v in layers["next"].get_weights())
    top_col, conf_col, conf_off, gate_h, gate_conf, gate_b, copy = [], [], [], [], [], [], []
    row = 0
    for s in sources:
        base = 1 if s == "ngram" else 5
        gk, gb = (w(v) for v in layers[f"{s}_gate"].get_weights())
        top_col.append(base)
        conf_col.append([base + 1, base + 2, base + 3])
        gate_h.append(gk[:u_last, 0])
        offs_s, at = [], u_last
        for name in ("order", "count", "share"):
            emb = w(layers[f"{s}_{name}"].get_weights()[0])
            gate_conf.append(emb @ gk[at : at + emb.shape[1], 0])
            offs_s.append(row)
            row += emb.shape[0]
            at += emb.shape[1]
        conf_off.append(offs_s)
        gate_b.append(gb[0])
        copy.append(w(layers[f"{s}_copy"].get_weights()[0]))
    ngram = next((layer for layer in _layers(model) if isinstance(layer, NGramFeatures)), None)
    if ngram is not None:
        m = ngram.n_keys
        keys, top1, count1, total = (np.asarray(v) for v in ngram.get_weights())
        ngram_arrays = [a[:m].astype(np.int64) for a in (keys, top1, count1, total)]
        ngram_order = ngram.max_order
    else:
        ngram_arrays = [np.zeros(0, np.int64)] * 4
        ngram_order = 0
    return StepWeights(
        lstm=lstm,
        units=units,
        group_col=np.array(cols, np.int64),
        group_off=offs,
        kernels=tuple(kernels),
        recurrent=tuple(recurrent),
        bias_in=tuple(bias_in),
        bias_rec=tuple(bias_rec),
        out_kernel=out_k,
        out_bias=out_b,
        src_top_col=np.array(top_col, np.int64),
        src_conf_col=np.array(conf_col, np.int64).reshape(len(sources), 3),
        src_conf_off=np.array(conf_off, np.int64).reshape(len(sources), 3),
        gate_h=np.array(gate_h, np.float32).reshape(len(sources), u_last),
        gate_conf=np.concatenate(gate_conf).astype(np.float32)
        if gate_conf
        else np.zeros(0, np.float32),
        gate_bias=np.array(gate_b, np.float32),
        copy=np.array(copy, np.float32).reshape(len(sources), N_TOKENS + 1, N_TOKENS),
        ngram_keys=np.ascontiguousarray(ngram_arrays[0]),
        ngram_top1=np.ascontiguousarray(ngram_arrays[1]),
        ngram_count1=np.ascontiguousarray(ngram_arrays[2]),
        ngram_total=np.ascontiguousarray(ngram_arrays[3]),
        ngram_order=int(ngram_order),
        online_orders=online_orders(model) if takes_online(model) else (),
        count_buckets=_COUNT_BUCKETS,
        share_buckets=_SHARE_BUCKETS,
    )


# --- compiled step ------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _sigmoid(x):
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


@njit(cache=True, inline="always")
def _buckets(order, c1, tot, count_buckets, share_buckets):
    """(count bucket, share bucket) as tasks.learning.model._bucketed computes them."""
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


@njit(cache=True)
def _ngram_lookup(hist, avail, keys, top1, count1, total, max_order, f_top, f_c1, f_tot):
    """f_*[k] for k = 1..min(max_order, avail): the table's row of the context of the last k
    calls (hist[-k:]), f_top[k] = 64 where absent. NGramFeatures' keys, in int64."""
    h_len = hist.shape[0]
    m = keys.shape[0]
    key = np.int64(0)
    h1 = np.int64(0)
    h2 = np.int64(0)
    pw1 = np.int64(1)
    pw2 = np.int64(1)
    for k in range(1, max_order + 1):
        f_top[k] = N_TOKENS
        if k > avail:
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
        if m == 0:
            continue
        i = np.searchsorted(keys, full)
        if i < m and keys[i] == full:
            f_top[k] = top1[i]
            f_c1[k] = count1[i]
            f_tot[k] = total[i]


@njit(cache=True, fastmath=True)
def _cell(lstm, x, r, h, c, u):
    """One LSTM / GRU (reset_after) step: x = input projection + bias_in, r = h @ U + bias_rec
    (both [G*u]); h and c updated in place."""
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
def _matvec(v, n, mat, bias, out):
    """out = v[:n] @ mat + bias (mat [n, m] row-major: the inner loop runs over contiguous m)."""
    m = out.shape[0]
    for j in range(m):
        out[j] = bias[j]
    for k in range(n):
        a = v[k]
        if a != 0:
            for j in range(m):
                out[j] += a * mat[k, j]


@njit(cache=True)
def _step(
    idx, tokens, online, context, n_seen, hist, hs, cs,
    lstm, units, group_col, group_off, kernels, recurrent, bias_in, bias_rec,
    out_kernel, out_bias, src_top_col, src_conf_col, src_conf_off, gate_h, gate_conf, gate_bias,
    copy, ngram_keys, ngram_top1, ngram_count1, ngram_total, ngram_order,
    count_buckets, share_buckets, out,
):  # fmt: skip
    """Observe tokens[b] on thread idx[b] and write its next-call distribution to out[b].

    online[b]: the online counter's (top1, order index, count, total) after that call."""
    n_layers = units.shape[0]
    u_max = hs.shape[3]
    n_gates = 4 if lstm else 3
    width = n_gates * u_max
    x = np.zeros(width, np.float32)
    r = np.zeros(width, np.float32)
    h_len = hist.shape[1]
    f_top = np.zeros(ngram_order + 1, np.int64)
    f_c1 = np.zeros(ngram_order + 1, np.int64)
    f_tot = np.ones(ngram_order + 1, np.int64)
    feats = np.zeros((2, 9), np.int64)
    logits = np.zeros(N_TOKENS, np.float32)
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
                hist[t], min(i + 1, h_len), ngram_keys, ngram_top1, ngram_count1, ngram_total,
                ngram_order, f_top, f_c1, f_tot,
            )  # fmt: skip
        answering = max(0, i // context - 1) % 2
        for s in range(2):
            if i < s * context:
                continue
            m = i // context
            if m % 2 != s:
                m -= 1
            if i == m * context:  # this state's chunk starts at this call
                hs[t, s, :, :] = 0.0
                cs[t, s, :, :] = 0.0
            in_chunk = i - m * context + 1
            f = feats[s]
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
            for layer in range(n_layers):
                u = units[layer]
                gw = n_gates * u
                if layer == 0:
                    k0 = kernels[0]
                    for j in range(gw):
                        x[j] = bias_in[0][j]
                    for g in range(group_col.shape[0]):
                        row = group_off[g] + f[group_col[g]]
                        for j in range(gw):
                            x[j] += k0[row, j]
                else:
                    _matvec(
                        hs[t, s, layer - 1],
                        units[layer - 1],
                        kernels[layer],
                        bias_in[layer],
                        x[:gw],
                    )
                _matvec(hs[t, s, layer], u, recurrent[layer], bias_rec[layer], r[:gw])
                _cell(lstm, x, r, hs[t, s, layer], cs[t, s, layer], u)
        # the answer: the state whose chunk holds call i + 1
        s = answering
        top = hs[t, s, n_layers - 1]
        _matvec(top, units[n_layers - 1], out_kernel, out_bias, logits)
        f = feats[s]
        for q in range(src_top_col.shape[0]):
            gate = gate_bias[q]
            for j in range(units[n_layers - 1]):
                gate += top[j] * gate_h[q, j]
            for c3 in range(3):
                gate += gate_conf[src_conf_off[q, c3] + f[src_conf_col[q, c3]]]
            row = f[src_top_col[q]]
            for j in range(N_TOKENS):
                logits[j] += gate * copy[q, row, j]
        mx = logits[0]
        for j in range(1, N_TOKENS):
            mx = max(mx, logits[j])
        total = np.float32(0.0)
        for j in range(N_TOKENS):
            e = np.exp(logits[j] - mx)
            out[b, j] = e
            total += e
        for j in range(N_TOKENS):
            out[b, j] /= total
        n_seen[t] = i + 1
