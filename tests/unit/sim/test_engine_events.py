"""The engine's KV events through the real publisher on ipc:// sockets, read back through its replay endpoint:
which batches a request step makes, their order, chain parents, salts, evictions, resets and load failures, and
the emitted truth per salt and medium."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from gateway.sim.config import SimConfig
from gateway.sim.engine import LoadFailed
from gateway.sim.kv_events import Event
from gateway.sim.state import SimState
from tests.unit.sim.engine_kit import Batch, Published, published, request, serve, settings, tokens


def run(config: SimConfig, scenario: Any) -> Any:
    async def main() -> Any:
        async with published(config) as sim:
            return await scenario(sim)

    return asyncio.run(main())


def kinds(batch: Batch) -> list[tuple[str, str | None, int]]:
    return [(e["type"], e.get("medium"), len(e.get("block_hashes", []))) for e in batch.events]


def test_one_request_is_one_gpu_store_batch_with_the_salt_on_its_root() -> None:
    config = settings()

    async def scenario(sim: Published) -> list[Batch]:
        await serve(sim.engine, request(config, tokens(40, 1000), cache_salt="tenant-a"))
        return await sim.batches()

    (batch,) = run(config, scenario)
    assert batch.seq == 0 and isinstance(batch.ts, float)
    (stored,) = batch.events
    assert (stored["type"], stored["medium"], stored["parent_block_hash"]) == ("BlockStored", "GPU", None)
    assert stored["extra_keys"] == [["tenant-a"], None]  # two full blocks; the partial third is not cached
    assert stored["token_ids"] == tokens(32, 1000)
    assert stored["block_size"] == 16


def test_a_repeat_re_stores_only_the_recomputed_last_block_under_its_parent() -> None:
    config = settings()

    async def scenario(sim: Published) -> list[Batch]:
        prompt = tokens(64, 1000)
        await serve(sim.engine, request(config, prompt))
        await serve(sim.engine, request(config, prompt))
        return await sim.batches()

    first, second = run(config, scenario)
    hashes = first.events[0]["block_hashes"]
    assert len(hashes) == 4
    (again,) = second.events
    assert (again["block_hashes"], again["parent_block_hash"], again["extra_keys"]) == ([hashes[3]], hashes[2],
                                                                                         [None])
    assert again["token_ids"] == tokens(64, 1000)[48:]


def test_generated_blocks_are_a_second_batch_continuing_the_chain() -> None:
    config = settings()

    async def scenario(sim: Published) -> list[Batch]:
        await serve(sim.engine, request(config, tokens(30, 1000), max_tokens=20), tokens(20, 9000))
        return await sim.batches()

    prefill, decode = run(config, scenario)
    (root,) = prefill.events
    (grown,) = decode.events  # 30 + 19 tokens have KV: blocks 1 and 2 complete during decoding
    assert len(root["block_hashes"]) == 1
    assert grown["parent_block_hash"] == root["block_hashes"][0]
    assert grown["token_ids"] == [*tokens(30, 1000), *tokens(20, 9000)][16:48]
    assert len(grown["block_hashes"]) == 2 and grown["extra_keys"] == [None, None]


def test_evictions_follow_the_store_that_needed_the_room() -> None:
    config = settings(gpu_blocks=4)

    async def scenario(sim: Published) -> list[Batch]:
        await serve(sim.engine, request(config, tokens(64, 1000)))
        await serve(sim.engine, request(config, tokens(32, 5000)))
        return await sim.batches()

    first, second = run(config, scenario)
    evicted = first.events[0]["block_hashes"][2:]
    assert kinds(second) == [("BlockStored", "GPU", 2), ("BlockRemoved", "GPU", 1), ("BlockRemoved", "GPU", 1)]
    assert [e["block_hashes"][0] for e in second.events[1:]] == evicted[::-1]  # the tail went first


def test_a_reset_sends_all_blocks_cleared() -> None:
    config = settings()

    async def scenario(sim: Published) -> tuple[bool, list[Batch]]:
        await serve(sim.engine, request(config, tokens(32, 1000)))
        done = sim.engine.reset_prefix_cache(reset_external=False)
        return done, await sim.batches()

    done, batches = run(config, scenario)
    assert done and batches[-1].events == [{"type": "AllBlocksCleared"}]


def test_offload_stores_are_a_batch_after_the_gpu_store() -> None:
    config = settings(offload=True)

    async def scenario(sim: Published) -> list[Batch]:
        await serve(sim.engine, request(config, tokens(128, 1000)))
        return await sim.batches()

    gpu, cpu = run(config, scenario)
    hashes = gpu.events[0]["block_hashes"]
    assert [e["block_hashes"] for e in cpu.events] == [[hashes[3]], [hashes[7]]]
    assert all(e["medium"] == "CPU" for e in cpu.events)


def test_a_failed_load_announces_the_removal_of_the_blocks_it_was_filling() -> None:
    config = settings(offload=True, gpu_blocks=8)
    prompt = "[[sim:fail-load]]" + "x" * 111

    async def scenario(sim: Published) -> tuple[list[Batch], dict[str, Any], int]:
        await serve(sim.engine, request(config, prompt))
        await serve(sim.engine, request(config, tokens(128, 5000)))
        start = (await sim.batches())[-1].seq + 1
        with pytest.raises(LoadFailed):
            await serve(sim.engine, request(config, prompt))
        return await sim.batches(start), sim.publisher.truth.view(), sim.engine.cache.cached_blocks

    batches, truth, cached = run(config, scenario)
    stored, removed = batches
    # The failed request took all 8 slots (evicting the other prompt), then its blocks left the cache again.
    assert kinds(stored) == [("BlockStored", "GPU", 8)] + [("BlockRemoved", "GPU", 1)] * 8
    dropped = [e["block_hashes"][0] for e in removed.events]
    assert sorted(dropped) == sorted(stored.events[0]["block_hashes"])
    assert truth["by_salt"][""]["GPU"]["resident"] == cached == 0


def test_a_recomputed_load_announces_the_discarded_chunks_and_their_new_copies() -> None:
    config = settings(offload=True, gpu_blocks=8, load_failure_policy="recompute")
    prompt = "[[sim:fail-load]]" + "x" * 111

    async def scenario(sim: Published) -> list[Batch]:
        await serve(sim.engine, request(config, prompt))
        await serve(sim.engine, request(config, tokens(128, 5000)))
        start = (await sim.batches())[-1].seq + 1
        await serve(sim.engine, request(config, prompt))
        return await sim.batches(start)

    step, offload = run(config, scenario)
    (discarded,) = [e for e in step.events if e["medium"] == "CPU"]
    assert discarded["type"] == "BlockRemoved" and len(discarded["block_hashes"]) == 2
    assert [e["block_hashes"] for e in offload.events] == [[h] for h in discarded["block_hashes"]]


def test_a_request_cancelled_in_prefill_still_announces_the_blocks_it_took() -> None:
    config = settings(base_ttft_ms=3_600_000.0)  # only cancellation ends this prefill

    async def scenario(sim: Published) -> tuple[list[Batch], int]:
        async with asyncio.TaskGroup() as group:
            task = group.create_task(sim.engine.prefill(request(config, tokens(64, 1000)), 0.0))
            deadline = asyncio.get_running_loop().time() + 10
            while sim.engine.running != 1:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.001)
            task.cancel()
        return await sim.batches(), sim.engine.cache.cached_blocks

    batches, cached = run(config, scenario)
    assert [kinds(b) for b in batches] == [[("BlockStored", "GPU", 4)]]
    assert cached == 4  # the blocks stay cached after the abort, as the event says


def test_the_truth_counts_per_salt_and_medium() -> None:
    config = settings(offload=True, gpu_blocks=8)

    async def scenario(sim: Published) -> dict[str, Any]:
        await serve(sim.engine, request(config, tokens(64, 1000), cache_salt="a"))
        await serve(sim.engine, request(config, tokens(128, 2000), cache_salt="b"))  # evicts a's 4 GPU blocks
        await sim.drained()
        return sim.publisher.truth.view()

    view = run(config, scenario)
    assert view["by_salt"] == {
        "a": {"CPU": {"stored": 1, "removed": 0, "resident": 1}, "GPU": {"stored": 4, "removed": 4, "resident": 0}},
        "b": {"CPU": {"stored": 2, "removed": 0, "resident": 2}, "GPU": {"stored": 8, "removed": 0, "resident": 8}},
    }
    assert view["batches_sent"] == 4


def test_sequence_numbers_count_batches_from_zero_without_gaps() -> None:
    config = settings()

    async def scenario(sim: Published) -> tuple[list[int], int, int]:
        for start in range(5):
            await serve(sim.engine, request(config, tokens(20, 1000 + 100 * start)))
        batches = await sim.batches()
        return [b.seq for b in batches], sim.publisher.enqueued, sim.publisher.dropped

    seqs, enqueued, dropped = run(config, scenario)
    assert (seqs, enqueued, dropped) == ([0, 1, 2, 3, 4], 5, 0)


def test_no_events_are_built_without_an_endpoint() -> None:
    config = settings(offload=True)
    state = SimState.build(config)
    assert state.publisher is None and state.engine.sink.enabled is False
    assert state.engine.offload is not None
    events: list[Event] = state.engine.offload.store(tokens(64, 1), list(range(4)), None)
    assert events == []


_REQUESTS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 3), st.sampled_from([None, "a"]), st.integers(0, 20),
              st.booleans()),
    min_size=1, max_size=12,
)


@examples(max_examples=25, deadline=None)
@given(requests=_REQUESTS, policy=st.sampled_from(["fail", "recompute"]))
def test_the_truth_always_matches_what_the_caches_hold(requests: list[tuple[int, int, str | None, int, bool]],
                                                       policy: str) -> None:
    """Random requests over shared prefixes, a 6-block GPU pool and a 3-chunk CPU tier (32-token chunks), with a
    share of failing loads and prefix-cache resets: after every request, the blocks the KV events say are resident
    are exactly the blocks the GPU cache and the CPU tier hold."""
    config = settings(offload=True, gpu_blocks=6, offload_block_size=32, cpu_bytes_to_use=3 * 32 * 147456,
                      fail_loads=0.5, load_failure_policy=policy, seed=7)

    async def scenario(sim: Published) -> None:
        tier = sim.engine.offload
        assert tier is not None
        for prefix, blocks, salt, output, reset in requests:
            prompt = tokens(16 * prefix, 1000) + tokens(16 * blocks + 5, 3000 + 100 * blocks)
            with contextlib.suppress(LoadFailed):
                await serve(sim.engine, request(config, prompt, cache_salt=salt, max_tokens=output + 1),
                            tokens(output, 9000))
            if reset:
                assert sim.engine.reset_prefix_cache(reset_external=False)
            await sim.drained()
            resident = sim.publisher.truth.resident
            gpu = {block for medium, block in resident if medium == "GPU"}
            cpu = {block for medium, block in resident if medium == "CPU"}
            assert len(gpu) == sim.engine.cache.cached_blocks and all(sim.engine.cache.contains(b) for b in gpu)
            assert len(cpu) == len(tier.tier) and all(key in tier.tier for key in cpu)

    run(config, scenario)
