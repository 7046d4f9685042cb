"""The two-tier replay (gateway.plan.replay): the GPU prefix-cache model, LRU stack distances, the CPU tier's
loads at each size, and the sampling error bound, each against figures worked out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.plan.replay import (
    CacheShape,
    GpuModel,
    StackDistances,
    TierShares,
    replay,
    share_error_bound,
    shares_at,
)
from tests.unit.plan.traces import BLOCK, blocks, fingerprint, rec

NO_GPU = CacheShape(gpu_blocks=0, block_size=BLOCK, offload_block_tokens=64)


def _keys(*names: str) -> list[bytes]:
    return [fingerprint(name) for name in names]


# -- the GPU prefix cache -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "hit"), [
    (40, 32),  # two full blocks cached, the partial tail is not: both blocks hit
    (32, 16),  # the prompt ends on a block boundary: its last token is never a hit, so one block less
    (33, 32),
    (17, 16),
])
def test_a_repeated_prompt_hits_its_full_blocks_but_never_its_last_token(prompt: int, hit: int) -> None:
    gpu = GpuModel(capacity_blocks=10)
    chain = _keys("a", "b")
    assert gpu.request(chain, 1.0, prompt, 1, BLOCK) == 0
    assert gpu.request(chain, 1.0, prompt, 1, BLOCK) == hit


def test_a_hit_stops_at_the_first_block_not_cached() -> None:
    gpu = GpuModel(capacity_blocks=10)
    gpu.request(_keys("a", "b", "c"), 1.0, 48, 1, BLOCK)
    assert gpu.request(_keys("a", "x", "c"), 1.0, 48, 1, BLOCK) == 16


def test_a_prompt_is_evicted_tail_first() -> None:
    """Capacity 3 blocks. [a, b] is released tail first (b older than a); [c, d] needs two blocks and evicts b,
    the least recently released; [a, b] again then hits a only."""
    gpu = GpuModel(capacity_blocks=3)
    gpu.request(_keys("a", "b"), 1.0, 32, 1, BLOCK)
    gpu.request(_keys("c", "d"), 1.0, 32, 1, BLOCK)
    assert gpu.request(_keys("a", "b"), 1.0, 33, 1, BLOCK) == 16


def test_a_zero_capacity_cache_never_hits() -> None:
    gpu = GpuModel(capacity_blocks=0)
    for _ in range(3):
        assert gpu.request(_keys("a", "b"), 1.0, 40, 1, BLOCK) == 0


def test_output_blocks_take_room_and_evict_the_prompt() -> None:
    """Capacity 2: a one-block prompt whose 33-token output completes two more blocks pushes its own block out
    (those output blocks can never be matched by a later prompt)."""
    gpu = GpuModel(capacity_blocks=2)
    gpu.request(_keys("a"), 1.0, 16, 34, BLOCK)
    gpu.request(_keys("x"), 1.0, 16, 34, BLOCK)
    assert gpu.request(_keys("a"), 1.0, 17, 1, BLOCK) == 0
    roomy = GpuModel(capacity_blocks=4)
    roomy.request(_keys("a"), 1.0, 16, 34, BLOCK)
    assert roomy.request(_keys("a"), 1.0, 17, 1, BLOCK) == 16


def test_a_text_fingerprint_weighs_a_fraction_of_a_block() -> None:
    """Half-block fingerprints: four of them are two blocks, the hit is floored to whole blocks."""
    gpu = GpuModel(capacity_blocks=10)
    chain = _keys("t0", "t1", "t2")
    gpu.request(chain, 0.5, 24, 1, BLOCK)
    assert gpu.request(chain, 0.5, 40, 1, BLOCK) == 16  # 1.5 blocks matched, floored to one


# -- stack distances ------------------------------------------------------------------------------------------


def test_stack_distance_counts_distinct_keys_since_the_last_reference() -> None:
    stack = StackDistances(capacity=10)
    assert stack.distance(b"a") == -1
    for key in (b"a", b"b", b"c", b"b"):
        stack.reference(key)
    assert [stack.distance(key) for key in (b"a", b"b", b"c", b"z")] == [2, 0, 1, -1]


def _naive_distance(history: list[bytes], key: bytes) -> int:
    if key not in history:
        return -1
    last = len(history) - 1 - history[::-1].index(key)
    return len(set(history[last + 1:]))


@given(st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), max_size=40))
@settings(max_examples=80, deadline=None)
def test_stack_distances_match_a_naive_lru_stack(stream: list[bytes]) -> None:
    stack = StackDistances(capacity=len(stream))
    history: list[bytes] = []
    for key in stream:
        assert stack.distance(key) == _naive_distance(history, key)
        stack.reference(key)
        history.append(key)


# -- the CPU tier ---------------------------------------------------------------------------------------------


RequestArgs = dict[str, int | None]


def _replayed_doc_twice(first: RequestArgs, second: RequestArgs, honour: bool = True) -> list[TierShares]:
    """A 128-token document (8 blocks, 2 chunks of 64) sent twice, no GPU cache: the tier at 0..3 chunks."""
    names = blocks("doc", 8)
    trace = [rec(names, max_offload=first.get("max_offload"), max_load=first.get("max_load")),
             rec(names, max_offload=second.get("max_offload"), max_load=second.get("max_load"))]
    replayed = replay(trace, NO_GPU, honour)
    return [shares_at(replayed, size) for size in range(4)]


def test_a_returning_document_loads_from_the_tier_only_when_both_chunks_fit() -> None:
    """The second request looks up chunk 0 (distance 1: chunk 1 came after it) then chunk 1 (distance 0); a
    one-chunk LRU tier holds chunk 1 only, so the leading chunk misses and nothing loads."""
    shares = _replayed_doc_twice({}, {})
    assert [s.cpu_tokens for s in shares] == [0.0, 0.0, 128.0, 128.0]
    assert [s.prompt_tokens for s in shares] == [256.0] * 4
    assert shares[2].cpu_share == 0.5 and shares[2].gpu_share == 0.0


@pytest.mark.parametrize(("cap", "loaded_at_two"), [
    (None, 128.0), (128, 128.0), (64, 64.0), (100, 64.0), (63, 0.0), (0, 0.0),
])
def test_max_load_tokens_caps_the_load_to_whole_chunks(cap: int | None, loaded_at_two: float) -> None:
    shares = _replayed_doc_twice({}, {"max_load": cap})
    assert shares[2].cpu_tokens == loaded_at_two


def test_a_server_that_ignores_max_load_loads_everything() -> None:
    shares = _replayed_doc_twice({}, {"max_load": 64}, honour=False)
    assert shares[2].cpu_tokens == 128.0


@pytest.mark.parametrize(("cap", "loaded"), [(None, 128.0), (64, 64.0), (127, 64.0), (0, 0.0)])
def test_max_offload_tokens_limits_what_the_first_request_stores(cap: int | None, loaded: float) -> None:
    """Only chunks within the first `cap` tokens are stored; the second request loads the stored run."""
    shares = _replayed_doc_twice({"max_offload": cap}, {})
    assert shares[3].cpu_tokens == loaded


def test_a_gpu_hit_shifts_the_lookup_to_the_first_missing_token() -> None:
    """GPU of one block: the second request hits 16 tokens on the GPU; the tier serves the rest of chunk 0 and
    chunk 1 (128 - 16 = 112 tokens), and a GPU-only tier size serves nothing more."""
    shape = CacheShape(gpu_blocks=1, block_size=BLOCK, offload_block_tokens=64)
    names = blocks("doc", 8)
    replayed = replay([rec(names), rec(names)], shape)
    assert [r.gpu_hit for r in replayed] == [0, 16]
    assert replayed[1].start_offset == 16
    assert shares_at(replayed, 0).gpu_tokens == 16.0
    assert shares_at(replayed, 2).cpu_tokens == 112.0


def test_fewer_than_one_chunk_loads_nothing() -> None:
    """A 72-token prompt is one full chunk; the GPU holds 4 blocks (64 tokens), so the tier would add at most 0
    tokens of chunk 0: nothing is loaded."""
    shape = CacheShape(gpu_blocks=8, block_size=BLOCK, offload_block_tokens=64)
    names = blocks("doc", 4)
    replayed = replay([rec(names, prompt=72), rec(names, prompt=72)], shape)
    assert replayed[1].gpu_hit == 64
    assert shares_at(replayed, 10).cpu_tokens == 0.0


def test_cpu_shares_never_fall_as_the_tier_grows() -> None:
    trace = [rec(blocks(f"doc{i % 5}", 8 + i % 3), ts=float(i)) for i in range(40)]
    replayed = replay(trace, CacheShape(gpu_blocks=12, block_size=BLOCK, offload_block_tokens=64))
    shares = [shares_at(replayed, size).cpu_share for size in range(12)]
    assert shares == sorted(shares)
    assert shares[0] == 0.0 and shares[-1] > 0.0
    assert all(s.gpu_tokens + s.cpu_tokens <= s.prompt_tokens
               for s in (shares_at(replayed, size) for size in range(12)))


def test_shares_of_nothing_are_zero_and_per_root_totals_add_up() -> None:
    assert (shares_at([], 4).gpu_share, shares_at([], 4).cpu_share) == (0.0, 0.0)
    trace = [rec(blocks("a", 8)), rec(blocks("b", 4)), rec(blocks("a", 8))]
    shares = shares_at(replay(trace, NO_GPU), 4)
    assert set(shares.per_root) == {fingerprint("a:0"), fingerprint("b:0")}
    assert shares.per_root[fingerprint("a:0")] == (256.0, 0.0, 128.0)
    assert shares.per_root[fingerprint("b:0")] == (64.0, 0.0, 0.0)


# -- the sampling error bound ---------------------------------------------------------------------------------


def test_error_bound_of_two_root_clusters() -> None:
    """Roots a (100 prompt, 100 CPU) and b (100 prompt, 0 CPU) at rate 0.5: CPU share 0.5, residuals 50² + 50²,
    SE = sqrt(2/1 · 5000) / 200 · sqrt(1 - 0.5); half-width 1.96 · SE. The GPU column has no spread."""
    shares = TierShares(cpu_chunks=1, prompt_tokens=200.0, gpu_tokens=0.0, cpu_tokens=100.0,
                        per_root={b"a": (100.0, 0.0, 100.0), b"b": (100.0, 0.0, 0.0)})
    gpu, cpu = share_error_bound(shares, 0.5)
    assert gpu == 0.0
    assert cpu == pytest.approx(1.96 * math.sqrt(2 * 5000) / 200 * math.sqrt(0.5))


@pytest.mark.parametrize(("rate", "roots", "prompt"), [(1.0, 2, 200.0), (0.5, 1, 200.0), (0.5, 2, 0.0)])
def test_no_error_bound_without_sampling_or_spread(rate: float, roots: int, prompt: float) -> None:
    per_root = {bytes([i]): (prompt / 2, 0.0, float(i * 50)) for i in range(roots)}
    shares = TierShares(cpu_chunks=1, prompt_tokens=prompt, cpu_tokens=50.0, per_root=per_root)
    assert share_error_bound(shares, rate) == (0.0, 0.0)


def test_the_error_bound_narrows_as_the_rate_nears_one() -> None:
    shares = TierShares(cpu_chunks=1, prompt_tokens=300.0, gpu_tokens=30.0, cpu_tokens=100.0,
                        per_root={b"a": (100.0, 0.0, 90.0), b"b": (100.0, 30.0, 10.0), b"c": (100.0, 0.0, 0.0)})
    bounds = [share_error_bound(shares, rate)[1] for rate in (0.1, 0.5, 0.9, 0.99)]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] > 0.0
