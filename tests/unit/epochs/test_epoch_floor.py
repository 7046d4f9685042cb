"""The salt-epoch floor: the pure comparison and its messages, both stores' atomic check-and-raise on real SQLite
files and a real redis-server, and the guard's state machine (start, admit, cached check, installs, settling what
was installed while the store was away)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.epochs.floor import (
    FloorStore,
    FloorStoreUnavailable,
    RedisFloorStore,
    SqliteFloorStore,
    describe,
    floor_problems,
    lowered,
    open_floor_store,
    policy_epochs,
)
from gateway.epochs.guard import EpochFloorGuard
from gateway.policy.loader import PolicyLoadError, PolicySet
from gateway.policy.model import CachePolicy, GatewayConfig, TenantPolicy
from gateway.storage import Storage
from tests.ledger.redis_proc import RedisProcess
from tests.procs import free_port


def client_on(port: int) -> aioredis.Redis:
    """A client that fails at once when nothing answers (redis-py's default retries would take seconds)."""
    return aioredis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))


GATEWAY = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"})


def policies(**epochs: int) -> PolicySet:
    tenants = {name: TenantPolicy(tenant=name, cache=CachePolicy(salt_epoch=epoch)) for name, epoch in epochs.items()}
    return PolicySet(gateway=GATEWAY, tenants=tenants, keys={}, version="test")


@pytest.mark.parametrize(("epochs", "floors", "below"), [
    ({}, {}, {}),
    ({"a": 1}, {}, {}),  # no floor yet: anything goes
    ({"a": 0}, {}, {}),  # epoch 0 is above the "no floor" of -1
    ({"a": 3}, {"a": 3}, {}),  # equal is not lower
    ({"a": 4}, {"a": 3}, {}),
    ({"a": 2}, {"a": 3}, {"a": 3}),
    ({"a": 0}, {"a": 1_000_000}, {"a": 1_000_000}),
    ({"a": 2, "b": 9, "c": 1}, {"a": 3, "b": 9, "c": 5}, {"a": 3, "c": 5}),
    ({"a": 5}, {"a": 1, "gone": 7}, {}),  # a removed tenant's floor does not concern this set
])
def test_lowered_names_each_tenant_below_its_floor_with_the_floor(epochs: dict[str, int], floors: dict[str, int],
                                                                  below: dict[str, int]) -> None:
    assert lowered(epochs, floors) == below


def test_each_lowered_tenant_gets_one_line_in_the_loaders_form_sorted() -> None:
    assert describe({"zed": 4, "acme": 2}, {"acme": 1, "zed": 3}) == [
        "tenants/acme.yaml: cache.salt_epoch: 1 is below 2, the highest epoch ever in force for 'acme'; a lower "
        "epoch would make blocks cached before a forget reachable again",
        "tenants/zed.yaml: cache.salt_epoch: 3 is below 4, the highest epoch ever in force for 'zed'; a lower "
        "epoch would make blocks cached before a forget reachable again",
    ]
    assert describe({}, {"acme": 1}) == []


def test_policy_epochs_reads_each_tenants_salt_epoch_with_its_default() -> None:
    default = PolicySet(gateway=GATEWAY, tenants={"b": TenantPolicy(tenant="b")}, keys={}, version="v")
    assert policy_epochs(policies(a=7)) == {"a": 7}
    assert policy_epochs(default) == {"b": 1}


# --- the stores: one atomic check-and-raise ------------------------------------------------------------------------


async def check_store_semantics(store: FloorStore) -> None:
    assert await store.floors() == {}
    assert await store.check_and_raise({"a": 2, "b": 5}) == {}
    assert await store.floors() == {"a": 2, "b": 5}
    # one tenant lowered: refused, and nothing is raised, not even the tenant that went up
    assert await store.check_and_raise({"a": 9, "b": 4}) == {"b": 5}
    assert await store.floors() == {"a": 2, "b": 5}
    assert await store.check_and_raise({"a": 3}) == {}  # b left the set: its floor stays
    assert await store.check_and_raise({"b": 1}) == {"b": 5}  # and re-adding it lower is refused
    assert await store.check_and_raise({"a": 3, "b": 5, "c": 0}) == {}  # equal floors: nothing to write
    assert await store.floors() == {"a": 3, "b": 5, "c": 0}
    assert await store.check_and_raise({}) == {}


def test_the_sqlite_store_checks_and_raises_atomically(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        try:
            await check_store_semantics(await open_floor_store(storage))
        finally:
            await storage.close()

    asyncio.run(run())
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:  # committed where another process reads it
        assert dict(db.execute("SELECT tenant, epoch FROM policy_epoch_floors")) == {"a": 3, "b": 5, "c": 0}


def test_the_sqlite_floors_survive_a_reopen(tmp_path: Path) -> None:
    async def run() -> dict[str, int]:
        for epochs in ({"a": 4}, {"a": 2}):
            storage = await Storage.open(None, tmp_path / "state.sqlite3")
            await (await open_floor_store(storage)).check_and_raise(epochs)
            await storage.close()
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        floors = await (await open_floor_store(storage)).floors()
        await storage.close()
        return floors

    assert asyncio.run(run()) == {"a": 4}


def test_a_sqlite_file_that_cannot_be_written_is_store_unavailable(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_floor_store(storage)
        assert isinstance(store, SqliteFloorStore)
        await storage.sqlite_worker().run(lambda db: db.execute("DROP TABLE policy_epoch_floors"))
        with pytest.raises(FloorStoreUnavailable, match="no such table"):
            await store.floors()
        with pytest.raises(FloorStoreUnavailable, match="no such table"):
            await store.check_and_raise({"a": 1})
        await storage.close()

    asyncio.run(run())


@pytest.mark.redis
def test_the_redis_store_checks_and_raises_atomically(redis_server: RedisProcess) -> None:
    async def run() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        key = f"test:floors:{free_port()}"
        try:
            await check_store_semantics(RedisFloorStore(client, key))
            assert await client.hgetall(key) == {b"a": b"3", b"b": b"5", b"c": b"0"}  # type: ignore[misc]
        finally:
            await client.delete(key)
            await client.aclose()

    asyncio.run(run())


def test_an_unreachable_redis_is_store_unavailable() -> None:
    async def run() -> None:
        client = client_on(free_port())
        store = RedisFloorStore(client)
        with pytest.raises(FloorStoreUnavailable):
            await store.floors()
        with pytest.raises(FloorStoreUnavailable):
            await store.check_and_raise({"a": 1})
        await client.aclose()

    asyncio.run(run())


def test_policy_check_reads_floors_only_where_a_store_exists(tmp_path: Path) -> None:
    async def run() -> None:
        state = tmp_path / "state.sqlite3"
        assert await floor_problems(None, state, policies(a=1)) == []
        assert not state.exists()  # `policy check` never creates a store
        storage = await Storage.open(None, state)
        await (await open_floor_store(storage)).check_and_raise({"a": 3})
        await storage.close()
        assert await floor_problems(None, state, policies(a=3)) == []
        (line,) = await floor_problems(None, state, policies(a=2))
        assert line.startswith("tenants/a.yaml: cache.salt_epoch: 2 is below 3")

    asyncio.run(run())


# --- the guard ----------------------------------------------------------------------------------------------------


def test_the_guard_refuses_a_start_that_lowers_an_epoch(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        guard = EpochFloorGuard(await open_floor_store(storage))
        await guard.start(policies(a=5))
        restarted = EpochFloorGuard(await open_floor_store(storage))
        with pytest.raises(PolicyLoadError) as raised:
            await restarted.start(policies(a=4))
        assert raised.value.problems[0].startswith("tenants/a.yaml: cache.salt_epoch: 4 is below 5")
        await storage.close()

    asyncio.run(run())


def test_the_guard_admits_raises_and_refuses_against_the_store(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_floor_store(storage)
        guard = EpochFloorGuard(store)
        await guard.start(policies(a=1, b=1))
        assert await guard.admit(policies(a=2, b=1)) == []
        assert guard.cached == {"a": 2, "b": 1}
        problems = await guard.admit(policies(a=1, b=1))
        assert len(problems) == 1 and "for 'a'" in problems[0]
        assert guard.check_cached(policies(a=1, b=1)) == problems
        assert guard.check_cached(policies(a=2, b=7)) == []
        assert await store.floors() == {"a": 2, "b": 1}
        await storage.close()

    asyncio.run(run())


def test_a_floor_raised_by_another_replica_is_learnt_from_the_refusal(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_floor_store(storage)
        guard = EpochFloorGuard(store)
        await guard.start(policies(a=1))
        await store.check_and_raise({"a": 6})  # another replica installed a forget
        assert guard.check_cached(policies(a=3)) == []  # not known yet
        assert await guard.admit(policies(a=3)) != []
        assert guard.cached["a"] == 6
        assert guard.check_cached(policies(a=3)) != []  # learnt
        await storage.close()

    asyncio.run(run())


def test_while_the_store_is_away_the_guard_checks_cached_floors_and_settles_later(tmp_path: Path) -> None:
    async def run() -> None:
        port = free_port()
        client = client_on(port)
        guard = EpochFloorGuard(RedisFloorStore(client, "kvgate:epoch_floors"))
        guard.cached = {"a": 3}
        await guard.start(policies(a=4))  # the store is away: admitted against the cached floors
        assert guard.cached == {"a": 4}
        assert (await guard.admit(policies(a=2)))[0].startswith("tenants/a.yaml: cache.salt_epoch: 2 is below 4")
        await guard.settle()  # still away: nothing lost, nothing raised
        server = RedisProcess(tmp_path / "redis", port=port).start()
        try:
            await guard.settle()
            assert await RedisFloorStore(client).floors() == {"a": 4}
            await client.hset("kvgate:epoch_floors", "a", "1")  # type: ignore[misc]
            await guard.settle()  # settled once: not written again
            assert await RedisFloorStore(client).floors() == {"a": 1}
        finally:
            await client.aclose()
            server.stop()

    asyncio.run(run())


def test_installs_raise_the_cached_floors_and_mark_them_for_settling(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_floor_store(storage)
        guard = EpochFloorGuard(store)
        guard.on_installed(policies(a=2, b=3))
        assert guard.cached == {"a": 2, "b": 3}
        await guard.settle()
        assert await store.floors() == {"a": 2, "b": 3}
        guard.on_installed(policies(a=1))  # lower than cached: the cache keeps the higher value
        assert guard.cached == {"a": 2, "b": 3}
        await storage.close()

    asyncio.run(run())


def test_a_start_with_no_store_and_nothing_cached_admits_and_remembers() -> None:
    async def run() -> None:
        client = client_on(free_port())  # a real Redis client with nothing listening
        guard = EpochFloorGuard(RedisFloorStore(client))
        await guard.start(policies(a=2))
        assert guard.cached == {"a": 2}
        assert guard.check_cached(policies(a=1)) != []
        await client.aclose()

    asyncio.run(run())
