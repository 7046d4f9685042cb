"""Several gateway replicas on one Redis, and Redis dying mid-stream: one count, nothing lost."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, placeholder, removed, stored
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import SECRET, Backend, Running, counts, eventually, running_ledger, write_policies

TENANTS: dict[str, dict[str, Any]] = {"acme": {}, "globex": {}}


def _script(publisher: VllmPublisher, first: int, batches: int) -> None:
    for index in range(batches):
        base = first + 100 * index
        publisher.publish([stored([base, base + 1, base + 2], salt=expected_salt(SECRET, "acme", 1)),
                           stored([base + 50], salt=expected_salt(SECRET, "globex", 1)), placeholder(base + 2)])
        publisher.publish([removed([base])])


def test_two_replicas_on_one_stream_count_once(
    tmp_path: Path, redis_server: RedisProcess, publisher: VllmPublisher
) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=redis_server.url)

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            replicas: list[Running] = [await stack.enter_async_context(running_ledger(root, backend))
                                       for _replica in range(2)]
            _script(publisher, 1000, 10)
            for ledger in replicas:
                report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (30, 10, 20))
                assert counts(report, "acme", "CPU") == (10, 0, 10)
                assert counts(report, "globex", "GPU") == (10, 0, 10)
            stored_total = sum(ledger.sample("kvgate_kv_blocks_stored_total", tenant="acme", medium="GPU")
                               for ledger in replicas)
            assert stored_total == 30  # each batch was written, and counted, by one replica

    asyncio.run(scenario())


def test_redis_killed_mid_stream_loses_nothing(tmp_path: Path, publisher: VllmPublisher) -> None:
    redis_dir = tmp_path / "redis"
    server = RedisProcess(redis_dir, persistent=True).start()
    restarted = RedisProcess(redis_dir, persistent=True, port=server.port)
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            _script(publisher, 1000, 5)
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (15, 5, 10))
            server.kill()
            _script(publisher, 5000, 5)  # arrives while Redis is down: spooled
            await eventually(_spool_state(ledger), lambda state: state == (False, True))
            restarted.start()
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (30, 10, 20))
            assert counts(report, "acme", "CPU") == (10, 0, 10)
            assert report["gaps"][0]["missing_batches"] == 0

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        restarted.stop()


def _spool_state(ledger: Running) -> Any:
    async def probe() -> tuple[bool, bool]:
        writer = ledger.service.writer
        return writer.available, writer.pending_ops >= 30  # 10 batches of the second half, at least
    return probe


def test_what_overflows_the_spool_is_reported_as_a_gap(tmp_path: Path, publisher: VllmPublisher) -> None:
    redis_dir = tmp_path / "redis"
    server = RedisProcess(redis_dir, persistent=True).start()
    restarted = RedisProcess(redis_dir, persistent=True, port=server.port)
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)
    salt = expected_salt(SECRET, "acme", 1)

    async def scenario() -> None:
        async with running_ledger(root, backend, spool_events=100_000) as ledger:
            publisher.publish([stored([1], salt=salt)])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 1)
            server.kill()
            for first in (10**6, 2 * 10**6, 3 * 10**6):  # 3 x 40,000 block events; the spool holds 100,000
                publisher.publish([stored(list(range(first, first + 40_000)), parent=1, block_size=1)])
            await eventually(_gap_count(ledger), lambda gaps: gaps == 1)
            restarted.start()
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 80_001)
            assert report["gaps"][0]["missing_batches"] == 1

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        restarted.stop()


def _gap_count(ledger: Running) -> Any:
    async def probe() -> float:
        return ledger.sample("kvgate_kv_event_gaps_total", source="offload/0")
    return probe
