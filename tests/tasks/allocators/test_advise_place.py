"""`heapcast tune` proposing jemalloc-place (tasks.allocators.trace_facts, advise) on synthetic
traces with call sites: GIVEN small blocks allocated and freed in bursts while a minority from a
call site of their own outlive them, WHEN the facts are read under the memory objective, THEN
placement is proposed, saying why; and not on a plain trace, nor where the long blocks share the
short ones' site, nor under the time objective (it buys memory, not time), each saying why."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.allocators.advise import PLACE, PROMPT_PURGE, PROMPT_SUFFIX, advise, placement_case
from tasks.allocators.config import load_allocators_config
from tasks.allocators.trace_facts import PLACE_HORIZON, heap_facts
from tasks.format.trace_reader import OP_SHIFT, RECORD_DTYPE_CALLER, THREAD_SHIFT, Op
from tests.tracegen import write_trace

FIXED = ["glibc", "glibc-fixed", "jemalloc", "tcmalloc", "mimalloc"]
REQUEST_SITE, ENTRY_SITE = 0x401100, 0x401200


@pytest.fixture(scope="module")
def config():
    return load_allocators_config()


def _bursts(path, *, bursts=4, short=100_000, every=100, entry_site=ENTRY_SITE, size=128):
    """One thread: `bursts` bursts of `short` request buffers of `size` bytes (REQUEST_SITE),
    one entry (`entry_site`) after every `every`-th request (none with every=0), the requests
    freed at each burst's end, the entries never."""
    i = np.arange(short)
    entries = i[i % every == 0] if every else i[:0]
    parts, t, e = [], 1, 0
    for _ in range(bursts):
        # allocations: request i, then its entry when i % every == 0; then the frees
        n_alloc = short + len(entries)
        order = np.argsort(np.r_[i * 2, entries * 2 + 1], kind="stable")
        is_entry = np.r_[np.zeros(short, bool), np.ones(len(entries), bool)][order]
        addr = np.where(
            is_entry,
            0x7F00_0000_0000 + (e + np.cumsum(is_entry) - 1) * size,
            0x5500_0000_0000 + np.r_[i, entries][order] * size,
        )
        e += len(entries)
        recs = np.zeros(n_alloc + short, dtype=RECORD_DTYPE_CALLER)
        recs["addr"][:n_alloc] = addr.astype(np.uint64)
        recs["addr"][n_alloc:] = (0x5500_0000_0000 + i * size).astype(np.uint64)
        ops = np.r_[np.full(n_alloc, Op.MALLOC), np.full(short, Op.FREE)].astype(np.uint64)
        sizes = np.r_[np.full(n_alloc, size), np.zeros(short)].astype(np.uint64)
        recs["packed"] = sizes | (ops << np.uint64(OP_SHIFT))
        recs["caller"][:n_alloc] = np.where(is_entry, entry_site, REQUEST_SITE)
        recs["time"] = np.arange(t, t + len(recs), dtype=np.uint64) * 100
        t += len(recs)
        parts.append(recs)
    start = np.zeros(1, dtype=RECORD_DTYPE_CALLER)
    start["arg"] = 1000
    start["packed"] = np.uint64(Op.THREAD_START) << np.uint64(OP_SHIFT) | np.uint64(0) << np.uint64(
        THREAD_SHIFT
    )
    write_trace(path / "1-1.hct", np.concatenate([start, *parts]), caller=True)


def test_bursts_leaving_long_blocks_from_their_own_site_get_placement_for_memory(config, tmp_path):
    # GIVEN 4 bursts of 100 000 small requests with an entry from another site every 100
    _bursts(tmp_path)
    facts = heap_facts(tmp_path, check_imports=False)
    # THEN the facts see the burst's peak, and the entries still live a horizon later
    assert facts.small.call_sites and facts.small.allocations == 4 * 101_000
    assert facts.small.live_peak_bytes >= 100_000 * 128
    # entries of the first bursts outlived the layer's horizon; the last ones are still young
    assert 0 < facts.small.long_blocks < 4 * 1000
    assert facts.small.long_from_long_sites == facts.small.long_blocks
    assert (facts.small.long_sites, facts.small.short_sites) == (1, 1)
    assert any("outlived the others" in line for line in facts.lines())
    # WHEN the candidates are derived for the memory objective: jemalloc-place, with why
    advice = advise(facts, config, FIXED, cpus=2, objective="memory")
    assert PLACE in [a.name for a in advice.derived]
    assert "1 call site(s) of their own" in advice.run[PLACE]
    assert advice.place.startswith("proposed: small blocks came and went")
    # for time it is not proposed: the page says it buys memory, not time
    timed = advise(facts, config, FIXED, cpus=2, objective="time")
    assert PLACE not in [a.name for a in timed.derived] and PLACE not in timed.run
    assert "buys memory after bursts, not time" in timed.place


def test_plain_churn_without_long_blocks_gets_no_placement(config, tmp_path):
    _bursts(tmp_path, every=0)
    facts = heap_facts(tmp_path, check_imports=False)
    advice = advise(facts, config, FIXED, cpus=2, objective="memory")
    assert PLACE not in [a.name for a in advice.derived]
    assert advice.place.startswith("not proposed: 0 small block(s) outlived the others")


def test_long_blocks_sharing_the_short_ones_site_get_no_placement(config, tmp_path):
    # the same bursts, the entries allocated through the requests' own site (one wrapper)
    _bursts(tmp_path, entry_site=REQUEST_SITE)
    facts = heap_facts(tmp_path, check_imports=False)
    assert facts.small.long_blocks > 0 and facts.small.long_from_long_sites == 0
    advice = advise(facts, config, FIXED, cpus=2, objective="memory")
    assert PLACE not in [a.name for a in advice.derived]
    assert "a per-site counter cannot tell them apart" in advice.place


def test_a_short_run_or_a_small_peak_gets_no_placement(config, tmp_path):
    # fewer allocations than the layer's horizon: nothing outlives it, the counter learns nothing
    _bursts(tmp_path, bursts=2, short=PLACE_HORIZON // 4)
    facts = heap_facts(tmp_path, check_imports=False)
    ok, why = placement_case(facts)
    assert not ok and "small block(s) outlived the others" in why
    small = tmp_path / "small"
    small.mkdir()
    _bursts(small, size=16)  # 1.6 MB at the peak: too few pages to show
    ok, why = placement_case(heap_facts(small, check_imports=False))
    assert not ok and "too few pages for placement to show" in why


def test_placement_for_memory_comes_with_and_without_prompt_purging(config, tmp_path):
    # GIVEN the bursts' case, for the memory objective
    _bursts(tmp_path)
    advice = advise(heap_facts(tmp_path, check_imports=False), config, FIXED, 2, "memory")
    derived = {a.name: a for a in advice.derived}
    # THEN placement is measured as it is, with freed pages returned at once, and jemalloc
    # alone with them returned at once (placement's own share), each with why
    assert {PLACE, PLACE + PROMPT_SUFFIX, "jemalloc" + PROMPT_SUFFIX} <= set(derived)
    prompt = derived[PLACE + PROMPT_SUFFIX]
    assert prompt.kind == "place" and prompt.library == derived[PLACE].library
    assert prompt.env["MALLOC_CONF"].endswith(PROMPT_PURGE)
    assert prompt.env["HEAPCAST_PLACE"] == derived[PLACE].env["HEAPCAST_PLACE"]
    assert derived["jemalloc" + PROMPT_SUFFIX].env["MALLOC_CONF"] == PROMPT_PURGE
    assert "cost time, measured here" in advice.run[PLACE + PROMPT_SUFFIX]
    assert "placement's own share" in advice.run["jemalloc" + PROMPT_SUFFIX]
    # and not for time: no prompt candidates either
    timed = advise(heap_facts(tmp_path, check_imports=False), config, FIXED, 2, "time")
    assert not {a.name for a in timed.derived} & {PLACE + PROMPT_SUFFIX, "jemalloc-prompt"}
