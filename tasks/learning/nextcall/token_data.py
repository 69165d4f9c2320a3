"""Training and evaluation batches cut from a run's flat token array, for any Keras backend.

The data in memory is the trace itself (uint8, one byte per call) plus an int64 start per
chunk: a batch is cut out of the flat array with one numpy gather of `starts[:, None] + range`,
so neither the article's window matrix (context x trace) nor one Python step per sample exists.
Training batches are a `keras.utils.PyDataset` (what Keras feeds every backend from, with
background workers); evaluation batches a plain generator of numpy arrays.
"""

from __future__ import annotations

from collections.abc import Iterator

import keras
import numpy as np

from tasks.dataset.token_runs import TokenRun
from tasks.learning.nextcall.chunks import eval_chunks, train_chunks, window_starts
from tasks.learning.nextcall.stack_input import StackInput
from tasks.learning.stack_encoder import drop_stacks


def _padded(a: np.ndarray, pad: int) -> np.ndarray:
    """`a` with `pad` zero rows after it, so a chunk near the end cuts without a bounds check."""
    return np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])


def _checked_features(features: np.ndarray | None, run: TokenRun, pad: int) -> np.ndarray | None:
    if features is None:
        return None
    if len(features) != len(run.tokens):
        raise ValueError(f"{len(features)} feature rows for {len(run.tokens)} tokens")
    return _padded(np.asarray(features, np.uint8), pad)


def _checked_stacks(stacks: StackInput | None, run: TokenRun, pad: int) -> StackInput | None:
    if stacks is None:
        return None
    if len(stacks.rows) != len(run.tokens):
        raise ValueError(f"{len(stacks.rows)} stack rows for {len(run.tokens)} tokens")
    return stacks.padded(pad)


def _inputs(tokens: np.ndarray, feats: np.ndarray | None, frames: np.ndarray | None):
    """A batch's x as the model takes it: tokens alone, or (tokens, [features], [frames])."""
    extra = [a for a in (feats, frames) if a is not None]
    return (tokens, *extra) if extra else tokens


class ChunkBatches(keras.utils.PyDataset):
    """Batches of chunk starts, cut by `cut(starts, extra)`, as Keras's fit expects them.

    repeat (training): every batch is full and an epoch is `steps` batches (one pass unless
    set); the chunks are reshuffled after each pass over them (a pass may span epochs), so batch
    j of the whole training is the same whatever the epoch length.
    Otherwise (validation): one pass in order, the last batch partial.
    """

    def __init__(
        self,
        starts: np.ndarray,
        extra: np.ndarray | None,
        cut,
        batch_size: int,
        *,
        shuffle: bool,
        repeat: bool,
        seed: int,
    ) -> None:
        # two threads cut the next batches while the backend trains on this one, so cutting a
        # batch never waits for a step (the throughput with and without: docs/learning-nextcall.md)
        super().__init__(workers=2, use_multiprocessing=False, max_queue_size=8)
        self.starts, self.extra, self.cut = starts, extra, cut
        self.batch_size, self.shuffle, self.repeat = batch_size, shuffle, repeat
        self.seed = seed
        full = len(starts) // batch_size
        self.per_pass = full if repeat else -(-len(starts) // batch_size)
        self.steps = self.per_pass  # an epoch's batches (training sets steps_per_epoch here)
        self.epoch = 0
        self._order = np.arange(len(starts))  # validation's, and training's unshuffled
        self._orders: dict[int, np.ndarray] = {}  # training: the passes' orders, cached

    def __len__(self) -> int:
        return self.steps if self.repeat else self.per_pass

    def _order_of_pass(self, p: int) -> np.ndarray:
        """Pass p's order of the chunks: drawn from (seed, p) alone, so the worker threads that
        cut batches at once, in any order, and a resumed training all get the same one."""
        if not (self.shuffle and len(self.starts)):
            return self._order
        order = self._orders.get(p)
        if order is None:
            order = np.random.default_rng((self.seed, p)).permutation(len(self.starts))
            self._orders = {p: order, **{q: o for q, o in self._orders.items() if q == p - 1}}
        return order

    def __getitem__(self, idx: int):
        if self.repeat:
            j = self.epoch * self.steps + idx  # the batch's place in the whole training
            p, j = divmod(j, max(self.per_pass, 1))
            sel = self._order_of_pass(p)[j * self.batch_size : (j + 1) * self.batch_size]
        else:
            sel = self._order[idx * self.batch_size : (idx + 1) * self.batch_size]
        return self.cut(self.starts[sel], None if self.extra is None else self.extra[sel])

    def on_epoch_end(self) -> None:
        self.epoch += 1


def sequence_dataset(
    run: TokenRun,
    context: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    features: np.ndarray | None = None,
    stacks: StackInput | None = None,
) -> tuple[ChunkBatches, int]:
    """(batches of (x [B, c] int32, y [B, c] int32, weight [B, c] float32), number of chunks).

    `features` (uint8 [n_tokens, F], aligned with run.tokens: row i describes token i+1, e.g.
    the n-gram features of tasks.learning.nextcall.model.NGramTable): x becomes (tokens, features [B, c, F]).
    `stacks` (row i: call i's stack): x gains frames [B, c, depth, FRAME_PIECES], gathered per
    batch; in training (`repeat`) whole stacks and pieces dropped (stack_encoder.drop_stacks),
    the same drops for the same batch.

    Chunks come from tasks.learning.nextcall.chunks.train_chunks: a loss at every position of every chunk,
    weight 0 only where an end-aligned chunk repeats targets of the chunk before it. With
    `repeat`, batches are full and the stream goes on across epochs (see ChunkBatches).
    """
    starts, first = train_chunks(run, context)
    tokens = _padded(run.tokens, context + 1)
    feats = _checked_features(features, run, context + 1)
    held = _checked_stacks(stacks, run, context + 1)
    offsets = np.arange(context + 1, dtype=np.int64)
    positions = np.arange(context, dtype=np.int32)

    def cut(s, f):
        idx = s[:, None] + offsets[None, :]
        chunk = tokens[idx].astype(np.int32)
        weight = (positions[None, :] >= f[:, None]).astype(np.float32)
        ft = None if feats is None else feats[idx[:, :-1]].astype(np.int32)
        frames = None if held is None else held.frames(idx[:, :-1])
        if frames is not None and repeat:
            drop_stacks(frames, np.random.default_rng((seed, int(s[0]), len(s))))
        return _inputs(chunk[:, :-1], ft, frames), chunk[:, 1:], weight

    order = {"shuffle": shuffle, "repeat": repeat, "seed": seed}
    return ChunkBatches(np.asarray(starts, np.int64), first, cut, batch_size, **order), len(starts)


def windows_dataset(
    run: TokenRun,
    context: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    max_windows: int | None = None,
) -> tuple[ChunkBatches, int]:
    """The article's formulation: (x [B, c] int32, y [B] int32), one window per label.

    Still cut from the flat array (one start per window), never a materialised matrix.
    `max_windows` keeps an evenly spaced sample (validation).
    """
    starts = window_starts(run, context)
    if max_windows is not None and len(starts) > max_windows:
        starts = starts[np.linspace(0, len(starts) - 1, max_windows).astype(np.int64)]
    tokens = _padded(run.tokens, context + 1)
    offsets = np.arange(context, dtype=np.int64)

    def cut(s, _):
        x = tokens[s[:, None] + offsets[None, :]].astype(np.int32)
        return x, tokens[s + context].astype(np.int32)

    order = {"shuffle": shuffle, "repeat": repeat, "seed": seed}
    return ChunkBatches(np.asarray(starts, np.int64), None, cut, batch_size, **order), len(starts)


def eval_batches(
    run: TokenRun,
    context: int,
    batch_size: int,
    features: np.ndarray | None = None,
    stacks: StackInput | None = None,
) -> tuple[Iterator, np.ndarray, np.ndarray]:
    """Evaluation chunks (tasks.learning.nextcall.chunks.eval_chunks) as (x [B, 2c], y [B, 2c]) int32.

    Returns the batches and each chunk's scored output range (lo, hi). Inputs beyond a thread's
    end are padding or the next thread: the model is causal and those outputs are not scored.
    `features` (uint8 [n_tokens, F], row i describing token i+1, e.g. the online counter's
    answers over the whole thread so far): x becomes (tokens, features [B, 2c, F]); `stacks`
    (row i: call i's stack): x gains frames [B, 2c, depth, FRAME_PIECES].
    """
    starts, lo, hi = eval_chunks(run, context)
    width = 2 * context
    tokens = _padded(run.tokens, width + 1)
    feats = _checked_features(features, run, width + 1)
    held = _checked_stacks(stacks, run, width + 1)
    offsets = np.arange(width + 1, dtype=np.int64)

    def batches():
        for b in range(0, len(starts), batch_size):
            idx = np.asarray(starts[b : b + batch_size], np.int64)[:, None] + offsets[None, :]
            chunk = tokens[idx].astype(np.int32)
            ft = None if feats is None else feats[idx[:, :-1]].astype(np.int32)
            frames = None if held is None else held.frames(idx[:, :-1])
            yield _inputs(chunk[:, :-1], ft, frames), chunk[:, 1:]

    return batches(), lo, hi
