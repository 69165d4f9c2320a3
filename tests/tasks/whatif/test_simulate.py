"""The compiled simulator against the plain-Python reference, exactly, on random traces (the
policies it runs itself); the policies the layer runs as the policy core decides them; the fault
model on hand-made traces; the cache lookup step on hand-made caches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.dataset.events_schema import CALLER_MODULE_TYPE, EVENTS_SCHEMA
from tasks.dataset.sites import call_sites
from tasks.dataset.token_runs import ScoredRun
from tasks.format.trace_reader import Op
from tasks.whatif import policies
from tasks.whatif.events import prepare
from tasks.whatif.guided import reuse_labels
from tasks.whatif.policy_core import (
    LayerPolicy,
    class_scores_of,
    layer_policy,
    replay,
    with_call_sites,
)
from tasks.whatif.simulate import (
    G_IDLE,
    K_LRU,
    P_IDLE,
    SCAN_LIMIT,
    _cache_block,
    _lookup,
    _new_state,
    _remove,
    _take_node,
    run_kernel,
    simulate,
)
from tests.tasks.whatif.reference import random_events, reference, with_rows

EXACT = (
    "allocations",
    "hits",
    "hit_bytes",
    "waste_bytes",
    "frees",
    "cached_frees",
    "evictions",
    "evicted_bytes",
    "system_allocations",
    "fault_bytes_mmap",
    "fault_bytes_heap",
    "fault_bytes",
    "idle_bytes_peak",
    "idle_bytes_peak_process",
    "live_peak",
    "peak_footprint",
    "max_rss",
    "span",
)

POLICIES = [
    policies.NoneConfig(),
    policies.LruConfig(budget=4096),
    policies.LruConfig(budget=700_000),
    policies.LruConfig(budget=1 << 40),
    policies.GuidedConfig(budget=300_000),
    policies.GuidedConfig(budget=5000, ttl_calls=5),
    policies.GuidedConfig(budget=700_000, ttl_calls=2),
    policies.GuidedConfig(budget=1 << 40, ttl_calls=7),
    policies.GuidedConfig(budget=20_000, horizons=(3, 10, 40)),
    policies.GuidedConfig(budget=300_000, horizons=(5,)),
    policies.GuidedConfig(budget=300_000, mode="admit"),
    policies.GuidedConfig(budget=1 << 40, ttl_calls=7, mode="admit"),
    policies.BeladyConfig(budget=5000),
    policies.BeladyConfig(budget=900_000),
    policies.BeladyConfig(budget=1 << 40, min_size=100),
]


def _check(table: pa.Table, policy, predictions=None) -> dict:
    got = simulate(table, policy, predictions)
    want = reference(table, policy, predictions)
    for k in EXACT:
        assert got[k] == want[k], (policy, k, got[k], want[k])
    assert got["idle_bytes_mean"] * got["span"] == pytest.approx(want["idle_integral"], rel=1e-12)
    return got


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.label}-{p.param:g}")
def test_policy_matches_reference(seed, policy):
    table = random_events(seed, n_proc=1 + seed % 3, n_events=250)
    pred = None
    if policy.kind == "guided":
        pred = np.random.default_rng(seed).random(table.num_rows) < 0.6
    got = _check(table, policy, pred)
    if policy.kind == "none":
        assert got["hits"] == 0 and got["hit_rate"] == 0.0 and got["fault_bytes_avoided"] == 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.label}-{p.param:g}")
def test_large_blocks_only_match_reference(seed, policy):
    # reallocs between mmapped blocks (mremap), N-largest evictions, waste bounds
    table = random_events(50 + seed, n_proc=2, sizes=[140_000, 200_000, 300_000, 600_000, 5000])
    pred = np.random.default_rng(seed).random(table.num_rows) < 0.6
    _check(table, policy, pred if policy.kind == "guided" else None)


LAYER_POLICIES = [
    policies.LargestConfig(n=1),
    policies.LargestConfig(n=4),
    policies.LargestConfig(n=4, peak=None),  # without the layer's bound on live + kept
    policies.LargestConfig(n=3, min_size=0),
    policies.LargestConfig(n=4, proof=0),  # kept from the first free (no proof)
    policies.PoolsConfig(decay_ns=5),
    policies.PoolsConfig(decay_ns=10**9, proof=0),
    policies.LayerGuidedConfig(),
    policies.LayerGuidedConfig(regret=True, proof=0),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", LAYER_POLICIES, ids=lambda p: f"{p.label}-{p.param:g}")
def test_layer_policies_are_the_policy_cores_decisions(seed, policy):
    """GIVEN a random run WHEN the simulator runs a policy the layer runs THEN its counts are
    the policy core's (which test_policy_core holds to the real layer's), and the compiled loop
    refuses it (no second copy of the layer's rules)."""
    table = random_events(50 + seed, n_proc=2, sizes=[140_000, 200_000, 300_000, 600_000, 5000])
    got = simulate(table, policy)
    lp, decay_ns = layer_policy(policy)
    core = replay(table, lp, decay_ns=decay_ns).stats
    assert got["hits"] == core["hits"] and got["cached_frees"] == core["kept"]
    assert got["evictions"] == core["given_back"]
    assert got["evicted_bytes"] == core["bytes_given_back"]
    assert 0 <= got["idle_bytes_mean"] <= got["idle_bytes_peak"] <= got["peak_footprint"]
    assert (
        got["live_peak"] == simulate(table, policies.NoneConfig())["live_peak"]
    )  # not the policy's
    with pytest.raises(ValueError, match="policy core"):
        run_kernel(prepare(table), policy)


@pytest.mark.parametrize("seed", range(3))
def test_a_layer_policy_that_never_hits_has_no_caches_faults(seed):
    """The byte figures of the layer's policies follow the compiled loop's fault model: a
    policy that keeps nothing (min_size above every block) has the figures of no cache."""
    table = random_events(seed, n_proc=1 + seed % 3, n_events=250)
    none = simulate(table, policies.NoneConfig())
    for policy in (
        policies.LargestConfig(min_size=1 << 40),
        policies.LayerGuidedConfig(min_size=1 << 40),
    ):
        got = simulate(table, policy)
        assert got["hits"] == 0 and got["idle_bytes_peak"] == 0
        for k in ("fault_bytes_mmap", "fault_bytes_heap", "max_rss", "peak_footprint"):
            assert got[k] == none[k], (policy, k)
        assert got["fault_bytes_avoided"] == 0


def test_shuffled_rows_give_the_same_result():
    # calls of a process never share a time: their order is then the table's to lose
    table = random_events(11, n_proc=3, n_events=300, min_step=1)
    shuffled = with_rows(table, np.random.default_rng(0).permutation(table.num_rows))
    for policy in (
        policies.LruConfig(budget=100_000),
        policies.LargestConfig(),
        policies.BeladyConfig(budget=50_000),
    ):
        a, b = simulate(table, policy), simulate(shuffled, policy)
        for k in EXACT + ("idle_bytes_mean",):
            assert a[k] == b[k], (policy, k)


def test_guided_all_true_is_lru_and_all_false_is_none():
    table = random_events(3, n_proc=2)
    yes, no = np.ones(table.num_rows, bool), np.zeros(table.num_rows, bool)
    lru = simulate(table, policies.LruConfig(budget=200_000))
    assert lru["hits"] > 0
    # priority: a prediction only orders evictions; all equal, the order is lru's
    for pred in (yes, no):
        for ttl in (None, 3):
            g = simulate(table, policies.GuidedConfig(budget=200_000, ttl_calls=ttl), pred)
            for k in EXACT:
                assert g[k] == lru[k], (k, ttl)
    g = simulate(table, policies.GuidedConfig(budget=200_000, mode="admit"), yes)
    for k in EXACT:
        assert g[k] == lru[k]
    g0 = simulate(table, policies.GuidedConfig(budget=200_000, mode="admit"), no)
    assert g0["hits"] == 0 and g0["fault_bytes_avoided"] == 0
    with pytest.raises(ValueError, match="prediction"):
        simulate(table, policies.GuidedConfig())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", [p for p in POLICIES if p.kind == "guided"], ids=str)
def test_guided_tiers_match_reference(seed, policy):
    # predictions as tiers 0..3 (priority: the lowest tier is released first)
    table = random_events(20 + seed, n_proc=1 + seed % 2, n_events=250)
    tiers = np.random.default_rng(seed).integers(0, 4, table.num_rows)
    _check(table, policy, tiers)
    with pytest.raises(ValueError, match="tiers"):
        simulate(table, policy, tiers + 8)


@pytest.mark.parametrize("mode", ["priority", "admit"])
def test_guided_with_labels_matches_reference(mode):
    table = random_events(5, n_proc=2, n_events=300)
    for budget, ttl in ((1 << 30, 4), (3000, 4), (3000, None), (400_000, 1)):
        policy = policies.GuidedConfig(budget=budget, ttl_calls=ttl, mode=mode)
        _check(table, policy, reuse_labels(table, horizon=4))


def test_same_time_everywhere_counts_calls():
    table = random_events(2, n_proc=2, time_step=0)
    table = table.set_column(
        table.schema.get_field_index("time_ns"),
        pa.field("time_ns", pa.int64(), nullable=False),
        pa.array(np.zeros(table.num_rows, np.int64)),
    )
    got = _check(table, policies.LruConfig(budget=300_000))
    assert got["time_basis"] == "calls"


def test_partners_found_from_lifetime_calls():
    table = random_events(4, n_proc=2)
    x = prepare(table)
    paired = x.freed >= 0
    assert (x.partner[paired] >= 0).all()
    assert (x.req[x.partner[paired]] == x.freed[paired]).all()


# --- hand-made traces: the fault model -----------------------------------------------------------


def _events(calls: list[tuple], pid: int = 7) -> pa.Table:
    """calls: (op, size, addr, freed_size or None) in call order; times 10 ns apart."""
    n = len(calls)
    born: dict[int, int] = {}
    life: list[int | None] = [None] * n
    for i, (_op, _size, addr, freed) in enumerate(calls):
        if freed is not None:
            a = born.pop(addr)
            life[a] = i - a
        elif addr:
            born[addr] = i
    col = list(zip(*calls))
    return pa.table(
        {
            "pid": np.full(n, pid, np.uint32),
            "ppid": np.ones(n, np.uint32),
            "thread": np.zeros(n, np.uint16),
            "tid": np.full(n, pid, np.uint32),
            "seq": np.arange(n, dtype=np.uint64),
            "time_ns": np.arange(n, dtype=np.int64) * 10,
            "op": np.array([int(o) for o in col[0]], np.uint8),
            "size": np.array(col[1], np.uint64),
            "alignment": pa.nulls(n, pa.uint64()),
            "addr": np.array(col[2], np.uint64),
            "freed_addr": pa.nulls(n, pa.uint64()),
            "freed_size": pa.array(col[3], pa.uint64()),
            "caller": pa.nulls(n, pa.uint64()),
            "lifetime_ns": pa.array([None if v is None else v * 10 for v in life], pa.int64()),
            "lifetime_calls": pa.array(life, pa.int64()),
            "token": np.zeros(n, np.uint8),
            "caller_module": pa.nulls(n, CALLER_MODULE_TYPE),
            "caller_offset": pa.nulls(n, pa.uint64()),
            "stack": pa.nulls(n, pa.uint64()),
        },
        schema=EVENTS_SCHEMA,
    )


MALLOC, FREE = Op.MALLOC, Op.FREE


def test_fault_accounting_large_blocks():
    # two 200000-byte arrays one after the other, and one small block
    t = _events(
        [
            (MALLOC, 200_000, 0x1000, None),
            (FREE, 0, 0x1000, 200_000),
            (MALLOC, 200_000, 0x2000, None),
            (MALLOC, 100, 0x3000, None),
            (FREE, 0, 0x3000, 100),
            (FREE, 0, 0x2000, 200_000),
        ]
    )
    # mmap chunk: round_up(((200000 + 8 + 15) & ~15) + 8, 4096) = 49 pages; heap: chunk(100) =
    # 112 bytes -> one page
    mmap_one = 49 * 4096
    none = simulate(t, policies.NoneConfig())
    assert none["fault_bytes_mmap"] == 2 * mmap_one
    assert none["fault_bytes_heap"] == 4096
    assert none["max_rss"] == mmap_one + 4096
    assert none["live_peak"] == 200_100 == none["peak_footprint"] == none["ideal_rss"]
    s2 = simulate(t, policies.LargestConfig(n=4, proof=0))
    assert s2["hits"] == 1 and s2["allocations"] == 3
    assert s2["fault_bytes_mmap"] == mmap_one
    assert s2["fault_bytes_avoided"] == mmap_one
    # the layer keeps the block's usable bytes: its mapping less 16
    assert s2["idle_bytes_peak"] == mmap_one - 16
    # idle from t=10 (the free) to t=20 (the hit) over a span of 50 ns
    assert s2["idle_bytes_mean"] == pytest.approx((mmap_one - 16) * 10 / 50)


def test_fault_accounting_heap_growth_when_caching():
    # 6000 (class 13) freed, then 9000 (class 14): the cache keeps the first on the heap
    t = _events(
        [
            (MALLOC, 6000, 0x1000, None),
            (FREE, 0, 0x1000, 6000),
            (MALLOC, 9000, 0x2000, None),
            (FREE, 0, 0x2000, 9000),
        ]
    )
    none = simulate(t, policies.NoneConfig())
    assert none["fault_bytes"] == none["fault_bytes_heap"] == 12288  # hwm 9024 bytes: 3 pages
    lru = simulate(t, policies.LruConfig(budget=1 << 20))
    assert lru["hits"] == 0
    assert lru["fault_bytes_heap"] == 16384  # 6016 + 9024 held at once: 4 pages
    assert lru["fault_bytes_avoided"] == -4096


def test_hit_with_a_larger_block_returns_the_larger_block():
    t = _events(
        [
            (MALLOC, 300_000, 0x1000, None),
            (FREE, 0, 0x1000, 300_000),
            (MALLOC, 270_000, 0x2000, None),  # same class (19), served by the 300000 block
            (FREE, 0, 0x2000, 270_000),
            (MALLOC, 290_000, 0x3000, None),  # the block comes back as 300000: fits
        ]
    )
    r = simulate(t, policies.LruConfig(budget=1 << 20))
    assert r["hits"] == 2
    assert r["waste_bytes"] == 30_000 + 10_000
    assert r["peak_footprint"] == r["live_peak"] == 300_000  # one block, first 300000 live


def _aligned(t: pa.Table, alignments: dict[int, int], ops: dict[int, Op]) -> pa.Table:
    """t with rows' alignment and op replaced (row -> value)."""
    al = [alignments.get(i) for i in range(t.num_rows)]
    op = [int(ops.get(i, o)) for i, o in enumerate(t.column("op").to_pylist())]
    t = t.set_column(t.schema.get_field_index("alignment"), "alignment", pa.array(al, pa.uint64()))
    return t.set_column(t.schema.get_field_index("op"), "op", pa.array(op, pa.uint8()))


def test_largest_follows_the_layers_rules():
    """The layer's rules (native/layers/layer.c, policy=largest), on a hand-made trace: usable sizes (glibc's mmapped block of
    300000 bytes has 303088 usable), a fit across size classes (usable - n < n + 4096), the
    alignment of the cached block's address, eviction of the smallest usable block."""
    base = 0x7F0000000000
    t = _events(
        [
            (MALLOC, 300_000, base + 0x10, None),  # 0: usable 303088, address 16-aligned
            (FREE, 0, base + 0x10, 300_000),  # 1: cached
            (MALLOC, 302_000, base + 0x10, None),  # 2: HIT (302000 <= 303088 usable)
            (FREE, 0, base + 0x10, 302_000),  # 3: cached again (as the 300000 block)
            (MALLOC, 303_100, base + 0x1010, None),  # 4: miss (303100 > 303088)
            (FREE, 0, base + 0x1010, 303_100),  # 5: cached (2 blocks)
            (MALLOC, 600_000, base + 0x2010, None),  # 6: miss
            (FREE, 0, base + 0x2010, 600_000),  # 7: cached (3 blocks)
            (MALLOC, 400_000, base + 0x3010, None),  # 8: HIT, class 19 from a class-20 block
            (MALLOC, 200_000, base + 0x4040, None),  # 9: posix_memalign(64): miss, the
            # cached blocks' addresses are 16 mod 64
            (FREE, 0, base + 0x4040, 200_000),  # 10: cached, 64-aligned
            (MALLOC, 199_000, base + 0x5040, None),  # 11: posix_memalign(64): HIT (row 10's)
        ]
    )
    t = _aligned(t, {9: 64, 11: 64}, {9: Op.POSIX_MEMALIGN, 11: Op.POSIX_MEMALIGN})
    r = simulate(t, policies.LargestConfig(n=4, proof=0))
    assert r["hits"] == 3
    assert r["allocations"] == 7
    # the old rule (same class, requested size b >= s) would hit only at row 11 (row 8's
    # request is class 19, the 600000 block class 20)
    mmap_one = lambda s: -(-(((s + 8 + 15) & ~15) + 8) // 4096) * 4096  # noqa: E731
    want_avoided = mmap_one(302_000) + mmap_one(400_000) + mmap_one(199_000)
    assert r["fault_bytes_avoided"] == want_avoided
    # n = 1: eviction by usable size; the 303100 block (larger) replaces the 300000 one at row
    # 5, the 600000 one it at row 7; rows 2, 8 and 11 still hit
    r1 = simulate(t, policies.LargestConfig(n=1, proof=0, peak=None))
    assert r1["hits"] == 3 and r1["evictions"] == 2
    assert r1["fault_bytes_avoided"] == want_avoided


def test_largest_keeps_nothing_until_its_proof():
    """The layer's proof (layer.c hl_ghost_hit): nothing is kept until `proof` misses could have
    been served by a block passed on before (the last 8, by the cache's own fit); then it keeps
    (without the bound, which would give row 1's block back at row 2's miss)."""
    base = 0x7F0000000000
    t = _events(
        [
            (MALLOC, 300_000, base + 0x10, None),  # 0: miss
            (FREE, 0, base + 0x10, 300_000),  # 1: passed on, remembered
            (MALLOC, 900_000, base + 0x10, None),  # 2: miss; the 300000 block would not fit
            (MALLOC, 300_000, base + 0x1010, None),  # 3: miss it would have served: proof 1
            (FREE, 0, base + 0x1010, 300_000),  # 4: passed on, remembered
            (MALLOC, 301_000, base + 0x2010, None),  # 5: miss it would have served: proof 2
            (FREE, 0, base + 0x2010, 301_000),  # 6: kept
            (MALLOC, 300_500, base + 0x3010, None),  # 7: HIT
        ]
    )
    for proof, hits in ((0, 3), (1, 2), (2, 1), (3, 0)):
        got = simulate(t, policies.LargestConfig(n=4, proof=proof, peak=None))
        assert got["hits"] == hits, (proof, got["hits"])


def test_largest_keeps_only_blocks_the_layer_handed_out():
    """A heap block asked for just below min_size has a usable size at min_size (131070 bytes:
    131080 usable): the layer never tracked it (it tracks requests >= min), so its free passes
    through, and a later request it would fit misses."""
    t = _events(
        [
            (MALLOC, 131_070, 0x5010, None),  # below min: the layer passes it through
            (FREE, 0, 0x5010, 131_070),  # usable 131080 >= min, but not the layer's block
            (MALLOC, 131_072, 0x5010, None),  # would fit 131080: a miss all the same
        ]
    )
    r = simulate(t, policies.LargestConfig(n=4, proof=0))
    assert r["hits"] == 0 and r["cached_frees"] == 0


def test_layer_guided_asks_the_class_table_it_is_given():
    """GIVEN a loop of malloc and free of 300000 bytes (class 19) and the layer's guided policy
    asking a class table (no proof, no bound) THEN a table that scores the class's free 255
    keeps every free (each next request hits), one that scores it 0 keeps none; without a
    table, table=true is refused."""
    rows = []
    for k in range(6):
        rows += [(MALLOC, 300_000, 0x10 + k * 0x100000, None)]
        rows += [(FREE, 0, 0x10 + k * 0x100000, 300_000)]
    t = _events(rows)
    policy = policies.LayerGuidedConfig(table=True, proof=0, peak=None)
    keep = np.zeros((64, 64), np.uint8)
    keep[32 + 19, 19] = 255  # the entry the layer reads at a free of class 19
    assert simulate(t, policy, class_scores=keep)["hits"] == 5
    assert simulate(t, policy, class_scores=np.zeros((64, 64), np.uint8))["hits"] == 0
    with pytest.raises(ValueError, match="class table"):
        simulate(t, policy)


def test_priority_eviction_beats_lru_at_a_tight_budget():
    # budget 1000 B: a (500 B, class 9) and u (600 B, class 10) cannot both stay cached. lru
    # releases the older, a, and misses the 400-byte request that a would have served; the
    # prediction says class 9 comes back within 2 calls and class 10 never: priority releases u
    t = _events(
        [
            (MALLOC, 500, 0xA0, None),
            (MALLOC, 600, 0xB0, None),
            (FREE, 0, 0xA0, 500),  # predicted: class 9 is requested 2 calls later
            (FREE, 0, 0xB0, 600),  # unpredicted: class 10 is never requested again
            (MALLOC, 400, 0xC0, None),
        ]
    )
    labels = reuse_labels(t, horizon=2)
    assert labels.tolist() == [False, False, True, False, False]
    lru = simulate(t, policies.LruConfig(budget=1000))
    assert (lru["hits"], lru["allocations"], lru["evictions"], lru["evicted_bytes"]) == (
        0,
        3,
        1,
        500,
    )
    assert lru["idle_bytes_peak"] == 600
    for ttl in (None, 2):
        g = simulate(t, policies.GuidedConfig(budget=1000, ttl_calls=ttl), labels)
        assert (g["hits"], g["evictions"], g["evicted_bytes"]) == (1, 1, 600)
        assert g["waste_bytes"] == 100 and g["idle_bytes_peak"] == 500
        assert g["hit_rate"] == 1 / 3 > lru["hit_rate"]
        assert g["idle_bytes_mean"] < lru["idle_bytes_mean"]
        _check(t, policies.GuidedConfig(budget=1000, ttl_calls=ttl), labels)
    # without the prediction (all false, or all true) it is lru, hit for hit
    for pred in (np.zeros(5, bool), np.ones(5, bool)):
        assert simulate(t, policies.GuidedConfig(budget=1000), pred)["hits"] == 0


def _with_callers(t: pa.Table, offsets: list[int], module: str = "/usr/bin/prog") -> pa.Table:
    """`t` with every row called from `module` at `offsets` (one per row)."""
    n = t.num_rows
    mod = pa.array([module] * n, pa.string()).cast(CALLER_MODULE_TYPE)
    t = t.set_column(t.schema.get_field_index("caller_module"), "caller_module", mod)
    off = pa.array(offsets, pa.uint64())
    return t.set_column(t.schema.get_field_index("caller_offset"), "caller_offset", off)


def _site_payload(classes: np.ndarray, entries: dict[tuple[int, int], int]) -> bytes:
    """A format 3 table's payload (native/TABLE.md): class scores, then the site entries."""
    keys = sorted((s * 32 + c, v) for (s, c), v in entries.items())
    words = np.array([k << 8 | v for k, v in keys], "<u4")
    return classes.tobytes() + words.tobytes()


def test_layer_guided_asks_the_call_site_entries_first():
    """GIVEN rounds of malloc and free of 300000 (class 19), 600000 twice (20), 1200000 (21)
    bytes, each class freed from its own call site, and a format 3 table whose class scores
    keep every class, with an entry of 255 at (site of 19, 19), of 0 at (site of 20, 20), none
    for 21 (guided, no proof, no bound)
    THEN the class-19 frees are all kept, where the counter alone passes them on after the
    first; the class-20 frees all passed on, where the counter keeps them; the class-21 frees
    answered by the counter (its fates without any table), not by the class scores (which keep
    them all); the frees a site entry answered are counted (`sited`, the layer's table_sites);
    and the simulator's layer_guided(table=true) is the same replay."""
    size = {19: 300_000, 20: 600_000, 21: 1_200_000}
    pattern = [19, 20, 20, 21] * 5
    rows, offsets = [], []
    for k, c in enumerate(pattern):
        rows += [(MALLOC, size[c], 0x10 + k * 0x1000000, None)]
        rows += [(FREE, 0, 0x10 + k * 0x1000000, size[c])]
        offsets += [0x50, 0x100 * (c - 18)]  # the frees' call sites: one per class
    t = _with_callers(_events(rows), offsets)
    site = call_sites(t)[1::2]
    at = {c: int(site[pattern.index(c)]) for c in size}
    assert len(set(at.values())) == 3
    classes = np.zeros((64, 64), np.uint8)
    for c in size:
        classes[32 + c, c] = 255
    scores = class_scores_of(_site_payload(classes, {(at[19], 19): 255, (at[20], 20): 0}))
    policy = LayerPolicy(policy="guided", proof=0, peak=None)
    fate = replay(t, policy, class_scores=scores).fate[1::2]
    counter = replay(t, policy).fate[1::2]
    by_classes = replay(t, policy, class_scores=classes).fate[1::2]
    cls = np.array(pattern)
    kept, declined = 1, 4
    assert np.all(fate[cls == 19] == kept) and np.any(counter[cls == 19] != kept)
    assert np.all(fate[cls == 20] == declined) and np.any(counter[cls == 20] == kept)
    assert np.array_equal(fate[cls == 21], counter[cls == 21])
    assert np.any(fate[cls == 21] != by_classes[cls == 21])
    core = replay(t, policy, class_scores=scores)
    assert core.stats["sited"] == int(np.sum(cls != 21))
    assert replay(t, policy, class_scores=classes).stats["sited"] == 0
    sim = simulate(
        with_call_sites(prepare(t), t),
        policies.LayerGuidedConfig(table=True, proof=0, peak=None),
        class_scores=scores,
    )
    assert (sim["hits"], sim["cached_frees"]) == (core.stats["hits"], core.stats["kept"])


def test_a_trace_without_callers_asks_the_counter_with_a_table_of_sites():
    """GIVEN a format 3 table with entries (class scores keeping nothing) and a trace recorded
    without callers THEN no entry answers and neither do the class scores: the counter does,
    as the layer at sites its table lacks."""
    rows = []
    for k in range(6):
        rows += [(MALLOC, 300_000, 0x10 + k * 0x100000, None)]
        rows += [(FREE, 0, 0x10 + k * 0x100000, 300_000)]
    t = _events(rows)
    scores = class_scores_of(_site_payload(np.zeros((64, 64), np.uint8), {(5, 19): 0}))
    policy = LayerPolicy(policy="guided", proof=0, peak=None)
    with_sites = replay(t, policy, class_scores=scores)
    counter = replay(t, policy)
    assert with_sites.stats["sited"] == 0 and with_sites.stats["hits"] > 0
    assert np.array_equal(with_sites.fate, counter.fate)
    assert replay(t, policy, class_scores=np.zeros((64, 64), np.uint8)).stats["hits"] == 0


def test_the_nights_table_row_asks_the_call_site_entries():
    """GIVEN the night's predictor holding a format 3 table (what `_fetch_class_scores` reads
    from the version's logged file: the payload after the header) THEN its layer_guided_table
    row is the replay that asks the call-site entries (the frees' sites from the run's
    callers), not the class scores."""
    from tasks.whatif.night import Predictor, replay_events

    rows, offsets = [], []
    for k in range(6):
        rows += [(MALLOC, 300_000, 0x10 + k * 0x100000, None)]
        rows += [(FREE, 0, 0x10 + k * 0x100000, 300_000)]
        offsets += [0x50, 0x100]
    t = _with_callers(_events(rows), offsets)
    classes = np.zeros((64, 64), np.uint8)
    classes[32 + 19, 19] = 255  # the class scores keep every free
    site = int(call_sites(t)[1])
    payload = _site_payload(classes, {(site, 19): 0})  # the free's site entry: pass on
    config = policies.LayerGuidedConfig(table=True, proof=0, peak=None)
    run = ScoredRun.of(t, "w", "r")
    frame, _ = replay_events(run, [config], Predictor(class_scores=payload), horizon=1)
    assert frame["hits"].tolist() == [0]
    frame, _ = replay_events(run, [config], Predictor(class_scores=classes), horizon=1)
    assert frame["hits"].tolist() == [5]


def test_a_format_4_table_file_replays_its_class_scores_and_call_site_entries(tmp_path):
    """GIVEN a table written as the night now writes it (format 4: context entries after the
    site entries) THEN the replay reads its class scores and its site entries, the same as the
    format 3 file of the same table; the context entries are not read as sites, but as
    contexts (asked first: test_table_contexts)."""
    from tasks.learning.labels import REUSE_CLASSES
    from tasks.learning.table.distill import ClassTable, ContextCounts
    from tasks.learning.table.layer_file import HEADER, write_layer_table
    from tasks.whatif.night import table_file_scores

    sites = np.zeros((4096, 32, REUSE_CLASSES))
    sites[7, 19, REUSE_CLASSES - 1] = 10
    ctx = ContextCounts(4, np.array([5, 9]), np.array([19, 19]), np.eye(REUSE_CLASSES)[[0, 1]])
    v4 = ClassTable(np.ones((32, REUSE_CLASSES)), np.full(REUSE_CLASSES, 0.2), sites, ctx)
    v3 = ClassTable(v4.reuse_counts, v4.majority, sites)
    f4 = write_layer_table(tmp_path / "v4.hcltab", v4, 1)
    f3 = write_layer_table(tmp_path / "v3.hcltab", v3, 1)
    assert HEADER.unpack_from(f4.read_bytes())[1] == 4
    got, want = table_file_scores(f4), table_file_scores(f3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got.sites, want.sites)
    assert (got.sites >= 0).sum() == 1 and got.sites[7, 19] < 50
    assert want.contexts is None and got.contexts.depth == 4
    assert got.contexts.context.tolist() == [5, 9]
    np.testing.assert_array_equal(got.contexts.score, ctx.keep_scores())


def _cache_of(sizes):
    """Process 0's cache holding blocks of `sizes` (class 0), kept in that order by the loop's
    own steps; node k holds sizes[k]."""
    g, ps, ch, ct, nodes, _ = _new_state(K_LRU, 1, 0)
    for q, b in enumerate(sizes):
        k = _take_node(nodes, g)
        _cache_block(nodes, ch, ct, ps, g, k, 0, b, 0, q, q, 0)
    return nodes, ch, ct, ps, g


def test_lookup_takes_the_most_recent_block_that_fits():
    nodes, ch, ct, ps, g = _cache_of([100, 50, 200, 80, 60])
    assert ps[0, P_IDLE] == g[G_IDLE] == 490
    assert _lookup(nodes, ct, 0, 0, 70) == 3  # 60 is too small, 80 the most recent that fits
    assert _lookup(nodes, ct, 0, 0, 150) == 2
    assert _lookup(nodes, ct, 0, 0, 201) == -1
    _remove(nodes, ch, ct, ps, g, 3)  # a hit takes it out
    assert _lookup(nodes, ct, 0, 0, 70) == 2
    assert ps[0, P_IDLE] == g[G_IDLE] == 410


def test_lookup_looks_at_the_64_most_recent_blocks_of_a_class():
    assert SCAN_LIMIT == 64
    nodes, _, ct, _, _ = _cache_of([1000] + [10] * 63)
    assert _lookup(nodes, ct, 0, 0, 500) == 0
    nodes, _, ct, _, _ = _cache_of([1000] + [10] * 64)
    assert _lookup(nodes, ct, 0, 0, 500) == -1
