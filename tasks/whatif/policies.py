"""The allocator-cache policies of the what-if stage, as strict pydantic configs.

Each policy is one frozen model with a `kind` literal; `PolicyConfig` is their union and
`policy_from_dict` validates a plain dict (a YAML entry) into the right one. Unknown fields,
N = 0, a budget <= 0 and the like are validation errors that name the field.

The fit rule and each policy (none, largest, pools, layer_guided, lru, guided, belady, oracle):
docs/whatif-policies.md#the-policies. largest, pools and layer_guided are the policies
heapcast's layer runs: the simulator computes them with the layer's own decisions, the policy core
(tasks/whatif/policy_core.py, `layer_policy` maps a config to the layer's options).

"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, field_validator

from tasks.core.config import StrictModel
from tasks.core.policy_names import current_policy

MMAP_THRESHOLD = 128 * 1024  # glibc's default M_MMAP_THRESHOLD (the dynamic threshold ignored)


def _current_kind(d: Any) -> Any:
    if isinstance(d, dict) and isinstance(d.get("kind"), str):
        return {**d, "kind": current_policy(d["kind"])}
    return d


class _Policy(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def param(self) -> float:
        """The value the sweep varies (the x of its curve before simulation)."""
        return 0.0

    @property
    def label(self) -> str:
        return self.kind  # type: ignore[attr-defined]


class NoneConfig(_Policy):
    kind: Literal["none"] = "none"


class LargestConfig(_Policy):
    """The layer's policy=largest (its options n, min, peak, proof)."""

    kind: Literal["largest"] = "largest"
    n: int = Field(default=4, ge=1, le=64)  # the layer's n (at most 64)
    min_size: int = Field(default=MMAP_THRESHOLD, ge=0)
    # the layer's bound on live + kept, in % over the live blocks' peak (layer.c `peak`, default
    # 4); None: no bound (peak=off)
    peak: int | None = Field(default=4, ge=0, le=1000)
    # the layer's proof (layer.c `proof`, default 2): nothing is kept until that many requests
    # could have reused a block passed on before (0: kept from the start)
    proof: int = Field(default=2, ge=0, le=1 << 20)

    @property
    def param(self) -> float:
        return float(self.n)


class PoolsConfig(_Policy):
    """The layer's policy=pools: every block it handed out kept (each thread's last one in its
    front), given back after `decay_ns` idle (the layer's decay, in ms there)."""

    kind: Literal["pools"] = "pools"
    decay_ns: int = Field(default=1_000_000_000, gt=0)
    min_size: int = Field(default=MMAP_THRESHOLD, ge=0)
    peak: int | None = Field(default=4, ge=0, le=1000)  # as LargestConfig.peak
    proof: int = Field(default=2, ge=0, le=1 << 20)  # as LargestConfig.proof

    @property
    def param(self) -> float:
        return float(self.decay_ns)


class LayerGuidedConfig(_Policy):
    """The layer's policy=guided: keep a freed block when the thread's online counter (topk,
    horizon) says its class comes soon, or, `table`, when the registered version's class table
    says so (its scores are handed to the simulator: `simulate(..., class_scores=)`); `regret`:
    the process's regrets overrule the counter. Given back after `decay_ns` idle."""

    kind: Literal["layer_guided"] = "layer_guided"
    decay_ns: int = Field(default=1_000_000_000, gt=0)
    topk: int = Field(default=2, ge=1, le=64)
    horizon: int = Field(default=4, ge=1, le=64)
    regret: bool = False
    table: bool = False
    min_size: int = Field(default=MMAP_THRESHOLD, ge=0)
    peak: int | None = Field(default=4, ge=0, le=1000)
    proof: int = Field(default=2, ge=0, le=1 << 20)

    @property
    def param(self) -> float:
        return float(self.decay_ns)

    @property
    def label(self) -> str:
        return (
            "layer_guided" + ("_table" if self.table else "") + ("_regret" if self.regret else "")
        )


LAYER_KINDS = ("largest", "pools", "layer_guided")  # what the layer runs (the policy core)


class LruConfig(_Policy):
    kind: Literal["lru"] = "lru"
    budget: int = Field(default=64 << 20, gt=0)  # bytes cached per process at most
    min_size: int = Field(default=0, ge=0)

    @property
    def param(self) -> float:
        return float(self.budget)


class GuidedConfig(_Policy):
    kind: Literal["guided"] = "guided"
    budget: int = Field(default=64 << 20, gt=0)
    ttl_calls: int | None = Field(default=None, ge=1)
    min_size: int = Field(default=0, ge=0)
    mode: Literal["priority", "admit"] = "priority"
    horizons: tuple[int, ...] | None = Field(default=None, min_length=1, max_length=7)

    @field_validator("horizons")
    @classmethod
    def _ascending(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and (v[0] < 1 or any(b <= a for a, b in zip(v, v[1:]))):
            raise ValueError("horizons must be ascending calls >= 1")
        return v

    @property
    def param(self) -> float:
        return float(self.budget)

    @property
    def label(self) -> str:
        return "guided" if self.mode == "priority" else f"guided_{self.mode}"


class BeladyConfig(_Policy):
    kind: Literal["belady"] = "belady"
    budget: int = Field(default=64 << 20, gt=0)
    min_size: int = Field(default=0, ge=0)

    @property
    def param(self) -> float:
        return float(self.budget)


class OracleConfig(_Policy):
    kind: Literal["oracle"] = "oracle"
    budget: float = Field(default=float(64 << 20), gt=0)  # time-weighted mean idle bytes

    @property
    def param(self) -> float:
        return float(self.budget)


PolicyConfig = Annotated[
    NoneConfig
    | LargestConfig
    | PoolsConfig
    | LayerGuidedConfig
    | LruConfig
    | GuidedConfig
    | BeladyConfig
    | OracleConfig,
    Field(discriminator="kind"),
    BeforeValidator(_current_kind),  # a former kind (tasks.core.policy_names) is its policy now
]
POLICY_KINDS = ("none", "largest", "pools", "layer_guided", "lru", "guided", "belady", "oracle")
_ADAPTER: TypeAdapter[Any] = TypeAdapter(PolicyConfig)


def policy_from_dict(d: dict[str, Any]) -> _Policy:
    """Validate {"kind": ..., field: value} into its config (pydantic.ValidationError names the
    field that is wrong)."""
    return _ADAPTER.validate_python(d)
