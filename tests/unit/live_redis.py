"""A real redis-server for unit tests of the stores that speak Redis, one per test session and folder.

Import the fixture into an area's conftest (`from tests.unit.live_redis import redis_server as redis_server`);
each test uses its own key prefix or flushes the database it uses, so tests stay order-independent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ledger.redis_proc import RedisProcess


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path_factory.mktemp("unit-redis")).start()
    try:
        yield server
    finally:
        server.stop()
