"""The former names of the layer's policies (issue 46), the one table of them in Python.

`largest` and `pools` were named `seed002` and `seed001`, after the seed studies they came
from. A former name is still accepted wherever a user or stored data gives one: a what-if
policy's kind (tasks.whatif.policies), the layer's options (tasks.whatif.policy_core), `heapcast
layer --policy`, an allocator candidate's name (`layer-<old>` is `layer-<new>`,
tasks.allocators.config), a stored night's tables. The layer (C) has its own table in
native/layers/layer.c. Standard library only: the CLI reads it at once.
"""

from __future__ import annotations

RENAMED_POLICIES = {"seed002": "largest", "seed001": "pools"}


def current_policy(name: str) -> str:
    """A policy's name as it is now (a former name mapped; any other kept)."""
    return RENAMED_POLICIES.get(name, name)
