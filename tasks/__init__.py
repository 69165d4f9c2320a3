"""heapcast's tasks: the work of every stage, and the Prefect tasks that wrap it."""

from tasks.config import apply_embedded_defaults

apply_embedded_defaults()
