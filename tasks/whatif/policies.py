"""The allocator-cache policies of the what-if stage, as strict pydantic configs.

Each policy is one frozen model with a `kind` literal; `PolicyConfig` is their union and
`policy_from_dict` validates a plain dict (a YAML entry) into the right one. Unknown fields,
N = 0, a budget <= 0 and the like are validation errors that name the field.

Every caching policy but seed002 shares the FIT RULE of the simulator (tasks/whatif/simulate.py):
a cached block of b bytes can serve a request of s bytes only if both are in the same size class
(the token rule: min(bit_length, 31)) and b >= s, so at most half of a block is ever wasted.
Blocks below `min_size` are never cached and requests below it never look in the cache.

- none: every call goes to the system allocator (hit rate 0).
- seed002: the N largest recently freed blocks (/work/shared/seeds/002), with exactly the
  rules of heapcast's LD_PRELOAD layer with policy=seed002 (native/layers/layer.c), which works
  on glibc's USABLE sizes (malloc_usable_size: a mmapped block of s bytes has its mapping less
  16 bytes usable, e.g. 303088 for 300000). A freed block the layer handed out (requested
  >= min_size) whose usable size u >= min_size is kept if fewer than N
  are cached, or if u is at least the smallest cached usable size, that block then released
  (ties: the oldest smallest goes). A request of s >= min_size bytes takes the most recently
  cached block that fits, in any size class: u >= s and u - s < s + 4096; an aligned request
  (posix_memalign & co., valloc) only a block whose address has the alignment (in the traced
  run: glibc's mmapped blocks are 16 mod 4096). `min_size` defaults to glibc's mmap threshold
  (128 KiB): the blocks seed 002 is about.
- seed001: per-class pools with timed eviction (/work/shared/seeds/001): every freed block is
  kept; a block cached more than `decay_ns` ns of trace time ago is released at its process's
  first call after that (lazily, as the seed's eviction queue does without a timer thread).
- lru: per-class free lists under a byte budget per process: a freed block is kept (if it is
  not larger than the budget) and the least recently cached blocks are released until the
  cached bytes are within the budget.
- guided: lru plus a prediction per freed block (one bool per event, see
  tasks/whatif/guided.py: "is the block's class requested within the next k calls of its
  thread?"), used by `mode`:
  - `priority` (the default): the prediction can only add to what lru knows. Every freed block
    is cached as by lru (if not larger than the budget) and carries the prediction made at its
    free; over the budget, UNPREDICTED blocks are released first (least recently cached first),
    predicted ones only when no unpredicted block is left (least recently cached first among
    them). `ttl_calls` (the prediction's horizon): a predicted block not reused within that many
    calls of its process has outlived its prediction and is demoted, as if freed unpredicted
    then (it joins the unpredicted blocks, most recent of them); None: never demoted. All
    predictions true or all false: exactly lru.
  - `admit`: a freed block is kept only where the prediction says so, else released at once;
    `ttl_calls` optionally releases a block not reused within that many calls of its process.
    A block reused later than the horizon is a miss, so on real traces this throws away most
    of lru's hits: kept to compare with.
- belady: a realisable clairvoyant policy: a freed block is kept only if its class is requested
  again in its process; over the budget, blocks of the class whose next request is farthest in
  the future are released first (oldest first within the class); when a class will never be
  requested again its pool is released.
- oracle: not a policy but an upper bound (tasks/whatif/oracle.py): no policy whose
  time-weighted mean of idle bytes is <= `budget` has a higher hit rate.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, field_validator

from tasks.core.config import StrictModel

MMAP_THRESHOLD = 128 * 1024  # glibc's default M_MMAP_THRESHOLD (the dynamic threshold ignored)


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


class Seed002Config(_Policy):
    kind: Literal["seed002"] = "seed002"
    n: int = Field(default=4, ge=1, le=4096)
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


class Seed001Config(_Policy):
    kind: Literal["seed001"] = "seed001"
    decay_ns: int = Field(default=1_000_000, gt=0)
    min_size: int = Field(default=0, ge=0)

    @property
    def param(self) -> float:
        return float(self.decay_ns)


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
    | Seed002Config
    | Seed001Config
    | LruConfig
    | GuidedConfig
    | BeladyConfig
    | OracleConfig,
    Field(discriminator="kind"),
]
POLICY_KINDS = ("none", "seed002", "seed001", "lru", "guided", "belady", "oracle")
_ADAPTER: TypeAdapter[Any] = TypeAdapter(PolicyConfig)


def policy_from_dict(d: dict[str, Any]) -> _Policy:
    """Validate {"kind": ..., field: value} into its config (pydantic.ValidationError names the
    field that is wrong)."""
    return _ADAPTER.validate_python(d)
