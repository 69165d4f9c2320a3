"""The champion in streaming form: feed each thread's heap calls as they happen, get the next-call
distribution after each.

    from tasks.learning.streaming import StreamingPredictor
    from tasks.dataset.tokens import size_class

    sp = StreamingPredictor.from_registry()              # models:/heapcast-next-call@champion
    sp.observe(thread=7, token=int(size_class([48])[0]))  # a malloc(48) on thread 7
    p = sp.predict([7])                                   # {7: float32[64]}: its next call
    dists = sp.step({7: 32 + 6, 9: 12})                   # observe one call on each, then predict

State is kept per thread: the last `context` tokens and, for a model with online features, the
online counter over the thread's WHOLE history (tasks.learning.online.OnlineState, updated in
O(1) per call). A prediction runs the model once over each asked thread's window, all asked
threads of the same window width in one batch (a thread younger than `context` calls has a
shorter window; windows are never padded), so the cost per prediction falls as threads are
batched (benchmarks/bench_streaming.py).

What a prediction equals: the registered model applied to the thread's last `context` tokens
and their online features, exactly what `predict_window` computes in batch from a thread's
whole token array (tests/tasks/learning/test_streaming.py holds the two equal).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tasks.dataset.tokens import N_TOKENS


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
        from tasks.learning.model import online_orders, takes_online

        self._online = takes_online(self.model)
        self._orders = online_orders(self.model) if self._online else ()
        self._call = _compiled(self.model, self._online)

    @classmethod
    def from_registry(
        cls, name: str = "heapcast-next-call", alias: str = "champion", context: int = 100
    ) -> StreamingPredictor:
        """Load `models:/<name>@<alias>` from the tracking store MLflow is configured for."""
        import mlflow.keras

        import tasks.learning.model  # noqa: F401  (registers heapcast's custom layers)

        return cls(mlflow.keras.load_model(f"models:/{name}@{alias}"), context)

    # --- state ----------------------------------------------------------------------------------

    def _thread(self, thread: Hashable) -> _Thread:
        t = self._threads.get(thread)
        if t is None:
            from tasks.learning.model import ONLINE_FEATURES
            from tasks.learning.online import OnlineState

            t = _Thread(
                tokens=np.zeros(self.context, np.int32),
                online=np.zeros((self.context, ONLINE_FEATURES), np.int32)
                if self._online
                else None,
                state=OnlineState(self._orders) if self._online else None,
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
            from tasks.learning.model import online_row

            t.state.push(int(token))
            t.online[:-1] = t.online[1:]
            t.online[-1] = online_row(t.state)
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
    """The model's last-position output as one traced graph for any batch and window width.

    Called eagerly, a recurrent model runs its time loop op by op in Python (seconds per call);
    traced once with shapes left open, each prediction is one graph execution."""
    import tensorflow as tf

    tokens = tf.TensorSpec([None, None], tf.int32)
    if online:
        from tasks.learning.model import ONLINE_FEATURES

        spec = {"tokens": tokens, "online": tf.TensorSpec([None, None, ONLINE_FEATURES], tf.int32)}
    else:
        spec = tokens

    @tf.function(input_signature=[spec])
    def last(x):
        return model(x, training=False)[:, -1, :]

    return last


def predict_window(model, tokens: np.ndarray, context: int = 100) -> np.ndarray:
    """Batch form of one streaming prediction: float32 [64] after the last of `tokens` (one
    thread's calls from its first), from its last `context` tokens and their online features."""
    from tasks.learning.model import online_feature_matrix, online_orders, takes_online
    from tasks.learning.sequences import TokenRun

    tokens = np.asarray(tokens, np.uint8)
    width = min(context, len(tokens))
    x: object = tokens[None, -width:].astype(np.int32)
    if takes_online(model):
        run = TokenRun("stream", "thread", tokens, np.array([0, len(tokens)]))
        online = online_feature_matrix(run, online_orders(model))
        x = {"tokens": x, "online": online[None, -width:].astype(np.int32)}
    return np.asarray(model(x, training=False))[0, -1, :]
