"""The writer never dies: store faults injected into real processes (a SQLite lock held by another
connection past busy_timeout, a Redis switched to a read-only replica, a Redis at `maxmemory`, a Redis
SIGKILLed mid-stream). Each is logged, counted and retried; afterwards new events reach the store again
without anyone calling the audit (which flushes by itself), and nothing within the spool bound is lost."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from gateway.ledger.auditor import LedgerUnavailable
from gateway.ledger.base import LedgerStore
from gateway.ledger.redis_store import RedisStore
from gateway.ledger.sqlite_store import SqliteStore
from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, removed, stored
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import SECRET, Backend, Running, eventually, running_ledger, write_policies
from tests.procs import free_port

TENANTS: dict[str, dict[str, Any]] = {"acme": {}}
SALT = expected_salt(SECRET, "acme", 1)
T = TypeVar("T")


def _publish(publisher: VllmPublisher, first: int, batches: int) -> None:
    """Each batch stores three acme blocks and removes the first: +3 stored, +1 removed."""
    for index in range(batches):
        base = first + 10 * index
        publisher.publish([stored([base, base + 1, base + 2], salt=SALT)])
        publisher.publish([removed([base])])


async def _open_store(backend: Backend) -> LedgerStore:
    if backend.redis_url is not None:
        return await RedisStore.open(backend.redis_url, prefix=backend.prefix)
    return await SqliteStore.open(backend.state_path)


def _in_store(backend: Backend) -> Callable[[], Awaitable[tuple[int, int]]]:
    """(stored, removed) acme GPU records as another reader of the store sees them: no flush is forced."""
    async def probe() -> tuple[int, int]:
        store = await _open_store(backend)
        try:
            records = [r for r in await store.records(None, "acme") if r.medium == "GPU"]
        except Exception:  # the store is still refusing: not there yet
            return (-1, -1)
        finally:
            await store.close()
        return len(records), sum(r.removed_at is not None for r in records)
    return probe


def _errors(ledger: Running, kind: str) -> Callable[[], Awaitable[float]]:
    async def probe() -> float:
        return ledger.sample("kvgate_ledger_store_errors_total", kind=kind)
    return probe


async def _caught_up_and_writing(publisher: VllmPublisher, backend: Backend, ledger: Running) -> None:
    """After the fault: the six batches sent before and during it are all stored, and the writer keeps going."""
    await eventually(_in_store(backend), lambda seen: seen == (18, 6))
    _publish(publisher, 9000, 1)
    await eventually(_in_store(backend), lambda seen: seen == (21, 7))
    assert _writer_alive(ledger)


def _writer_alive(ledger: Running) -> bool:
    """The writer handled the fault itself: still running, never restarted by the supervisor."""
    tasks = ledger.service.runner.running
    running = any(task.get_name().endswith("ledger-writer") and not task.done() for task in tasks)
    return running and ledger.sample("kvgate_ledger_task_restarts_total", task="ledger-writer") == 0


def test_a_sqlite_lock_held_past_busy_timeout_is_retried(tmp_path: Path, publisher: VllmPublisher) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")

    async def scenario() -> None:
        async with running_ledger(root, backend, sqlite_busy_timeout_ms=50) as ledger:
            _publish(publisher, 1000, 3)
            await eventually(_in_store(backend), lambda seen: seen == (9, 3))
            holder = sqlite3.connect(backend.state_path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
            try:
                _publish(publisher, 5000, 3)
                await eventually(_errors(ledger, "OperationalError"), lambda count: count >= 2)
                assert _writer_alive(ledger)
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            await _caught_up_and_writing(publisher, backend, ledger)
            assert ledger.sample("kvgate_kv_event_gaps_total", source="offload/0") == 0

    asyncio.run(scenario())


def test_redis_read_only_replica_then_primary_again(
    tmp_path: Path, redis_server: RedisProcess, publisher: VllmPublisher
) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=redis_server.url)
    admin = redis.Redis(port=redis_server.port)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            _publish(publisher, 1000, 3)
            await eventually(_in_store(backend), lambda seen: seen == (9, 3))
            # A failover demotes this server: a replica of a primary it cannot reach keeps its data, read-only.
            admin.replicaof("127.0.0.1", free_port())
            try:
                _publish(publisher, 5000, 3)
                await eventually(_errors(ledger, "ReadOnlyError"), lambda count: count >= 2)
                assert _writer_alive(ledger)
            finally:
                admin.replicaof("NO", "ONE")
            await _caught_up_and_writing(publisher, backend, ledger)

    try:
        asyncio.run(scenario())
    finally:
        admin.replicaof("NO", "ONE")
        admin.close()


def test_redis_at_maxmemory_is_retried(tmp_path: Path, publisher: VllmPublisher) -> None:
    server = RedisProcess(tmp_path / "redis").start()
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)
    admin = redis.Redis(port=server.port)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            _publish(publisher, 1000, 3)
            await eventually(_in_store(backend), lambda seen: seen == (9, 3))
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")  # every write is now refused with OOM
            _publish(publisher, 5000, 3)
            await eventually(_errors(ledger, "OutOfMemoryError"), lambda count: count >= 2)
            assert _writer_alive(ledger)
            admin.config_set("maxmemory", "0")
            await _caught_up_and_writing(publisher, backend, ledger)

    try:
        asyncio.run(scenario())
    finally:
        admin.close()
        server.stop()


def test_redis_sigkilled_mid_stream_and_restarted(tmp_path: Path, publisher: VllmPublisher) -> None:
    redis_dir = tmp_path / "redis"
    server = RedisProcess(redis_dir, persistent=True).start()
    restarted = RedisProcess(redis_dir, persistent=True, port=server.port)
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            _publish(publisher, 1000, 3)
            await eventually(_in_store(backend), lambda seen: seen == (9, 3))
            server.kill()
            _publish(publisher, 5000, 3)
            await eventually(_errors(ledger, "unavailable"), lambda count: count >= 2)
            with pytest.raises(LedgerUnavailable) as refused:  # /admin/audit answers 503, not 500
                await ledger.audit()
            assert refused.value.status_code == 503
            restarted.start()
            await _caught_up_and_writing(publisher, backend, ledger)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        restarted.stop()


def test_a_ledger_task_that_ends_is_restarted_and_counted(tmp_path: Path, publisher: VllmPublisher) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError("a fault nobody foresaw")
        await asyncio.Event().wait()  # the third run stays up

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            ledger.service.runner.keep_running("test-task", flaky)
            await eventually(
                lambda: _value((ledger.sample("kvgate_ledger_task_restarts_total", task="test-task"), len(runs))),
                lambda seen: seen == (2.0, 3))

    asyncio.run(scenario())


async def _value(value: T) -> T:
    return value


def test_redis_sigkilled_while_a_large_flush_is_in_flight(tmp_path: Path, publisher: VllmPublisher) -> None:
    """Killed right after 60,000 block events were published: wherever the kill lands (before, during or after
    a flush), the store ends with every block once, and nothing is reported missing."""
    redis_dir = tmp_path / "redis"
    server = RedisProcess(redis_dir, persistent=True).start()
    restarted = RedisProcess(redis_dir, persistent=True, port=server.port)
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([stored([1], salt=SALT)])
            await eventually(_in_store(backend), lambda seen: seen == (1, 0))
            for first in (10**6, 2 * 10**6, 3 * 10**6):
                publisher.publish([stored(list(range(first, first + 20_000)), parent=1, block_size=1)])
            await eventually(lambda: _value(ledger.service.writer.pending_ops), lambda ops: ops > 0)
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(restarted.start)  # the ledger's loop keeps running meanwhile
            await eventually(_in_store(backend), lambda seen: seen == (60_001, 0), timeout_s=60)
            assert ledger.sample("kvgate_kv_event_gaps_total", source="offload/0") == 0

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        restarted.stop()
