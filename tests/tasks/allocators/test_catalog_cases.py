"""The weekly allocators flow measures the whole catalog at the config's inputs: the workloads
where the choice matters (issue 22) must be among its cases, each once."""

from __future__ import annotations

from tasks.allocators.config import load_allocators_config
from tasks.allocators.measure import select_cases
from tasks.replay.workloads import load_catalog

WHERE_IT_MATTERS = {
    "numpy_temporaries",
    "keras_gru",
    "keras_video",
    "larson",
    "cache_scratch",
    "xmalloc_test",
    "mstress",
    "kv_service",
}


def test_the_weekly_selection_carries_the_workloads_where_the_allocator_matters():
    # GIVEN the shipped catalog and allocators config, as the weekly deployment runs them
    # (every workload, not the quick subset)
    cases = select_cases(load_catalog(), load_allocators_config())
    # THEN each workload where the choice matters is measured, on one input of the config's
    measured = [c.label for c in cases]
    assert WHERE_IT_MATTERS <= set(measured), measured
    config_inputs = load_allocators_config().inputs
    for case in cases:
        if case.workload.name in WHERE_IT_MATTERS and config_inputs is not None:
            assert case.input.name in config_inputs
