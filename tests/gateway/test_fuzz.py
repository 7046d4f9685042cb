"""A bounded fuzz of a served gateway: a few hundred generated requests (every route, mutated methods, paths,
headers, encodings and bodies; loadtests/fuzz_requests.py) never get a 500 or a connection closed without an
answer, and the gateway's log stays JSON with no internal errors. The 10,000-request run is
loadtests/fuzz_gateway.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from loadtests.fuzz_requests import Credentials, requests, send_raw
from tests.gateway.conftest import UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.harness import PolicyDir, new_secret, run_gateway
from tests.procs import ServerProcess

EXAMPLES = 300


@pytest.fixture(scope="module")
def fuzzed(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Credentials]]:
    root = tmp_path_factory.mktemp("fuzz")
    policy = PolicyDir(root / "policies", {"offload": {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV}},
                       public_paths=["/livez", "/readyz"])
    policy.add_tenant("acme", cache={"isolation": "user"}, rollout={"user_header": "x-end-user"}, measure_ttft=True)
    policy.add_tenant("ops", scopes=("metrics", "admin"))
    policy.write()
    with run_gateway(policy.root, root / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield gateway, Credentials(inference=policy.keys["acme"], ops=policy.keys["ops"])


def test_generated_requests_never_get_a_500(fuzzed: tuple[ServerProcess, Credentials]) -> None:
    gateway, keys = fuzzed

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(request=requests(keys))
    def one(request: bytes) -> None:
        reply = send_raw(gateway.port, request)
        assert reply.status is not None, request[:300]
        assert reply.status != 500, (request[:300], reply.body[:300])

    one()
    assert_log_is_clean(gateway.log_path)


def assert_log_is_clean(log: Path) -> None:
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        assert entry.get("level") not in ("error", "critical"), line
        assert entry.get("outcome") != "internal_error", line
