"""tasks.dataset.worker_heap: a worker's freed memory is reused by its next conversion, then given back."""

from __future__ import annotations

import os
import resource
import time

import numpy as np
import pytest

from tasks.dataset import worker_heap
from tasks.dataset.worker_heap import heap_kept, is_kept, release_if_idle

pytestmark = pytest.mark.skipif(worker_heap._LIBC is None, reason="needs glibc's mallopt")

BLOCK = 256 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def faults_filling_a_block() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(BLOCK // 8)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del a
    return after - before


@pytest.fixture(autouse=True)
def released():
    release_if_idle()
    yield
    release_if_idle()


def test_the_next_conversion_reuses_the_memory_and_idle_gives_it_back():
    with heap_kept(hold_s=3600):
        first = faults_filling_a_block()
    assert is_kept()  # held after the conversion ended
    with heap_kept(hold_s=3600):  # the next file of the run
        second = faults_filling_a_block()
    # fresh memory costs a fault per page (129 for the block even with 2 MiB pages); reused: ~0
    assert second < 32 <= first, (first, second)
    held = rss()
    assert release_if_idle()
    assert not is_kept()
    assert held - rss() >= BLOCK // 2  # the kept block went back to the system


def test_release_waits_for_running_conversions():
    with heap_kept(hold_s=3600):
        assert not release_if_idle()
        assert is_kept()


def test_kept_memory_is_released_after_the_hold_without_a_new_conversion():
    with heap_kept(hold_s=0.05):
        pass
    for _ in range(400):  # released by the hold's timer thread
        if not is_kept():
            break
        time.sleep(0.05)
    assert not is_kept()


def test_a_conversion_starting_within_the_hold_cancels_the_release():
    with heap_kept(hold_s=0.2):
        pass
    with heap_kept(hold_s=0.2):
        time.sleep(0.6)  # past the first hold: its release was cancelled
        assert is_kept()
