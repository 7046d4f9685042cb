"""The GPU prefix cache (pure): reference counts, LRU eviction tail first, anonymous slots, drop and clear."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.gpu_cache import Acquired, PrefixCache


def test_a_fresh_pool_is_empty() -> None:
    cache = PrefixCache(4)
    assert (cache.cached_blocks, cache.blocks_in_use, cache.usage) == (0, 0, 0.0)
    assert cache.match([1, 2]) == 0
    assert not cache.contains(1)


def test_blocks_stay_cached_after_release() -> None:
    cache = PrefixCache(4)
    taken = cache.acquire([10, 11, 12])
    assert taken == Acquired(held=[10, 11, 12], anonymous=0, evicted=[])
    assert (cache.cached_blocks, cache.blocks_in_use, cache.usage) == (3, 3, 0.75)
    cache.release(taken)
    assert (cache.cached_blocks, cache.blocks_in_use, cache.usage) == (3, 0, 0.0)
    assert cache.match([10, 11, 12, 13]) == 3


def test_match_counts_leading_hits_only() -> None:
    cache = PrefixCache(8)
    cache.release(cache.acquire([1, 2, 3]))
    assert cache.match([]) == 0
    assert cache.match([1, 2, 3]) == 3
    assert cache.match([1, 9, 3]) == 1
    assert cache.match([9, 1, 2]) == 0


def test_a_released_request_is_evicted_tail_first() -> None:
    """vLLM frees a finished request's blocks in reverse, so the end of a prompt goes before its beginning."""
    cache = PrefixCache(3)
    cache.release(cache.acquire([1, 2, 3]))
    assert cache.acquire([4]).evicted == [3]
    assert cache.acquire([5]).evicted == [2]
    assert cache.match([1]) == 1 and not cache.contains(2) and not cache.contains(3)


def test_eviction_follows_release_order_across_requests() -> None:
    cache = PrefixCache(4)
    first, second = cache.acquire([1, 2]), cache.acquire([3, 4])
    cache.release(first)
    cache.release(second)
    taken = cache.acquire([5, 6, 7])
    assert taken.evicted == [2, 1, 4]
    assert taken.held == [5, 6, 7]
    assert cache.contains(3)


def test_a_hit_on_a_free_block_takes_it_out_of_the_lru_and_its_release_makes_it_newest() -> None:
    cache = PrefixCache(3)
    cache.release(cache.acquire([1, 2, 3]))  # LRU order: 3, 2, 1
    hit = cache.acquire([1])
    assert hit == Acquired(held=[1], anonymous=0, evicted=[])
    assert cache.blocks_in_use == 1
    assert cache.acquire([4]).evicted == [3]
    cache.release(hit)  # LRU order now: 2, 1
    assert cache.acquire([5]).evicted == [2]
    assert cache.acquire([6]).evicted == [1]


def test_a_block_shared_by_two_requests_stays_in_use_until_both_release() -> None:
    cache = PrefixCache(2)
    first, second = cache.acquire([7]), cache.acquire([7])
    assert (cache.cached_blocks, cache.blocks_in_use) == (1, 1)
    cache.release(first)
    assert cache.blocks_in_use == 1
    assert cache.acquire([8, 9]) == Acquired(held=[8], anonymous=0, evicted=[])  # 7 is still referenced
    cache.release(second)
    assert cache.acquire([9]).evicted == [7]


def test_a_full_pool_of_referenced_blocks_stops_the_allocation() -> None:
    """No preemption: what does not fit is left out (the prompt's tail stays uncached)."""
    cache = PrefixCache(3)
    cache.acquire([1, 2])
    taken = cache.acquire([3, 4, 5])
    assert taken == Acquired(held=[3], anonymous=0, evicted=[])
    assert (cache.cached_blocks, cache.blocks_in_use, cache.usage) == (3, 3, 1.0)
    assert cache.acquire([], anonymous=2) == Acquired()


def test_an_already_cached_block_needs_no_room_in_a_full_pool() -> None:
    cache = PrefixCache(2)
    cache.acquire([1, 2])
    assert cache.acquire([1, 2, 3]) == Acquired(held=[1, 2], anonymous=0, evicted=[])
    assert cache.blocks_in_use == 2


def test_anonymous_slots_occupy_the_pool_without_being_cached() -> None:
    cache = PrefixCache(4)
    cache.release(cache.acquire([1, 2]))
    taken = cache.acquire([3], anonymous=2)
    assert taken == Acquired(held=[3], anonymous=2, evicted=[2])  # four slots: 1, 3 and two anonymous
    assert (cache.cached_blocks, cache.blocks_in_use) == (2, 3)
    more = cache.acquire([], anonymous=5)
    assert more == Acquired(held=[], anonymous=1, evicted=[1])
    assert cache.usage == 1.0
    cache.release(more)
    cache.release(taken)
    assert (cache.cached_blocks, cache.blocks_in_use) == (1, 0)
    assert cache.contains(3)


def test_drop_forgets_only_unreferenced_blocks() -> None:
    cache = PrefixCache(4)
    held = cache.acquire([1, 2])
    cache.release(cache.acquire([3]))
    assert cache.drop([1, 3, 99]) == [3]
    assert cache.contains(1) and not cache.contains(3)
    cache.release(held)
    assert cache.drop([2, 1]) == [2, 1]
    assert cache.cached_blocks == 0
    # A dropped block has left the LRU queue too: filling the pool evicts nothing.
    assert cache.acquire([5, 6, 7, 8]).evicted == []


def test_drop_of_a_repeated_hash_forgets_it_once() -> None:
    cache = PrefixCache(2)
    cache.release(cache.acquire([1]))
    assert cache.drop([1, 1]) == [1]
    assert cache.cached_blocks == 0


def test_clear_is_refused_while_blocks_are_in_use() -> None:
    cache = PrefixCache(4)
    held = cache.acquire([1])
    assert cache.clear() is False
    assert cache.contains(1)
    cache.release(held)
    anonymous = cache.acquire([], anonymous=1)
    assert cache.clear() is False  # an anonymous slot is in use too
    cache.release(anonymous)
    assert cache.clear() is True
    assert (cache.cached_blocks, cache.blocks_in_use) == (0, 0)
    assert cache.acquire([2, 3, 4, 5]).evicted == []


def test_clear_of_an_empty_pool_succeeds() -> None:
    assert PrefixCache(1).clear() is True


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.lists(st.integers(0, 11), max_size=5), st.integers(0, 2)),
        st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("drop"), st.lists(st.integers(0, 11), max_size=4), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 6), ops=_OPS)
def test_random_operations_keep_the_pool_consistent(size: int, ops: list[tuple[str, object, int]]) -> None:
    """Against a hand-kept model: reference counts per hash, anonymous slots, the pool bound, evictions."""
    cache = PrefixCache(size)
    outstanding: list[Acquired] = []
    for op, arg, anonymous in ops:
        if op == "acquire":
            assert isinstance(arg, list)
            leading_hits = set(arg[: cache.match(arg)])
            taken = cache.acquire(arg, anonymous)
            assert taken.held == arg[: len(taken.held)]  # in order, stopping at the first that did not fit
            referenced = {h for a in outstanding for h in a.held}
            assert not set(taken.evicted) & referenced  # a referenced block is never evicted
            assert not set(taken.evicted) & leading_hits  # nor a leading hit of this allocation
            outstanding.append(taken)
        elif op == "release" and outstanding:
            assert isinstance(arg, int)
            cache.release(outstanding.pop(arg % len(outstanding)))
        elif op == "drop":
            assert isinstance(arg, list)
            referenced = {h for a in outstanding for h in a.held}
            assert not set(cache.drop(arg)) & referenced
        distinct = {h for a in outstanding for h in a.held}
        anonymous_total = sum(a.anonymous for a in outstanding)
        assert cache.blocks_in_use == len(distinct) + anonymous_total <= size
        assert cache.cached_blocks + anonymous_total <= size
        assert all(cache.contains(h) for h in distinct)
    for taken in outstanding:
        cache.release(taken)
    assert cache.blocks_in_use == 0
    assert cache.clear() is True
