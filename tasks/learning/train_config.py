"""The training job's settings (configs/train.yaml), as strict pydantic models.

No TensorFlow here: the flow, the tests and the benchmark read the config cheaply.

The split decides honesty; its rule in full is docs/learning.md#the-split. In short: `train` runs
feed the model and the baselines' tables; `evaluation` runs (another input of the same workloads,
"unseen_runs") are never seen in training, early stopping or order selection; `validation` is a
third run, or the last `validation_fraction` of each thread of a workload with two runs;
`heldout_workloads` and `heldout_programs` are never trained on ("heldout_workloads",
"unseen_programs"). Naming a held-out program that is also trained on, or one no workload runs, is
an error before training starts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from tasks.core.config import (
    CONFIG_DIR,
    ConfigError,
    StrictModel,
    default_root,
    format_validation_error,
    load_config,
)

DEFAULT_CONFIG = CONFIG_DIR / "train.yaml"
QUICK_CONFIG = CONFIG_DIR / "train-quick.yaml"


class RunSplit(StrictModel):
    """Explicit runs of one workload; any list left empty follows the default rule."""

    train: list[str] = Field(default_factory=list)
    validation: list[str] = Field(default_factory=list)
    evaluation: list[str] = Field(default_factory=list)


class DataConfig(StrictModel):
    """Which workloads and runs go where."""

    workloads: list[str] | None = None  # None: every workload of the dataset but the held-out ones
    heldout_workloads: list[str] = Field(default_factory=list)
    heldout_programs: list[str] = Field(default_factory=list)
    # where workloads' programs come from (None: configs/workloads.yaml); a workload of the
    # dataset that the catalog does not list (an ad-hoc trace) is a program of its own
    catalog: str | None = None
    runs: dict[str, RunSplit] = Field(default_factory=dict)  # per-workload explicit split
    validation_fraction: float = Field(default=0.1, gt=0.0, lt=0.5)
    max_train_tokens: int | None = Field(default=None, gt=0)  # cap over all train runs
    max_validation_tokens: int | None = Field(default=None, gt=0)  # cap per validation run
    max_eval_tokens: int | None = Field(default=None, gt=0)  # cap per evaluation/held-out run
    # frames of each call's stack read for the questions' network, innermost first (as tokens of
    # their names: tasks/dataset/frame_tokens.py); the network reads as many as it is given
    frame_depth: int = Field(default=8, ge=1, le=64)
    # read each call's stack with the runs' tokens (TokenRun.stacks), what a next-call network
    # with model.frame_depth reads: set for it (TrainConfig), so nobody needs to write it
    call_stacks: bool = False
    # Fewer scored positions than this on the evaluation runs (the unseen-runs table the
    # champion is chosen on) is broken data, not a night's result: nothing is trained or
    # registered, and the night's summary says why. 1,000 positions put a top-1 within about
    # +-3 points (95%); every real input, the quick ones included, has far more. 0: no minimum.
    min_eval_positions: int = Field(default=1000, ge=0)

    @model_validator(mode="after")
    def _disjoint(self) -> DataConfig:
        if self.workloads is not None:
            both = set(self.workloads) & set(self.heldout_workloads)
            if both:
                raise ValueError(f"workloads {sorted(both)} are both trained on and held out")
        for w, split in self.runs.items():
            seen: dict[str, str] = {}
            for part in ("train", "validation", "evaluation"):
                for r in getattr(split, part):
                    if r in seen:
                        raise ValueError(f"run {w}/{r} is in both {seen[r]} and {part}")
                    seen[r] = part
        return self


class ModelConfig(StrictModel):
    """The network. The article's: kind lstm, units [128, 64], one-hot embedding of 64."""

    kind: Literal["lstm", "gru"] = "lstm"
    units: list[int] = Field(default_factory=lambda: [128, 64], min_length=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)  # input dropout of each recurrent layer
    embedding: Literal["onehot"] = "onehot"  # frozen identity embedding, as in the article
    # hybrid (sequence mode): besides each token the network gets the back-off n-gram's answer
    # over exact contexts of orders 1..ngram_order from the training runs (leave-one-out on
    # the training positions; tasks/learning/nextcall/model.py, NGramFeatures); the table is inside the model
    ngram_features: bool = False
    ngram_order: int = Field(default=16, ge=1, le=16)  # orders > 9 use a 61-bit hash of the context
    # Cross-fitting: this share of the training positions (in blocks of ten contexts) gets its
    # n-gram features from a table of the OTHER training workloads only, so the network also sees
    # what those features look like on a program they never saw, as on the unseen-programs table
    # (0: every position leave-one-out from the whole table). Needs two training workloads.
    ngram_crossfit: float = Field(default=0.0, ge=0.0, le=1.0)
    # A copy path per feature source (n-gram, online): gate * onehot(source's top-1) added to the
    # logits (tasks/learning/nextcall/model.py _copy_network). Hybrids only.
    copy_path: bool = False
    # online (sequence mode): besides each token the network gets the online counter's answer
    # (tasks/learning/counters/online.py) over the thread's WHOLE history so far, beyond the context:
    # top-1, the order it answered from, count and share buckets. Causal by construction (only
    # calls before each position are counted), so train, evaluation and streaming compute it
    # the same way; the registered model takes it as a second input (`online`).
    online_features: bool = False
    online_orders: list[int] = Field(default_factory=lambda: [12, 8, 6, 4, 3, 2, 1], min_length=1)
    # How many of the online counter's candidates, best first, reach the logits through a copy
    # path each (1: its top-1 only). With 5 the network can rank the counter's whole top-5, which
    # its own top-5 otherwise trails on programs it never saw. Needs online_features, copy_path.
    online_ranks: int = Field(default=1, ge=1, le=5)
    # stack (sequence mode, hybrids): besides each call the network reads the first
    # `frame_depth` frames of its stack, innermost first, as sub-word tokens of their names
    # (tasks/dataset/frame_tokens.py, tasks/learning/stack_encoder.py); a free reads its block's
    # allocation's. Position t reads the stacks of calls <= t only. 0: no stack input.
    frame_depth: int = Field(default=0, ge=0, le=32)

    @model_validator(mode="after")
    def _orders_longest_first(self) -> ModelConfig:
        o = self.online_orders
        if any(k < 1 for k in o) or sorted(set(o), reverse=True) != o:
            raise ValueError(f"online_orders {o}: distinct orders >= 1, longest first")
        if self.online_ranks > 1 and not (self.online_features and self.copy_path):
            raise ValueError(
                f"online_ranks {self.online_ranks}: the counter's further candidates reach the "
                "network through copy paths: set online_features and copy_path true, or 1"
            )
        return self


class NgramConfig(StrictModel):
    max_order: int = Field(default=16, ge=1, le=32)  # orders 1..max_order are tried on validation
    smoothing: float = Field(default=0.1, gt=0.0)  # add-epsilon on counts, for a finite log-loss


class QuestionsConfig(StrictModel):
    """The network of the allocator's two questions (tasks/learning/questions/network.py): reuse
    at a free, lifetime at an allocation. Trained beside the next-call model on the same
    training runs (their events, capped as data.max_eval_tokens caps each run)."""

    network: bool = True  # False: the questions are answered by the counters alone
    units: int = Field(default=48, ge=1)
    epochs: int = Field(default=2, ge=1)
    batch_size: int = Field(default=32, ge=1)  # windows of question_network.WINDOW calls
    learning_rate: float = Field(default=3e-3, gt=0.0)
    # a sample of the training runs' calls (whole windows), for the night's time
    max_train_calls: int | None = Field(default=None, gt=0)


class TrainConfig(StrictModel):
    """configs/train.yaml."""

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ngram: NgramConfig = Field(default_factory=NgramConfig)
    questions: QuestionsConfig = Field(default_factory=QuestionsConfig)
    mode: Literal["sequence", "windows"] = "sequence"
    context: int = Field(default=100, ge=2)
    optimizer: Literal["adam", "rmsprop", "sgd"] = "adam"
    learning_rate: float = Field(default=1e-3, gt=0.0)
    # constant, or cosine decay from learning_rate to lr_floor * learning_rate over all the
    # planned steps (epochs x steps per epoch); early stopping may end it sooner
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_floor: float = Field(default=0.05, ge=0.0, le=1.0)
    clipnorm: float | None = Field(default=None, gt=0.0)  # per-step gradient norm clip
    # sequence mode: a training chunk is this many contexts long (1: `context` tokens). A chunk
    # starts with an empty state, so longer chunks give more of the positions a long history;
    # evaluation chunks are unchanged (tasks.learning.nextcall.chunks.eval_chunks).
    train_chunk_contexts: int = Field(default=1, ge=1)
    batch_size: int = Field(default=64, ge=1)
    # on a GPU (tasks/learning/nextcall/backend.py), the batch it prefers instead of batch_size:
    # small batches leave a GPU idle (the throughput by batch: docs/gpu.md); None: batch_size
    # there too
    gpu_batch_size: int | None = Field(default=1024, ge=1)
    epochs: int = Field(default=20, ge=1)
    steps_per_epoch: int | None = Field(default=None, ge=1)  # None: one pass over the chunks
    validation_windows: int = Field(default=20000, ge=1)  # windows mode: validation sample size
    eval_batch_size: int = Field(default=64, ge=1)
    patience: int = Field(default=3, ge=1)
    checkpoint_dir: str | None = None  # None: <root>/checkpoints (local roots) else .checkpoints
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _stacks_read_for_the_network(cls, values: Any) -> Any:
        """A network that reads each call's stack (model.frame_depth) gets the runs read with
        their stacks (data.call_stacks), unasked, wherever a config is validated (a YAML file,
        the night's overrides); model_copy does not validate, so code that copies a config into
        one that reads the stack sets both."""
        if not isinstance(values, dict):
            return values
        model, data = values.get("model") or {}, values.get("data") or {}
        depth = model.get("frame_depth") if isinstance(model, dict) else model.frame_depth
        if not depth:
            return values
        if isinstance(data, dict):
            return {**values, "data": {**data, "call_stacks": True}}
        return {**values, "data": data.model_copy(update={"call_stacks": True})}

    def fingerprint(self) -> str:
        """Hash of every setting that shapes the trained weights (not where checkpoints go)."""
        payload = self.model_dump(mode="json", exclude={"checkpoint_dir"})
        if not payload["model"]["frame_depth"]:  # a config without the stack hashes as before
            del payload["model"]["frame_depth"]
        if not payload["data"]["call_stacks"]:
            del payload["data"]["call_stacks"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def merged_settings(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with nested `overrides` merged on top (a dict merges, anything else replaces)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged_settings(out[key], value)
        else:
            out[key] = value
    return out


def load_train_config(
    path: str | Path = DEFAULT_CONFIG, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """configs/train.yaml (or `path`), with nested `overrides` merged on top, validated."""
    cfg = load_config(TrainConfig, path)
    if not overrides:
        return cfg

    try:
        return TrainConfig.model_validate(merged_settings(cfg.model_dump(), overrides))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, f"{path} with overrides")) from None


class TrainParams(StrictModel):
    """What a run of the flow is given; the training settings come from the config file."""

    root: str = Field(default_factory=default_root, description="data root (folder or s3:// URL)")
    config: str = Field(
        default=str(DEFAULT_CONFIG), description="training YAML (configs/train.yaml)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="nested settings merged over the YAML, e.g. {'epochs': 2}"
    )
