"""The next-call models (Keras 3), and the model's answers at the scored positions.

The article's network (a frozen one-hot embedding of the 64 tokens, LSTM 128 -> LSTM 64, a dense
softmax over 64) with the recurrent kind, units, layers and dropout as settings; `sequence` mode
predicts at every position in one pass, `windows` mode one label per window. One model for
TensorFlow, JAX and PyTorch (keras.ops or numpy only; tasks/learning/nextcall/backend.py picks device and
precision); the recurrent layers keep cuDNN's conditions and the softmax stays float32. Sequence
mode can add the back-off n-gram's answer (`model.ngram_features`: NGramTable, NGramFeatures,
build_hybrid, the section "hybrid" below) and the online counter's (`model.online_features`: a
second input, `online` [B, T, 4], computed causally outside the graph) and each call's stack
(`model.frame_depth`: an input `frames` [B, T, depth, FRAME_PIECES], read by the shared
stack_encoder; position t reads calls <= t only). In full:
docs/learning-nextcall.md#the-next-call-models.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

from tasks.dataset.frame_tokens import FRAME_PIECES
from tasks.dataset.token_runs import TokenRun, eval_positions
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.batching import filled
from tasks.learning.counters.online import online_features
from tasks.learning.nextcall.backend import configure, placement, use_placement
from tasks.learning.nextcall.stack_input import stack_input
from tasks.learning.predictions import TOP_K, Predictions
from tasks.learning.stack_encoder import stack_encoder
from tasks.learning.train_config import TrainConfig

configure()  # the backend checked and set up (JAX's 64-bit keys) before any layer is built

OPTIMIZERS = {
    "adam": keras.optimizers.Adam,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}


def set_precision_policy() -> str:
    """The dtype policy for where this process trains (tasks/learning/nextcall/backend.py); its name."""
    where = placement()
    use_placement(where)
    return where.precision


def learning_rate(cfg: TrainConfig, total_steps: int | None = None):
    """cfg.learning_rate, or a cosine decay over `total_steps` (lr_schedule: cosine)."""
    if cfg.lr_schedule == "constant" or not total_steps:
        return cfg.learning_rate
    return keras.optimizers.schedules.CosineDecay(
        cfg.learning_rate, decay_steps=int(total_steps), alpha=cfg.lr_floor
    )


def _onehot(n: int, name: str):
    return keras.layers.Embedding(
        n, n, embeddings_initializer=keras.initializers.Identity(), trainable=False, name=name
    )


def _compile(model: keras.Model, cfg: TrainConfig, total_steps: int | None) -> keras.Model:
    model.compile(
        optimizer=OPTIMIZERS[cfg.optimizer](
            learning_rate=learning_rate(cfg, total_steps), clipnorm=cfg.clipnorm
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=TOP_K, name="top5"),
        ],
    )
    return model


def _recurrent(cfg: TrainConfig, mode: str, x):
    """The recurrent layers over an embedded input x [B, T, d]."""
    layer_cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[cfg.model.kind]
    units = cfg.model.units
    for i, n in enumerate(units):
        last = i == len(units) - 1
        x = layer_cls(
            n,
            return_sequences=(mode == "sequence") or not last,
            dropout=cfg.model.dropout,
            recurrent_dropout=0.0,  # cuDNN condition
            unroll=False,  # cuDNN condition
            name=f"{cfg.model.kind}_{i}",
        )(x)
    return x


def _network(cfg: TrainConfig, mode: str, x):
    """The recurrent layers and the softmax over an embedded input x [B, T, d]."""
    h = _recurrent(cfg, mode, x)
    return keras.layers.Dense(N_TOKENS, activation="softmax", dtype="float32", name="next")(h)


def _copy_network(cfg: TrainConfig, x, sources: list[tuple[str, object, object]]):
    """The recurrent layers, then logits with a COPY PATH per source (cfg.model.copy_path).

    A source is (name, its top-1 token [B, T] int (64: none), its confidence one-hots [B, T, c]).
    Each adds gate * onehot(top-1) to the logits, gate = a learned function of the recurrent
    state and the source's confidence. Without it, copying "the online counter says 17" has to
    pass through the last recurrent layer's few units (32 for 64 classes); with it, the network
    reproduces a source exactly where that source is right and learns where it is not."""
    h = _recurrent(cfg, "sequence", x)
    logits = keras.layers.Dense(N_TOKENS, dtype="float32", name="next_logits")(h)
    for name, top1, confidence in sources:
        gate = keras.layers.Dense(1, dtype="float32", name=f"{name}_gate")(
            keras.layers.Concatenate(name=f"{name}_gate_in")([h, confidence])
        )
        # identity rows for tokens 0..63, a zero row for "none" (64)
        onehot = keras.layers.Embedding(
            N_TOKENS + 1,
            N_TOKENS,
            embeddings_initializer=keras.initializers.Identity(),
            trainable=False,
            dtype="float32",
            name=f"{name}_copy",
        )(top1)
        logits = keras.layers.Add(name=f"{name}_copied")([logits, gate * onehot])
    return keras.layers.Activation("softmax", dtype="float32", name="next")(logits)


def build_model(
    cfg: TrainConfig, mode: str | None = None, total_steps: int | None = None
) -> keras.Model:
    """The network of `cfg.model` for `mode` (default cfg.mode), compiled with cfg's optimizer.

    `total_steps` (the planned training steps) shapes a cosine learning-rate schedule. With
    `model.ngram_features` use build_hybrid (the n-gram table comes from the training data)."""
    mode = mode or cfg.mode
    if cfg.model.ngram_features or cfg.model.online_features or cfg.model.frame_depth:
        raise ValueError(
            "model.ngram_features / online_features / frame_depth: build it with build_hybrid"
        )
    set_precision_policy()
    length = None if mode == "sequence" else cfg.context  # a sequence model takes any length
    inputs = keras.Input(shape=(length,), dtype="int32", name="tokens")
    outputs = _network(cfg, mode, _onehot(N_TOKENS, "onehot")(inputs))
    model = keras.Model(inputs, outputs, name=f"heapcast_{cfg.model.kind}_{mode}")
    return _compile(model, cfg, total_steps)


def feature_width(cfg: TrainConfig) -> int:
    """Columns of the feature input the core trains on: n-gram's, then the online counter's."""
    online = online_width(cfg.model.online_ranks) if cfg.model.online_features else 0
    return NGRAM_FEATURES * cfg.model.ngram_features + online


def build_hybrid(cfg: TrainConfig, table: NGramTable | None, total_steps: int | None = None):
    """(core, full), sequence mode, with n-gram features (`table`), online features and/or the
    stack (model.frame_depth).

    core maps (tokens, [features [B, T, feature_width]], [frames]) -> probabilities and is what
    trains (on leave-one-out n-gram features); full maps tokens (and, with online features,
    `online` [B, T, online_width]; with the stack, `frames` [B, T, depth, FRAME_PIECES]) ->
    probabilities, computing the n-gram features in-graph from `table` (NGramFeatures) and
    sharing core's weights. `full` is evaluated and registered."""
    if cfg.mode != "sequence":
        raise ValueError("model.ngram_features / online_features / frame_depth need mode: sequence")
    if cfg.model.ngram_features != (table is not None):
        raise ValueError("model.ngram_features: give the n-gram table (and only then)")
    set_precision_policy()
    depth = cfg.model.frame_depth
    tok = keras.Input(shape=(None,), dtype="int32", name="tokens")
    width = feature_width(cfg)
    feat = keras.Input(shape=(None, width), dtype="int32", name="features") if width else None
    frames_in = _frames_input(depth) if depth else None
    parts = [_onehot(N_TOKENS, "onehot")(tok)]
    if frames_in is not None:  # call t's own stack beside token t: causal
        parts.append(stack_encoder(frames_in, depth))
    sources = []  # (name, top-1, confidence one-hots) for the copy path
    col = 0
    if table is not None:
        conf = [
            _onehot(table.max_order + 1, "ngram_order")(feat[:, :, 1]),
            _onehot(_COUNT_BUCKETS, "ngram_count")(feat[:, :, 2]),
            _onehot(_SHARE_BUCKETS, "ngram_share")(feat[:, :, 3]),
        ]
        parts += [_onehot(N_TOKENS + 1, "ngram_top1")(feat[:, :, 0]), *conf]
        sources.append(("ngram", feat[:, :, 0], keras.layers.Concatenate()(conf)))
        col = NGRAM_FEATURES
    if cfg.model.online_features:
        conf = [
            _onehot(len(cfg.model.online_orders) + 1, "online_order")(feat[:, :, col + 1]),
            _onehot(_COUNT_BUCKETS, "online_count")(feat[:, :, col + 2]),
            _onehot(_SHARE_BUCKETS, "online_share")(feat[:, :, col + 3]),
        ]
        parts += [_onehot(N_TOKENS + 1, "online_top1")(feat[:, :, col]), *conf]
        confidence = keras.layers.Concatenate()(conf)
        sources.append(("online", feat[:, :, col], confidence))
        # the counter's candidates 2..online_ranks: a copy path each, gated by the same
        # confidence (the answering context's), not inputs of the recurrent layers
        for r in range(2, cfg.model.online_ranks + 1):
            sources.append(
                (f"online_rank{r}", feat[:, :, col + ONLINE_FEATURES + r - 2], confidence)
            )
    x = keras.layers.Concatenate(name="inputs")(parts)
    out = _copy_network(cfg, x, sources) if cfg.model.copy_path else _network(cfg, "sequence", x)
    core_in = [t for t in (tok, feat, frames_in) if t is not None]
    core = keras.Model(core_in, out, name=f"heapcast_{cfg.model.kind}_core")
    _compile(core, cfg, total_steps)
    tokens = keras.Input(shape=(None,), dtype="int32", name="tokens")
    inputs, feats = [tokens], []
    if table is not None:
        lookup = NGramFeatures(len(table.keys), table.max_order, name="ngram_lookup")
        feats.append(lookup(tokens))
        lookup.set_table(table)
    if cfg.model.online_features:
        width = online_width(cfg.model.online_ranks)
        online = keras.Input(shape=(None, width), dtype="int32", name="online")
        inputs.append(online)
        feats.append(OnlineOrders(cfg.model.online_orders, name="online_orders")(online))
    core_args = [tokens]
    if feats:
        core_args.append(
            feats[0] if len(feats) == 1 else keras.layers.Concatenate(name="features")(feats)
        )
    if depth:
        frames = _frames_input(depth)
        inputs.append(frames)
        core_args.append(frames)
    kind = "_".join(
        k
        for k, on in (
            ("ngram", table is not None),
            ("online", cfg.model.online_features),
            ("stack", depth > 0),
        )
        if on
    )
    full = keras.Model(
        inputs if len(inputs) > 1 else tokens,
        core(core_args if len(core_args) > 1 else tokens),
        name=f"heapcast_{cfg.model.kind}_{kind}_hybrid",
    )
    _compile(full, cfg, total_steps)
    return core, full


def _frames_input(depth: int):
    return keras.Input(shape=(None, depth, FRAME_PIECES), dtype="int32", name="frames")


def takes_frames(model: keras.Model) -> bool:
    """Whether a (registered) model reads each call's stack (a `frames` input)."""
    return any(t.name.split(":")[0] == "frames" for t in model.inputs)


def frame_depth_of(model: keras.Model) -> int:
    """The frames of each call's stack a model reads (0: none)."""
    frames = next((t for t in model.inputs if t.name.split(":")[0] == "frames"), None)
    return 0 if frames is None else int(frames.shape[2])


def refuse_frames(model: keras.Model, where: str) -> None:
    """ValueError where a path that cannot give each call's stack is handed a model that reads
    it (the streaming and stepping predictors, the training bundle)."""
    if takes_frames(model):
        raise ValueError(
            f"{where}: model {model.name} reads each call's stack (model.frame_depth > 0), "
            "which this path does not give it yet; serve a model trained with frame_depth: 0"
        )


def run_stack_input(model: keras.Model, run: TokenRun):
    """The StackInput a model that reads the stack needs for `run` (None for one that does
    not); StacksMissing where the run's stacks were not read."""
    depth = frame_depth_of(model)
    if not depth:
        return None
    return stack_input([run], depth)


def takes_online(model: keras.Model) -> bool:
    """Whether a (registered) model takes the online counter's features as its second input."""
    return _online_input(model) is not None


def _online_input(model: keras.Model):
    """The model's `online` input tensor, or None."""
    return next((t for t in model.inputs if t.name.split(":")[0] == "online"), None)


def as_sequence_model(model: keras.Model, cfg: TrainConfig) -> keras.Model:
    """A sequence-mode twin with the same weights (a windows model scored at every position).

    The weights of a recurrent layer do not depend on return_sequences, so a model trained on
    windows runs unchanged over evaluation chunks; it then sees up to 2*context previous tokens
    instead of exactly `context`.
    """
    if cfg.mode == "sequence":
        return model
    twin = build_model(cfg, mode="sequence")
    twin.set_weights(model.get_weights())
    return twin


def predict_positions(
    seq_model: keras.Model,
    run: TokenRun,
    context: int,
    batch_size: int,
) -> Predictions:
    """A sequence-mode model's top-5 and p(true token) at eval_positions(run), in order (a model
    that reads the stack: with the run's TokenRun.stacks).

    Stateless chunks of 2*context with a warm-up prefix (tasks.learning.nextcall.chunks.eval_chunks): every
    scored position past a thread's first 2*context tokens has >= context tokens in view.
    """
    tops, ps = [], []
    for (top, p_true), keep in _scored_batches(seq_model, run, context, batch_size, True):
        tops.append(np.asarray(top)[keep].astype(np.uint8))
        ps.append(np.asarray(p_true)[keep].astype(np.float64))
    top = np.concatenate(tops) if tops else np.zeros((0, TOP_K), np.uint8)
    p = np.concatenate(ps) if ps else np.zeros(0)
    _check_scored(run, len(p))
    return Predictions(top, p)


def predict_distribution(
    seq_model: keras.Model,
    run: TokenRun,
    context: int,
    batch_size: int,
) -> np.ndarray:
    """float32 [n, 64]: the model's probability of every token at eval_positions(run), in
    order (predict_positions' positions; a row's argmax is its top-1): what a mixture of
    predictors reads (tasks/learning/nextcall/hedge.py)."""
    rows = [
        np.asarray(probs)[keep].astype(np.float32)
        for probs, keep in _scored_batches(seq_model, run, context, batch_size, False)
    ]
    out = np.concatenate(rows) if rows else np.zeros((0, N_TOKENS), np.float32)
    _check_scored(run, len(out))
    return out


def _scored_batches(seq_model, run: TokenRun, context: int, batch_size: int, scored: bool):
    """(the model's outputs, the mask of their scored positions) per batch of eval chunks:
    the scorer's (top-5, p(true)) when `scored`, else the probabilities. One compiled call a
    batch."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.token_data import eval_batches

    online = None
    if takes_online(seq_model):
        online = online_feature_matrix(run, online_orders(seq_model), online_ranks(seq_model))
    held = run_stack_input(seq_model, run)
    batches, lo, hi = eval_batches(run, context, batch_size, features=online, stacks=held)
    score = _scorer(seq_model) if scored else None
    out = np.arange(2 * context)[None, :]
    done = 0
    for x, y in batches:
        b = len(y)
        # every call at the full batch size (tasks/learning/batching.py)
        inputs = [filled(a, batch_size) for a in ([*x] if isinstance(x, tuple) else [x])]
        got = (
            score.predict_on_batch([*inputs, filled(y, batch_size)])
            if scored
            else seq_model.predict_on_batch(inputs if len(inputs) > 1 else inputs[0])
        )
        got = tuple(np.asarray(g)[:b] for g in got) if scored else np.asarray(got)[:b]
        keep = (out >= lo[done : done + b, None]) & (out < hi[done : done + b, None])
        yield got, keep
        done += b


def _check_scored(run: TokenRun, n: int) -> None:
    expected = len(eval_positions(run))
    if n != expected:
        raise AssertionError(f"{run.name}: scored {n} positions, expected {expected}")


class _TopAndTrue(keras.layers.Layer):
    """probabilities [B, T, 64], true tokens [B, T] -> (top-5 tokens [B, T, 5], p(true) [B, T])."""

    def call(self, probs, truth):
        probs = ops.cast(probs, "float32")
        top = ops.top_k(probs, k=TOP_K)[1]  # ties: the lower token first, as every backend does
        p_true = ops.take_along_axis(probs, ops.expand_dims(ops.cast(truth, "int32"), -1), -1)
        return top, ops.squeeze(p_true, -1)


def _scorer(seq_model: keras.Model) -> keras.Model:
    """seq_model's inputs and the true tokens -> _TopAndTrue's answers, compiled by the backend
    (once per model: a new wrapper per run would trace its graph again for every run)."""
    cached = getattr(seq_model, "_heapcast_scorer", None)
    if cached is None:
        cached = _build_scorer(seq_model)
        # past Keras's attribute tracking: the scorer holds the model, not the other way round
        object.__setattr__(seq_model, "_heapcast_scorer", cached)
    return cached


def _build_scorer(seq_model: keras.Model) -> keras.Model:
    inputs = [
        keras.Input(shape=t.shape[1:], dtype=t.dtype, name=t.name.split(":")[0])
        for t in seq_model.inputs
    ]
    truth = keras.Input(shape=(None,), dtype="int32", name="truth")
    probs = seq_model(inputs if len(inputs) > 1 else inputs[0])
    top, p_true = _TopAndTrue(dtype="float32", name="top_and_true")(probs, truth)
    return keras.Model([*inputs, truth], [top, p_true], name=f"{seq_model.name}_scorer")


# --- online: the online counter's answer as an input feature --------------------------------------
#
# Row i describes token i+1, as the n-gram features do: what the online counter answers after
# seeing tokens ..i of i's thread (tasks.learning.counters.online.online_features gives, for position p,
# the answer before p; row i is position i+1's, so a thread's last row is its answer after the
# thread's last call: what streaming predicts from).
# The orders travel with the model (OnlineOrders, a weightless layer's config), so a registered
# model computes its features with the orders it was trained with.

# With model.online_ranks r > 1 the row goes on with the counter's candidates 2..r (64 = none).
ONLINE_FEATURES = 4  # top-1 (64 = none), order index (0 = none), count bucket, share bucket


def online_width(ranks: int) -> int:
    """Columns of an online feature row that carries the counter's top `ranks` candidates."""
    return ONLINE_FEATURES + ranks - 1


def online_ranks(model: keras.Model) -> int:
    """How many of the counter's candidates a model takes (its `online` input's width says)."""
    online = _online_input(model)
    if online is None:
        raise ValueError(f"model {model.name} takes no online features")
    return int(online.shape[-1]) - ONLINE_FEATURES + 1


def online_feature_matrix(run: TokenRun, orders, ranks: int = 1) -> np.ndarray:
    """uint8 [n, online_width(ranks)] for `run`: the online counter's answer after each token."""

    # one placeholder call after each thread's last, so that the answer after the last real
    # call exists (the counter answers a position from the calls before it only)
    ends = run.offsets[1:]
    tokens = np.insert(run.tokens, ends, 0)
    offsets = run.offsets + np.arange(len(run.offsets))
    f = online_features(tokens, offsets, tuple(int(k) for k in orders), ranked=ranks > 1)
    thread = np.repeat(np.arange(run.n_threads), run.thread_lengths())
    nxt = np.arange(run.n_tokens) + thread + 1  # position i+1 of i's thread, extended
    rows = _bucketed(
        np.asarray(f["top1"])[nxt].astype(np.int64),
        np.asarray(f["order"])[nxt].astype(np.int64),
        np.asarray(f["count"])[nxt].astype(np.int64),
        np.maximum(np.asarray(f["total"])[nxt].astype(np.int64), 1),
    )
    if ranks == 1:
        return rows
    return np.concatenate([rows, rank_columns(f["top5"][nxt], ranks)], axis=1)


def rank_columns(top5: np.ndarray, ranks: int) -> np.ndarray:
    """uint8 [n, ranks - 1]: the counter's candidates 2..ranks from its top-5 rows (a counter
    without fallback, tasks.learning.counters.online.NO_FALLBACK), 64 where it has fewer."""
    cols = np.asarray(top5)[:, 1:ranks]
    return np.where(cols < N_TOKENS, cols, N_TOKENS).astype(np.uint8)


def online_row(state, ranks: int = 1) -> np.ndarray:
    """The online_feature_matrix row of a streaming OnlineState (made with NO_FALLBACK): its
    answer after its last call."""
    (top1, order, count, total), top5 = state.answer_and_top()
    row = _bucketed(
        np.array([top1], np.int64),
        np.array([order], np.int64),
        np.array([count], np.int64),
        np.array([max(total, 1)], np.int64),
    )[0]
    if ranks == 1:
        return row
    return np.concatenate([row, rank_columns(top5[None], ranks)[0]])


def _bucketed(top, order, c1, tot) -> np.ndarray:
    """[top, order, count bucket, share bucket] as uint8 (buckets 0 where nothing answered)."""
    cb = sum((tot >= (1 << j)).astype(np.int64) for j in range(1, _COUNT_BUCKETS))
    sb = sum((_SHARE_BUCKETS * c1 >= j * tot).astype(np.int64) for j in range(1, _SHARE_BUCKETS))
    cb, sb = np.where(order > 0, cb, 0), np.where(order > 0, sb, 0)
    return np.stack([top, order, cb, sb], axis=1).astype(np.uint8)


def online_orders(model: keras.Model) -> tuple[int, ...]:
    """The online counter's orders a model was trained with (kept in its OnlineOrders layer)."""
    for layer in _all_layers(model):
        if isinstance(layer, OnlineOrders):
            return tuple(layer.orders)
    raise ValueError(f"model {model.name} takes online features but records no OnlineOrders")


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)


@keras.saving.register_keras_serializable(package="heapcast")
class OnlineOrders(keras.layers.Layer):
    """Identity on the `online` input; holds the counter's orders in the saved model's config."""

    def __init__(self, orders, **kwargs):
        super().__init__(**kwargs)
        self.orders = [int(k) for k in orders]

    def call(self, x):
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "orders": self.orders}


# --- hybrid: the back-off n-gram's answer as an input feature ------------------------------------
#
# Per position t of a chunk, the network is given besides token t what a back-off n-gram over
# exact contexts says about token t+1: its top-1 token, the order it backed off to, a bucket of
# how often that context was seen and a bucket of the top-1's share. The table is built from the
# TRAINING runs only and lives inside the Keras model as non-trainable weights (NGramFeatures),
# so the registered model still maps int32 tokens [batch, context] to probabilities.
#
# Honesty: on its own training data the table would be overconfident (every context was seen,
# including this very occurrence). The training features are therefore leave-one-out: the
# position's own (context, next) count is subtracted before taking the argmax, the total and
# the share; a context seen only there counts as unseen and the answer backs off to a shorter
# order. Validation and evaluation runs are not in the table and get the plain lookup, which is
# what the in-graph layer computes. Everything here is numpy / TensorFlow array code.

NGRAM_FEATURES = 4  # top-1 (64 = none), order (0 = none), count bucket (0..7), share bucket (0..3)
NGRAM_EXACT_ORDER = 9  # orders up to 9: the exact context, 6 bits a token + a sentinel bit
NGRAM_MAX_ORDER = 16  # longer orders: a 61-bit double polynomial hash (see context_keys)
_COUNT_BUCKETS = 8
_SHARE_BUCKETS = 4
# orders > NGRAM_EXACT_ORDER: key = 2^62 | (h1 * P2 + h2), h_j = (k * C_j + sum_i (tok_i + 1) *
# B_j^i) mod P_j over the k tokens, most recent first; every product stays below 2^63, so numpy
# and TensorFlow int64 give the same keys, and bit 62 keeps them apart from the exact keys.
_P1, _B1, _C1 = 2147483647, 1103515245, 40503
_P2, _B2, _C2 = 1000000007, 911382323, 69069


def context_keys(tokens: np.ndarray, pos_in_thread: np.ndarray, max_order: int):
    """Yield (k, key, valid) for k = 1..max_order: the key of the context of length k ending at
    each index i (tokens[i-k+1..i]) and whether those k tokens lie in i's thread.

    k <= NGRAM_EXACT_ORDER: the tokens themselves (the most recent in the low 6 bits) with a
    sentinel bit 1 << 6k, so orders never share a key; longer k: the double hash above."""
    t = tokens.astype(np.int64)
    n = len(t)
    key = np.zeros(n, np.int64)
    h1 = np.zeros(n, np.int64)
    h2 = np.zeros(n, np.int64)
    for k in range(1, max_order + 1):
        prev = np.zeros(n, np.int64)
        if n >= k:
            prev[k - 1 :] = t[: n - k + 1]
        h1 = (h1 + (prev + 1) * pow(_B1, k - 1, _P1)) % _P1
        h2 = (h2 + (prev + 1) * pow(_B2, k - 1, _P2)) % _P2
        if k <= NGRAM_EXACT_ORDER:
            key = key | (prev << (6 * (k - 1)))
            out = key | (np.int64(1) << (6 * k))
        else:
            out = (np.int64(1) << 62) | (((h1 + k * _C1) % _P1) * _P2 + (h2 + k * _C2) % _P2)
        yield k, out, pos_in_thread >= k - 1


def _i64(v: int):
    """An int64 scalar tensor: Python ints would become int32 on some backends and overflow."""
    return ops.convert_to_tensor(np.int64(v))


def _check_order(max_order: int) -> None:
    if not 1 <= max_order <= NGRAM_MAX_ORDER:
        raise ValueError(f"n-gram feature order {max_order}: expected 1..{NGRAM_MAX_ORDER}")


def _order_pairs(
    tokens: np.ndarray, pos_in_thread: np.ndarray, max_order: int, pair_of_positions: bool
):
    """Yield (k, key, valid, (ctx, tok, counts, pair_of)) for k = 1..max_order: context_keys'
    key and valid, and the distinct (context, next token) pairs of the counted positions (the
    context in the thread and a next call in it), sorted by context then token, with their
    counts and, if asked, each position's pair index (-1: not counted; else None)."""
    n = len(tokens)
    nxt = np.zeros(n, np.int64)
    nxt[:-1] = tokens[1:]
    has_next = np.zeros(n, bool)
    has_next[:-1] = pos_in_thread[1:] >= 1
    for k, key, valid in context_keys(tokens, pos_in_thread, max_order):
        ok = np.flatnonzero(valid & has_next)
        kk, nn = key[ok], nxt[ok]
        o = np.lexsort((nn, kk))
        kk, nn = kk[o], nn[o]
        new = np.ones(len(kk), bool)
        new[1:] = (kk[1:] != kk[:-1]) | (nn[1:] != nn[:-1])
        starts = np.flatnonzero(new)
        counts = np.diff(np.append(starts, len(kk)))
        pair_of = None
        if pair_of_positions:
            pair_of = np.full(n, -1, np.int64)
            pair_of[ok[o]] = np.cumsum(new) - 1
        yield k, key, valid, (kk[starts], nn[starts].astype(np.int32), counts, pair_of)


def _summarise(ctx: np.ndarray, tok: np.ndarray, counts: np.ndarray) -> tuple:
    """Distinct (context, token) pairs sorted by context then token, with counts > 0 ->
    per context: (keys, top1, count1, total, top2, count2); ties go to the lower token."""
    keys, first, n_per = np.unique(ctx, return_index=True, return_counts=True)
    group = np.repeat(np.arange(len(keys)), n_per)
    order = np.lexsort((tok, -counts, group))  # by context, count desc, token asc
    rank = np.arange(len(order)) - first[group[order]]
    top1 = np.full(len(keys), N_TOKENS, np.int32)
    top2 = np.full(len(keys), N_TOKENS, np.int32)
    c1 = np.zeros(len(keys), np.int32)
    c2 = np.zeros(len(keys), np.int32)
    g, r = group[order], rank
    top1[g[r == 0]], c1[g[r == 0]] = tok[order][r == 0], counts[order][r == 0]
    top2[g[r == 1]], c2[g[r == 1]] = tok[order][r == 1], counts[order][r == 1]
    total = np.add.reduceat(counts, first).astype(np.int32) if len(first) else c1
    return keys, top1, c1, total, top2, c2


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices lo[0]..hi[0]-1, lo[1]..hi[1]-1, ... in one array (ranges sorted, apart)."""
    n = hi - lo
    if not n.sum():
        return np.zeros(0, np.int64)
    starts = np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n)
    return starts + np.arange(n.sum())


@dataclass(frozen=True)
class NGramTable:
    """Exact-context counts of every order 1..max_order, one sorted key array for all orders."""

    keys: np.ndarray  # int64 [m], sorted; the sentinel bit makes every order's keys distinct
    top1: np.ndarray  # int32 [m], most frequent next token (ties: the lower token)
    count1: np.ndarray  # int32 [m]
    total: np.ndarray  # int32 [m]
    top2: np.ndarray  # int32 [m], runner-up (for leave-one-out), 64 if none
    count2: np.ndarray  # int32 [m]
    max_order: int

    @classmethod
    def fit(cls, tokens: np.ndarray, pos_in_thread: np.ndarray, max_order: int) -> NGramTable:
        _check_order(max_order)
        parts = []
        for _k, _key, _valid, pairs in _order_pairs(tokens, pos_in_thread, max_order, False):
            ctx, tok, counts, _ = pairs
            parts.append(_summarise(ctx, tok, counts))
        return cls._from_parts(parts, max_order)

    @classmethod
    def fit_leaving_out(
        cls, tokens: np.ndarray, pos_in_thread: np.ndarray, group: np.ndarray, max_order: int
    ) -> tuple[NGramTable, dict[int, NGramTable]]:
        """The table `fit` gives on every position, and for each value g of `group` (one per
        position; a workload, say) the table `fit` gives on the positions of the OTHER groups,
        restricted to the contexts g's positions look up, so that `features` on g's positions
        answers exactly as that table would.

        One pass over the whole: each order's (context, next) pairs are counted once, for the
        whole table and for every group, whose own counts are subtracted from the pairs of the
        contexts it looks up. Fitting a table on the others for every group costs a sort of
        almost everything per group instead.
        """
        _check_order(max_order)
        group = np.asarray(group)
        members = {int(g): np.flatnonzero(group == g) for g in np.unique(group)}
        whole: list = []
        parts: dict[int, list] = {g: [] for g in members}
        for _k, key, valid, pairs in _order_pairs(tokens, pos_in_thread, max_order, True):
            ctx, tok, counts, pair_of = pairs
            whole.append(_summarise(ctx, tok, counts))
            for g, mine in members.items():
                asked = np.unique(key[mine[valid[mine]]])
                lo = np.searchsorted(ctx, asked, "left")
                hi = np.searchsorted(ctx, asked, "right")
                sel = _ranges(lo, hi)  # the pairs of the contexts g looks up, in pair order
                left = counts[sel].astype(np.int64)
                own, n_own = np.unique(pair_of[mine], return_counts=True)
                if len(own) and own[0] < 0:  # positions not counted (no context or no next)
                    own, n_own = own[1:], n_own[1:]
                left[np.searchsorted(sel, own)] -= n_own  # g's own pairs are among them
                keep = left > 0
                parts[g].append(_summarise(ctx[sel][keep], tok[sel][keep], left[keep]))
        return cls._from_parts(whole, max_order), {
            g: cls._from_parts(p, max_order) for g, p in parts.items()
        }

    @classmethod
    def _from_parts(cls, parts: list, max_order: int) -> NGramTable:
        cat = [np.concatenate(p) for p in zip(*parts)]
        o = np.argsort(cat[0], kind="stable")
        return cls(*(a[o] for a in cat), max_order=max_order)

    def features(
        self,
        tokens: np.ndarray,
        pos_in_thread: np.ndarray,
        leave_one_out: bool,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """uint8 [n, NGRAM_FEATURES] for each index i: the back-off answer about token i+1.

        leave_one_out: `tokens` are the table's own training tokens; subtract each position's
        own (context, next) occurrence first (see the section's comment).
        rows: only these indices (sorted or not), in their order: [len(rows), NGRAM_FEATURES],
        the same rows as the whole answer's. The contexts still come from all of `tokens`; the
        lookups, most of the time, only for the rows asked (train.training_features asks each
        training position of one table only)."""
        n = len(tokens)
        nxt = np.zeros(n, np.int64)
        nxt[:-1] = tokens[1:]
        counted = np.zeros(n, bool)
        counted[:-1] = pos_in_thread[1:] >= 1
        if rows is not None:
            rows = np.asarray(rows, np.int64)
            nxt, counted = nxt[rows], counted[rows]
        r = len(nxt)
        top = np.full(r, N_TOKENS, np.int64)
        order = np.zeros(r, np.int64)
        c1 = np.zeros(r, np.int64)
        tot = np.ones(r, np.int64)
        m = len(self.keys)
        for k, key, valid in context_keys(tokens, pos_in_thread, self.max_order):
            if rows is not None:
                key, valid = key[rows], valid[rows]
            i = np.minimum(np.searchsorted(self.keys, key), max(m - 1, 0))
            if not m:
                break
            found = valid & (self.keys[i] == key)
            t1, k1, tt = (
                self.top1[i].astype(np.int64),
                self.count1[i].astype(np.int64),
                self.total[i].astype(np.int64),
            )
            if leave_one_out:
                own = found & counted
                tt = tt - own
                hit = own & (nxt == t1)
                k1 = k1 - hit
                t2, k2 = self.top2[i].astype(np.int64), self.count2[i].astype(np.int64)
                swap = hit & ((k2 > k1) | ((k2 == k1) & (t2 < t1)))
                t1, k1 = np.where(swap, t2, t1), np.where(swap, k2, k1)
                found = found & (tt > 0)
            top = np.where(found, t1, top)
            order = np.where(found, k, order)
            c1 = np.where(found, k1, c1)
            tot = np.where(found, tt, tot)
        return _bucketed(top, order, c1, tot)


@keras.saving.register_keras_serializable(package="heapcast")
class NGramFeatures(keras.layers.Layer):
    """int32 tokens [B, T] -> int32 [B, T, 4]: the back-off n-gram's answer after each position.

    The table (NGramTable without the leave-one-out columns) is held as non-trainable weights:
    sorted int64 context keys and int32 top-1 / count / total; lookup is a binary search (keras.ops), one
    per order, the longest order found wins. Position t sees tokens 0..t of its chunk only.
    """

    def __init__(self, n_keys: int, max_order: int, **kwargs):
        kwargs["trainable"] = False
        super().__init__(**kwargs)
        self.n_keys = int(n_keys)
        self.max_order = int(max_order)
        m = max(self.n_keys, 1)
        self.keys = self.add_weight(
            shape=(m,), dtype="int64", initializer="zeros", trainable=False, name="keys"
        )
        self.top1 = self.add_weight(
            shape=(m,), dtype="int32", initializer="zeros", trainable=False, name="top1"
        )
        self.count1 = self.add_weight(
            shape=(m,), dtype="int32", initializer="zeros", trainable=False, name="count1"
        )
        self.total = self.add_weight(
            shape=(m,), dtype="int32", initializer="zeros", trainable=False, name="total"
        )

    def set_table(self, table: NGramTable) -> None:
        if len(table.keys) != self.n_keys or table.max_order != self.max_order:
            raise ValueError("table does not match the layer's n_keys / max_order")
        if self.n_keys:
            self.keys.assign(table.keys)
            self.top1.assign(table.top1)
            self.count1.assign(table.count1)
            self.total.assign(table.total)

    def call(self, tokens):
        t = ops.cast(tokens, "int64")
        shape = ops.shape(t)
        m = self.n_keys
        key = ops.zeros_like(t)
        top = ops.full_like(t, N_TOKENS)
        order = ops.zeros_like(t)
        c1 = ops.zeros_like(t)
        tot = ops.ones_like(t)
        idx = ops.expand_dims(ops.arange(shape[1], dtype="int64"), 0)
        h1 = ops.zeros_like(t)
        h2 = ops.zeros_like(t)
        for k in range(1, self.max_order + 1):
            # the token at t-k+1 (0 before the chunk's start)
            prev = t if k == 1 else ops.pad(t, [[0, 0], [k - 1, 0]])[:, : -(k - 1)]
            h1 = ops.mod(h1 + (prev + 1) * _i64(pow(_B1, k - 1, _P1)), _i64(_P1))
            h2 = ops.mod(h2 + (prev + 1) * _i64(pow(_B2, k - 1, _P2)), _i64(_P2))
            if k <= NGRAM_EXACT_ORDER:
                key = ops.bitwise_or(key, ops.left_shift(prev, _i64(6 * (k - 1))))
                full = ops.bitwise_or(key, _i64(1 << (6 * k)))
            else:
                mixed = ops.mod(h1 + _i64(k * _C1), _i64(_P1)) * _i64(_P2) + ops.mod(
                    h2 + _i64(k * _C2), _i64(_P2)
                )
                full = ops.bitwise_or(mixed, _i64(1 << 62))
            if not m:
                continue
            i = ops.searchsorted(self.keys, ops.reshape(full, [-1]), side="left")
            i = ops.reshape(ops.minimum(ops.cast(i, "int64"), m - 1), shape)
            found = ops.logical_and(ops.equal(ops.take(self.keys, i), full), idx >= k - 1)
            top = ops.where(found, ops.cast(ops.take(self.top1, i), "int64"), top)
            order = ops.where(found, _i64(k), order)
            c1 = ops.where(found, ops.cast(ops.take(self.count1, i), "int64"), c1)
            tot = ops.where(found, ops.cast(ops.take(self.total, i), "int64"), tot)
        cb = sum(ops.cast(tot >= (1 << j), "int64") for j in range(1, _COUNT_BUCKETS))
        sb = sum(
            ops.cast(_SHARE_BUCKETS * c1 >= j * tot, "int64") for j in range(1, _SHARE_BUCKETS)
        )
        answered = order > 0
        cb = ops.where(answered, cb, ops.zeros_like(cb))
        sb = ops.where(answered, sb, ops.zeros_like(sb))
        return ops.cast(ops.stack([top, order, cb, sb], axis=-1), "int32")

    def compute_output_shape(self, input_shape):
        return (*input_shape, NGRAM_FEATURES)

    def compute_output_spec(self, tokens):
        return keras.KerasTensor((*tokens.shape, NGRAM_FEATURES), dtype="int32")

    def get_config(self):
        return {**super().get_config(), "n_keys": self.n_keys, "max_order": self.max_order}
