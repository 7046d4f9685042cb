"""The salt-epoch floor (docs/policies.md, `cache.salt_epoch`).

`kvgate tenant forget` raises a tenant's epoch so no block cached under an earlier salt can be hit again. A
policy set that later lowers the epoch (a GitOps roll-back, an old ConfigMap) would make those blocks
reachable again, so the highest epoch ever in force is kept per tenant in the store — SQLite beside the
ledger, or Redis when replicas share one — and a set that goes below it is refused like any invalid set.

Check and raise are one atomic step in the store (one SQLite transaction, one Lua script), so two replicas
loading different sets at once cannot both win. The floor of a tenant outlives the tenant: re-adding a
removed tenant at a lower epoch is refused too.
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gateway.policy.loader import PolicySet
from gateway.storage import Backend, Storage, errors_with_redis
from gateway.storage.sqlite import SqliteWorker

if TYPE_CHECKING:
    import redis.asyncio as aioredis

REDIS_KEY = "kvgate:epoch_floors"
SQLITE_SCHEMA = "CREATE TABLE IF NOT EXISTS policy_epoch_floors (tenant TEXT PRIMARY KEY, epoch INTEGER NOT NULL)"
# KEYS[1]: the hash; ARGV: tenant, epoch pairs. Returns the violated pairs (tenant, floor), or raises all.
CHECK_AND_RAISE_LUA = """
local below = {}
for i = 1, #ARGV, 2 do
  local floor = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) < floor then
    table.insert(below, ARGV[i])
    table.insert(below, tostring(floor))
  end
end
if #below > 0 then return below end
for i = 1, #ARGV, 2 do
  local floor = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) > floor then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return below
"""


def store_errors() -> tuple[type[Exception], ...]:
    """What a floor store raises when its backend cannot answer (Redis's errors only once Redis is loaded)."""
    return errors_with_redis(sqlite3.Error, OSError)


class FloorStoreUnavailable(Exception):
    pass


class FloorStore(Protocol):
    async def check_and_raise(self, epochs: Mapping[str, int]) -> dict[str, int]:
        """Atomically: the tenants whose epoch is below their floor (with the floor), changing nothing; or {}
        after raising every floor to the given epoch where it is higher."""
        ...

    async def floors(self) -> dict[str, int]: ...


def policy_epochs(policies: PolicySet) -> dict[str, int]:
    return {name: tenant.cache.salt_epoch for name, tenant in policies.tenants.items()}


def lowered(epochs: Mapping[str, int], floors: Mapping[str, int]) -> dict[str, int]:
    """Tenants whose epoch is below their floor, with that floor. Pure."""
    return {name: floors[name] for name, epoch in sorted(epochs.items()) if epoch < floors.get(name, -1)}


def describe(below: Mapping[str, int], epochs: Mapping[str, int]) -> list[str]:
    """One policy-check line per lowered tenant, in the loader's `file: field: message` form."""
    return [f"tenants/{name}.yaml: cache.salt_epoch: {epochs.get(name)} is below {floor}, the highest epoch ever "
            f"in force for {name!r}; a lower epoch would make blocks cached before a forget reachable again"
            for name, floor in sorted(below.items())]


class SqliteFloorStore:
    """The floor in the process's SQLite file (its own table), on the process's one SQLite worker thread."""

    def __init__(self, worker: SqliteWorker) -> None:
        self.worker = worker

    async def check_and_raise(self, epochs: Mapping[str, int]) -> dict[str, int]:
        try:
            return await self.worker.transaction(_check_and_raise_sql, dict(epochs))
        except sqlite3.Error as error:
            raise FloorStoreUnavailable(str(error)) from error

    async def floors(self) -> dict[str, int]:
        try:
            return await self.worker.run(_floors_sql)
        except sqlite3.Error as error:
            raise FloorStoreUnavailable(str(error)) from error


def _floors_sql(db: sqlite3.Connection) -> dict[str, int]:
    return {str(name): int(epoch) for name, epoch in db.execute("SELECT tenant, epoch FROM policy_epoch_floors")}


def _check_and_raise_sql(db: sqlite3.Connection, epochs: dict[str, int]) -> dict[str, int]:
    """Inside one BEGIN IMMEDIATE transaction: a single writer, so check and raise cannot interleave."""
    below = lowered(epochs, _floors_sql(db))
    if not below:
        db.executemany(
            "INSERT INTO policy_epoch_floors (tenant, epoch) VALUES (?, ?) ON CONFLICT (tenant) "
            "DO UPDATE SET epoch = excluded.epoch WHERE excluded.epoch > policy_epoch_floors.epoch",
            sorted(epochs.items()))
    return below


class RedisFloorStore:
    """The floor in one Redis hash, shared by every replica, on the process's Redis pool."""

    def __init__(self, client: aioredis.Redis, key: str = REDIS_KEY) -> None:
        self.client = client
        self.key = key
        self._script = client.register_script(CHECK_AND_RAISE_LUA)

    async def check_and_raise(self, epochs: Mapping[str, int]) -> dict[str, int]:
        args = [part for name, epoch in sorted(epochs.items()) for part in (name, str(epoch))]
        try:
            found = await self._script(keys=[self.key], args=args)
        except store_errors() as error:
            raise FloorStoreUnavailable(str(error)) from error
        pairs = [item.decode() if isinstance(item, bytes) else str(item) for item in found]
        return {pairs[i]: int(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    async def floors(self) -> dict[str, int]:
        try:
            reply = self.client.hgetall(self.key)
            raw = await reply if inspect.isawaitable(reply) else reply
        except store_errors() as error:
            raise FloorStoreUnavailable(str(error)) from error
        return {name.decode(): int(epoch) for name, epoch in raw.items()}


async def open_floor_store(storage: Storage) -> FloorStore:
    """The floor store on the process's storage (the caller owns and closes the storage)."""
    if storage.backend is Backend.REDIS:
        return RedisFloorStore(storage.redis_client())
    worker = storage.sqlite_worker()
    try:
        await worker.run(lambda db: db.execute(SQLITE_SCHEMA))
    except sqlite3.Error as error:
        raise FloorStoreUnavailable(str(error)) from error
    return SqliteFloorStore(worker)


async def floor_problems(redis_url: str | None, state_path: Path, policies: PolicySet) -> list[str]:
    """For `kvgate policy check`: the set's epochs against the floors in this host's store (read only).
    Nothing to compare with when there is no store yet."""
    if not redis_url and not await asyncio.to_thread(state_path.exists):
        return []
    storage = await Storage.open(redis_url, state_path)
    try:
        floors = await (await open_floor_store(storage)).floors()
    finally:
        await storage.close()
    epochs = policy_epochs(policies)
    return describe(lowered(epochs, floors), epochs)
