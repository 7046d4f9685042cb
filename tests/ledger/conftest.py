"""Ledger test fixtures: a real redis-server for the session, and each store backend per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ledger.publisher import VllmPublisher
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import Backend


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path / "ledger.sqlite3")
    server: RedisProcess = request.getfixturevalue("redis_server")
    return Backend("redis", tmp_path / "unused.sqlite3", redis_url=server.url)


@pytest.fixture
def publisher() -> Iterator[VllmPublisher]:
    pub = VllmPublisher()
    try:
        yield pub
    finally:
        pub.stop()
