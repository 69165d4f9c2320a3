"""What the flow tests share: the tiny training every flow test trains with, and the way they
read back what a flow published to Prefect."""

from __future__ import annotations

import asyncio

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

# A training of a few steps on a tiny network (overrides of configs/train-quick.yaml).
TINY_TRAINING = {
    "context": 8,
    "model": {"units": [4]},
    "batch_size": 8,
    "epochs": 1,
    "steps_per_epoch": 2,
    "ngram": {"max_order": 3},
}
# The same with workload `beta` held out, scored as an unseen program.
TINY_TRAINING_BETA_HELD_OUT = {**TINY_TRAINING, "data": {"heldout_workloads": ["beta"]}}


def latest_artifact(key: str) -> str:
    """The data of the newest Prefect artifact with this key."""

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )

    return asyncio.run(read())[0].data
