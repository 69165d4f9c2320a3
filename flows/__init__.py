"""heapcast's Prefect flows: composition of tasks only."""

from tasks.core.config import apply_embedded_defaults

apply_embedded_defaults()
