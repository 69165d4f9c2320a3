"""A call's stack as a network reads it (issue 65): the Keras encoder over frame tokens
(tasks/dataset/frame_tokens.py) that the questions' network (tasks/learning/questions/network.py)
and the next-call network (tasks/learning/nextcall/model.py) share, and the dropout their
training applies to the stacks.

    stack_encoder(frames, depth)   [batch, calls, depth, FRAME_PIECES] ids -> [batch, calls, units]
    drop_stacks(frames, rng)       training only: whole stacks and single pieces set to padding
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from tasks.dataset.frame_tokens import FRAME_VOCABULARY

# Training only: a call's stack is dropped whole (all padding) with STACK_DROPOUT, each of its
# pieces with PIECE_DROPOUT, so that a network learns to answer from the words it recognises
# and without a stack; a program never trained on is mostly words it never saw.
STACK_DROPOUT = 0.3
PIECE_DROPOUT = 0.15


def drop_stacks(frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`frames` [..., calls, depth, FRAME_PIECES] with STACK_DROPOUT of its stacks and
    PIECE_DROPOUT of its pieces set to padding, in place (a batch's own gathered copy)."""
    frames[rng.random(frames.shape[:-2]) < STACK_DROPOUT] = 0
    frames[rng.random(frames.shape) < PIECE_DROPOUT] = 0
    return frames


@keras.saving.register_keras_serializable(package="heapcast")
class FramePooling(layers.Layer):
    """[..., pieces, width] embeddings and their [..., pieces] token ids -> [..., width]: each
    frame's mean embedding over its pieces, padding (id 0) left out; a frame of padding only
    is zeros."""

    def call(self, embedded, ids):
        present = ops.expand_dims(ops.cast(ops.greater(ids, 0), embedded.dtype), -1)
        total = ops.sum(embedded * present, axis=-2)
        return total / ops.maximum(ops.sum(present, axis=-2), 1.0)


def stack_encoder(frames, depth: int, width: int = 16, units: int = 32):
    """frames [batch, calls, depth, FRAME_PIECES] (int32 token ids) -> [batch, calls, units]:
    each piece embedded (its sub-word's meaning, shared by every program), pooled per frame,
    then the `depth` frames, innermost first, read together by one dense layer (a weight per
    depth: where a frame sits in the stack matters). Reads only the call's own stack: causal.
    The embeddings start at zero: a word no training call had stays zero, as padding, rather
    than a random direction the network reads as a meaning."""
    embedded = layers.Embedding(
        FRAME_VOCABULARY, width, embeddings_initializer="zeros", name="frame_pieces"
    )(frames)
    per_frame = FramePooling(name="frame_pooling")(embedded, frames)
    flat = layers.Reshape((-1, depth * width), name="stack_frames")(per_frame)
    # tanh, not relu: at a stack of padding (zeros) a relu's gradient is 0 and, the embeddings
    # starting at zero, the branch would never learn
    return layers.Dense(units, activation="tanh", name="stack")(flat)
