"""The champion in streaming form: feed each thread's heap calls as they happen, get the next-call
distribution after each. Three forms:

- HedgedStream (the one to serve): StatefulStream's network mixed per thread with the online
  counter and the training majority, model_hedged of the evaluation tables, so that a program
  new to the network gets the counter's answers rather than confidently wrong ones.
- StatefulStream (the network alone): the network stepped one call at a time, two recurrent states
  per thread, compiled, no TensorFlow per call; it answers exactly what the evaluation tables
  score (predict_chunked is its batch form). `StatefulStream.from_registry()` builds it from any
  registered version's weights.
- StreamingPredictor (the reference): re-runs the model over each thread's last `context`
  calls per answer (predict_window is its batch form);
  30-60x the wall time per answer.

    from tasks.learning.serving.streaming import StreamingPredictor
    from tasks.dataset.tokens import size_class

    sp = StreamingPredictor.from_registry()              # models:/heapcast-next-call@champion
    sp.observe(thread=7, token=int(size_class([48])[0]))  # a malloc(48) on thread 7
    p = sp.predict([7])                                   # {7: float32[64]}: its next call
    dists = sp.step({7: 32 + 6, 9: 12})                   # observe one call on each, then predict

The state kept per thread and the batching: docs/learning-nextcall.md#streaming-the-champion.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tasks.dataset.token_runs import TokenRun
from tasks.dataset.tokens import N_TOKENS
from tasks.learning.counters.baselines import Majority
from tasks.learning.counters.online import (
    ANSWER_WIDTH,
    DEFAULT_ORDERS,
    NO_FALLBACK,
    OnlineState,
    OnlineStreams,
)
from tasks.learning.nextcall.hedge import HEDGE_ARTIFACT, LEAD, HedgeStreams, hedge_settings
from tasks.learning.predictions import TOP_K
from tasks.learning.questions.hedge import FLOOR
from tasks.learning.serving import stepping
from tasks.learning.serving.hedged_step import (
    counter_step,
    first_bad,
    hedge_part,
    network_few,
    network_fixed,
)
from tasks.learning.serving.stepping import step_calls, step_weights


@dataclass
class _Thread:
    tokens: np.ndarray  # int32 [context], the last tokens, oldest first (left part unused)
    online: np.ndarray | None  # int32 [context, 4], their online features (row i: after token i)
    state: object | None  # the online counter's state over the whole thread
    seen: int = 0


@dataclass
class StreamingPredictor:
    """A model (tokens [, online] -> [B, T, 64]) with per-thread state; see the module doc."""

    model: object  # a Keras model, as registered
    context: int = 100
    _threads: dict[Hashable, _Thread] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # deferred: imported on first use, for start-up time
        from tasks.learning.nextcall.model import (
            online_orders,
            online_ranks,
            refuse_frames,
            takes_online,
        )

        refuse_frames(self.model, "StreamingPredictor")
        self._online = takes_online(self.model)
        self._orders = online_orders(self.model) if self._online else ()
        self._ranks = online_ranks(self.model) if self._online else 1
        self._call = _compiled(self.model, self._online)

    @classmethod
    def from_registry(
        cls, name: str = "heapcast-next-call", alias: str = "champion", context: int = 100
    ) -> StreamingPredictor:
        """Load `models:/<name>@<alias>` from the tracking store MLflow is configured for."""
        # deferred: imported on first use, for start-up time
        import mlflow.keras

        import tasks.learning.nextcall.model  # noqa: F401  (registers heapcast's custom layers)

        return cls(mlflow.keras.load_model(f"models:/{name}@{alias}"), context)

    # --- state ----------------------------------------------------------------------------------

    def _thread(self, thread: Hashable) -> _Thread:
        t = self._threads.get(thread)
        if t is None:
            # deferred: imported on first use, for start-up time
            from tasks.learning.nextcall.model import online_width

            t = _Thread(
                tokens=np.zeros(self.context, np.int32),
                online=np.zeros((self.context, online_width(self._ranks)), np.int32)
                if self._online
                else None,
                state=OnlineState(self._orders, fallback=NO_FALLBACK) if self._online else None,
            )
            self._threads[thread] = t
        return t

    def observe(self, thread: Hashable, token: int) -> None:
        """One heap call of `thread` (its token: tasks.dataset.tokens), in call order."""
        if not 0 <= int(token) < N_TOKENS:
            raise ValueError(f"thread {thread!r}: token {token} is not in 0..{N_TOKENS - 1}")
        t = self._thread(thread)
        t.tokens[:-1] = t.tokens[1:]
        t.tokens[-1] = token
        if t.online is not None:
            # deferred: imported on first use, for start-up time
            from tasks.learning.nextcall.model import online_row

            t.state.push(int(token))
            t.online[:-1] = t.online[1:]
            t.online[-1] = online_row(t.state, self._ranks)
        t.seen += 1

    def forget(self, thread: Hashable) -> None:
        """The thread ended: drop its state."""
        self._threads.pop(thread, None)

    # --- predictions ----------------------------------------------------------------------------

    def predict(self, threads: Iterable[Hashable] | None = None) -> dict[Hashable, np.ndarray]:
        """{thread: float32 [64]}: each thread's next-call distribution, one batched pass."""
        names = [t for t in (self._threads if threads is None else threads)]
        missing = [t for t in names if t not in self._threads or not self._threads[t].seen]
        if missing:
            raise KeyError(f"threads {missing[:5]} have no observed call yet")
        if not names:
            return {}
        # A young thread's window is its calls only. The model has no mask and token 0 is a real
        # call (malloc(0)), so a window is never padded: threads are batched by window width,
        # one pass per width (once every thread is `context` old, a single pass).
        by_width: dict[int, list[Hashable]] = {}
        for t in names:
            by_width.setdefault(min(self.context, self._threads[t].seen), []).append(t)
        out: dict[Hashable, np.ndarray] = {}
        for width, group in by_width.items():
            tokens = np.stack([self._threads[t].tokens[-width:] for t in group])
            x: object = tokens
            if self._online:
                x = {
                    "tokens": tokens,
                    "online": np.stack([self._threads[t].online[-width:] for t in group]),
                }
            probs = np.asarray(self._call(x))
            out.update({t: probs[i] for i, t in enumerate(group)})
        return {t: out[t] for t in names}

    def step(self, calls: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        """Observe one call per thread, then predict each of those threads' next call."""
        for thread, token in calls.items():
            self.observe(thread, token)
        return self.predict(list(calls))


def _compiled(model, online: bool):
    """The model's last-position output, compiled by the backend for any batch and window width.

    Called eagerly, a recurrent model runs its time loop op by op (seconds per call); Keras's
    predict_on_batch runs one compiled function (TensorFlow traces it once with shapes left open,
    JAX once per batch and window width). Takes tokens, or {"tokens", "online"} (online)."""
    # deferred: imported on first use, for start-up time
    import keras

    names = [t.name.split(":")[0] for t in model.inputs]
    inputs = [
        keras.Input(shape=t.shape[1:], dtype=t.dtype, name=n) for t, n in zip(model.inputs, names)
    ]
    out = model(inputs if len(inputs) > 1 else inputs[0])[:, -1, :]
    last = keras.Model(inputs, out, name=f"{model.name}_last")
    if not online:
        return last.predict_on_batch
    return lambda x: last.predict_on_batch([x[n] for n in names])


def predict_window(model, tokens: np.ndarray, context: int = 100) -> np.ndarray:
    """Batch form of one streaming prediction: float32 [64] after the last of `tokens` (one
    thread's calls from its first), from its last `context` tokens and their online features."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import (
        online_feature_matrix,
        online_orders,
        online_ranks,
        refuse_frames,
        takes_online,
    )

    refuse_frames(model, "predict_window")
    tokens = np.asarray(tokens, np.uint8)
    width = min(context, len(tokens))
    x: object = tokens[None, -width:].astype(np.int32)
    if takes_online(model):
        run = TokenRun("stream", "thread", tokens, np.array([0, len(tokens)]))
        online = online_feature_matrix(run, online_orders(model), online_ranks(model))
        x = {"tokens": x, "online": online[None, -width:].astype(np.int32)}
    return np.asarray(model(x, training=False))[0, -1, :]


# --- the stateful stream ------------------------------------------------------------------------


# stands in for the network's online counter where the model takes none (never pushed)
_NO_COUNTER = OnlineStreams(DEFAULT_ORDERS, capacity=1)
# no hedge to answer from the network's counter (counter_step's hedge_top, hedge_dist)
_NO_HEDGE = (np.zeros((0, TOP_K), np.uint8), np.zeros((0, N_TOKENS), np.float64))


class StatefulStream:
    """The model stepped one call at a time, two recurrent states carried per thread.

    It computes what the evaluation tables score (tasks/learning/serving/stepping.py says which function
    and why), not predict_window: `predict_chunked` is its batch form. Per call: the online
    counter's update, the n-gram lookups, two cell steps per layer; no window is re-run, no
    TensorFlow runs.

        ss = StatefulStream.from_registry()
        dists = ss.step({7: 32 + 6, 9: 12})   # observe one call on each thread; {thread: [64]}
    """

    def __init__(self, model, context: int = 100) -> None:
        if context < 1:
            raise ValueError(f"context {context}: must be >= 1")
        self.context = int(context)
        self.weights = step_weights(model)
        self._index: dict[Hashable, int] = {}
        self._free: list[int] = []
        w = self.weights
        self._hist_len = max(w.ngram_order, 1)
        self._online = None
        if w.online_orders:
            self._online = OnlineStreams(w.online_orders, fallback=NO_FALLBACK)
        self._fixed = network_fixed(w, self.context, self._online)
        self._alloc(16)

    @classmethod
    def from_registry(
        cls, name: str = "heapcast-next-call", alias: str = "champion", context: int = 100
    ) -> StatefulStream:
        """The stream of `models:/<name>@<alias>` (any registered version: only its weights
        are read)."""
        return cls(StreamingPredictor.from_registry(name, alias, context).model, context)

    def _alloc(self, capacity: int) -> None:
        w = self.weights
        old = getattr(self, "_n_seen", None)
        n_seen = np.zeros(capacity, np.int64)
        hist = np.zeros((capacity, self._hist_len), np.uint8)
        # per layer, the two staggered states of every slot (c: an LSTM's cell state)
        hs = [np.zeros((capacity, 2, u), np.float32) for u in w.units]
        cs = [np.zeros((capacity, 2, u), np.float32) for u in w.units]
        if old is not None:
            n = len(old)
            n_seen[:n], hist[:n] = self._n_seen, self._hist
            for new, was in zip(hs + cs, self._hs + self._cs, strict=True):
                new[:n] = was
        self._n_seen, self._hist, self._hs, self._cs = n_seen, hist, hs, cs

    def _slot(self, thread: Hashable) -> int:
        i = self._index.get(thread)
        if i is None:
            if self._free:
                i = self._free.pop()
            else:
                i = len(self._index)
                if i >= len(self._n_seen):
                    self._alloc(2 * len(self._n_seen))
            self._n_seen[i] = 0
            self._hist[i] = 0
            for state in self._hs + self._cs:
                state[i] = 0.0
            if self._online is not None:
                self._online.reset(i)
            self._started(i)
            self._index[thread] = i
        return i

    def _started(self, slot: int) -> None:
        """Slot `slot` now holds a new thread (state beyond the network's resets here)."""

    def forget(self, thread: Hashable) -> None:
        """The thread ended: its state is dropped (its slot reused)."""
        i = self._index.pop(thread, None)
        if i is not None:
            self._free.append(i)

    def seen(self, thread: Hashable) -> int:
        """How many calls of `thread` were observed."""
        i = self._index.get(thread)
        return 0 if i is None else int(self._n_seen[i])

    def step(self, calls: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        """Observe one call per thread (its token), then {thread: float32 [64]}: its next call."""
        names, _, _, out = self._step(calls)
        return dict(zip(names, out, strict=True))

    def _step(self, calls: dict[Hashable, int], hedge: tuple = _NO_HEDGE):
        """(thread names, their slots, their tokens, float32 [B, 64] the network's answers).
        `hedge`: (uint8 [B, 5], float64 [B, 64]) that the network's online counter fills with
        its answers to the hedge (counter_step), or _NO_HEDGE."""
        names = list(calls)
        n = len(names)
        tokens = np.fromiter(map(int, calls.values()), np.int64, n)
        bad = first_bad(tokens)
        if bad >= 0:
            t = names[bad]
            raise ValueError(f"thread {t!r}: token {calls[t]} is not in 0..{N_TOKENS - 1}")
        # known threads through the dict alone: per thread, this is most of the Python left
        slots = list(map(self._index.get, names))
        if None in slots:
            slots = list(map(self._slot, names))
        idx = np.array(slots, np.int64)
        if n <= stepping.FEW_THREADS:  # read per call: tests set it
            # the counter, the cell steps and the answer in one compiled call: step_calls'
            # few-threads path without its Python (hedged_step.py)
            on = self._online if self._online is not None else _NO_COUNTER
            out = network_few(
                idx, tokens, on._ctabs, on._ptabs, on._metas, on._hists, on._n_seen,
                self._n_seen, self._hist, tuple(self._hs), tuple(self._cs), hedge[0], hedge[1],
                self._fixed,
            )  # fmt: skip
            return names, idx, tokens, out
        if self._online is not None:
            on = self._online
            online = np.empty((n, ANSWER_WIDTH), np.int64)
            counter_step(
                on._ctabs, on._ptabs, on._metas, on._hists, on._n_seen, idx,
                tokens.astype(np.uint8), on._ext, on._fallback, self._fixed[3], self._fixed[4],
                online, hedge[0], hedge[1],
            )  # fmt: skip
        else:
            online = np.zeros((len(names), ANSWER_WIDTH), np.int64)
        out = step_calls(
            self.weights, self.context, self._n_seen, self._hist, self._hs, self._cs, idx,
            tokens, online,
        )  # fmt: skip
        return names, idx, tokens, out


class HedgedStream(StatefulStream):
    """StatefulStream's network mixed, per thread, with the online counter and the training
    majority: what the evaluation tables score as model_hedged (tasks/learning/nextcall/hedge.py),
    one call at a time. The answer to serve where a program may be new to the network: where the
    network is confidently wrong, within a few calls the thread's weights move to the counter.

        hs = HedgedStream.from_registry()
        dists = hs.step({7: 32 + 6, 9: 12})   # {thread: float64 [64]}, the mixture
        hs.top(7)                              # uint8 [5]: thread 7's next call, best first

    Given the same network answers, its answers are hedged_next's exactly
    (tests/tasks/learning/serving/test_streaming.py)."""

    def __init__(
        self,
        model,
        token_counts: np.ndarray,
        smoothing: float = 0.1,
        context: int = 100,
        counter_orders: tuple[int, ...] = DEFAULT_ORDERS,
    ) -> None:
        counts = np.asarray(token_counts, np.float64)
        if counts.shape != (N_TOKENS,) or not np.all(np.isfinite(counts)) or np.any(counts < 0):
            raise ValueError(
                f"token_counts {counts.shape}: the training data's {N_TOKENS} token counts "
                f"(>= 0) expected ({HEDGE_ARTIFACT} of the registered model)"
            )
        self.majority = Majority.from_counts(counts, smoothing)
        self._counter = OnlineStreams(
            counter_orders, smoothing=smoothing, fallback=self.majority.ranking
        )
        self._mix = HedgeStreams(2, [self.majority.probs], 2)
        super().__init__(model, context)
        # the network's online counter over the same orders holds the same tables: it learns
        # each call once and answers twice, without and with the majority's ranking to fall on
        counter = self._counter
        learn = self._online is None or self._online.orders != counter.orders
        if not learn:
            self._counter = self._online
            # ... and answers the hedge in the network's step: its ranking and smoothing there
            self._fixed = network_fixed(
                self.weights, self.context, self._online, counter._fallback, counter.smoothing
            )
        m = self._mix
        self._hedge_fixed = (
            learn, counter._ext, counter._fallback, counter.smoothing, m.fixed, LEAD, m.share,
            FLOOR,
        )  # fmt: skip

    @classmethod
    def from_registry(
        cls,
        name: str = "heapcast-next-call",
        alias: str = "champion",
        context: int = 100,
        token_counts: np.ndarray | None = None,
    ) -> HedgedStream:
        """The hedged stream of `models:/<name>@<alias>`: its weights and its HEDGE_ARTIFACT.
        `token_counts` (the training data's [64]) stands in for a version registered without
        that file, with the default smoothing and orders."""
        # deferred: imported on first use, for start-up time
        import mlflow
        import mlflow.keras
        from mlflow.exceptions import MlflowException

        import tasks.learning.nextcall.model  # noqa: F401  (registers heapcast's custom layers)

        version = mlflow.MlflowClient().get_model_version_by_alias(name, alias)
        try:
            settings = mlflow.artifacts.load_dict(f"runs:/{version.run_id}/{HEDGE_ARTIFACT}")
        except MlflowException as e:
            if token_counts is None:
                raise LookupError(
                    f"{name} version {version.version} ({alias}) has no {HEDGE_ARTIFACT}: it was "
                    "registered before heapcast logged the hedge's settings. Pass the training "
                    "data's token counts (token_counts=), point the alias at a version registered "
                    "since, or stream the network alone with StatefulStream.from_registry"
                ) from e
            settings = hedge_settings(token_counts, 0.1)
        model = mlflow.keras.load_model(f"models:/{name}/{version.version}")
        return cls(
            model,
            settings["token_counts"],
            settings["smoothing"],
            context,
            tuple(settings["counter_orders"]),
        )

    def _started(self, slot: int) -> None:
        self._counter.reset(slot)
        self._mix.reset(slot)

    def step(self, calls: dict[Hashable, int]) -> dict[Hashable, np.ndarray]:
        """Observe one call per thread (its token), then {thread: float64 [64]}: the mixture's
        distribution of its next call (its top-5: `top`).

        Two compiled calls (tasks/learning/serving/hedged_step.py): the network's (_step), then
        the counter's and the mixture's."""
        n = len(calls)
        counter_top, counter = np.empty((n, TOP_K), np.uint8), np.empty((n, N_TOKENS))
        # a shared counter answers the hedge in the network's step (no second lookup)
        shared = not self._hedge_fixed[0]
        names, idx, tokens, net = self._step(calls, (counter_top, counter) if shared else _NO_HEDGE)
        c, m = self._counter, self._mix
        mixed = hedge_part(
            idx, tokens, net, counter_top, counter, c._ctabs, c._ptabs, c._metas, c._hists,
            c._n_seen, m._answered, m._logw, m._hits, m._prev_rows, m._prev_lists, m._top,
            self._hedge_fixed,
        )  # fmt: skip
        return dict(zip(names, mixed, strict=True))

    def top(self, thread: Hashable) -> np.ndarray:
        """uint8 [5]: the thread's next call, best first, as of its last observed call."""
        i = self._index.get(thread)
        if i is None or not self._n_seen[i]:
            raise KeyError(f"thread {thread!r} has no observed call yet")
        return self._mix.top(i)


def predict_chunked(model, tokens: np.ndarray, context: int = 100) -> np.ndarray:
    """Batch form of one StatefulStream answer: float32 [64] after the last of `tokens` (one
    thread's calls from its first), from the evaluation chunk that scores the next call
    (tasks.learning.nextcall.chunks.eval_chunks): the one starting at call k*context,
    k = max(0, i // context - 1) for the last call's index i."""
    # deferred: imported on first use, for start-up time
    from tasks.learning.nextcall.model import (
        online_feature_matrix,
        online_orders,
        online_ranks,
        refuse_frames,
        takes_online,
    )

    refuse_frames(model, "predict_window")
    tokens = np.asarray(tokens, np.uint8)
    start = max(0, (len(tokens) - 1) // context - 1) * context
    x: object = tokens[None, start:].astype(np.int32)
    if takes_online(model):
        run = TokenRun("stream", "thread", tokens, np.array([0, len(tokens)]))
        online = online_feature_matrix(run, online_orders(model), online_ranks(model))
        x = {"tokens": x, "online": online[None, start:].astype(np.int32)}
    return np.asarray(model(x, training=False))[0, -1, :]
