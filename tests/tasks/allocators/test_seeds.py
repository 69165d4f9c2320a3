"""The names the layer's figures take on the model's run: short enough for a chart's title."""

from __future__ import annotations

import pytest

from tasks.allocators.seeds import short_case_names

# trains, runs programs or servers, or takes seconds: not in the quick tier (make test-quick)
pytestmark = pytest.mark.slow


def test_cases_lose_the_words_they_all_begin_with_and_keep_the_rest():
    cases = ["numpy_temporaries", "numpy_training_loop", "numpy_pipeline"]
    assert short_case_names(cases) == {
        "numpy_temporaries": "temporaries",
        "numpy_training_loop": "training_loop",
        "numpy_pipeline": "pipeline",
    }
    # nothing in common, a single case, or a name that is all prefix: unchanged
    assert short_case_names(["sqlite3", "numpy_pipeline"]) == {
        "sqlite3": "sqlite3",
        "numpy_pipeline": "numpy_pipeline",
    }
    assert short_case_names(["numpy_pipeline"]) == {"numpy_pipeline": "numpy_pipeline"}
    assert short_case_names(["numpy", "numpy_pipeline"]) == {
        "numpy": "numpy",
        "numpy_pipeline": "numpy_pipeline",
    }
    # workload/input labels: the input stays, after a dot
    assert short_case_names(["kv_service/small", "kv_service/medium"]) == {
        "kv_service/small": "service.small",
        "kv_service/medium": "service.medium",
    }
