"""The library lines of `make run` dropped, precisely (tasks/core/quiet.py).

GIVEN a fresh Python that imported heapcast (`import tasks`)
WHEN  MLflow creates a new embedded store, Prefect's own logger announces and stops its temporary
      server, and a Keras optimizer that was never built is given saved variables; and the same
      loggers and warnings say something else
THEN  none of the three lines is printed, and the other lines of the same loggers and the other
      warnings still are.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.core.config import PROJECT_DIR

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow

CHILD = """
import warnings, logging
import tasks  # noqa: F401  (heapcast's start-up settings)
from mlflow import MlflowClient
from prefect.logging.configuration import setup_logging
from prefect.server.api.server import subprocess_server_logger
import keras, numpy as np

setup_logging()  # as a flow run does: Prefect's INFO lines on the console

MlflowClient({uri!r}).search_experiments()  # a new store: MLflow creates its tables
logging.getLogger("mlflow.store.db.utils").warning("mlflow db line kept")
subprocess_server_logger.info("Starting temporary server on http://127.0.0.1:8123\\nSee docs")
subprocess_server_logger.info("Stopping temporary server on http://127.0.0.1:8123")
subprocess_server_logger.warning("prefect line kept")
keras.optimizers.Adam().load_own_variables({{"0": np.zeros(3)}})
warnings.warn("a user warning kept", UserWarning)
print("child done", flush=True)
"""


def test_the_three_library_lines_are_dropped_and_their_neighbours_kept(tmp_path):
    code = CHILD.format(uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_DIR
    )
    both = out.stdout + out.stderr
    assert out.returncode == 0, out.stderr[-3000:]
    assert "child done" in out.stdout
    for dropped in (
        "Creating initial MLflow database tables",
        "Updating database tables",
        "temporary server",
        "Skipping variable loading for optimizer",
    ):
        assert dropped not in both, both[-3000:]
    for kept in ("mlflow db line kept", "prefect line kept", "a user warning kept"):
        assert kept in both, both[-3000:]
