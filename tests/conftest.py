"""Settings every test shares: no telemetry, Prefect's home inside a temp folder, one harness."""

from __future__ import annotations

import os
import tempfile

import pytest

# Set before anything imports prefect or mlflow: there is no internet here, telemetry would
# only produce errors, and a test must never write into the user's ~/.prefect.
_HOME = tempfile.mkdtemp(prefix="heapcast-test-prefect-")
os.environ.setdefault("PREFECT_HOME", _HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test API for the whole session (its start costs ~20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield
