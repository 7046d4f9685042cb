"""Per-user salts of an `isolation: user` tenant are remembered as digests in a bounded LRU, with metrics
(a real gateway in front of the simulator, the LRU set small through KVGATE_LEDGER_USER_SALTS)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy
from tests.harness import bearer, new_secret, run_gateway
from tests.procs import ServerProcess
from tests.sim.helpers import poll

CAPACITY = 100


def sample(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_remembered_user_salts_stay_within_capacity_and_are_counted(sim: ServerProcess, tmp_path: Path) -> None:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_LEDGER_USER_SALTS": str(CAPACITY)}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env) as gateway, \
            httpx.Client(base_url=gateway.url, headers=bearer(policy.keys["gamma"]), timeout=30) as client:
        for number in range(CAPACITY + 40):
            body = {"model": SIM_MODEL, "prompt": "p", "max_tokens": 1, "user": f"user-{number:04d}-" + "x" * 200}
            assert client.post("/v1/completions", json=body).status_code == 200

        def metrics() -> str:
            return httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["ops"]), timeout=10).text

        def evicted() -> str | None:
            text = metrics()
            return text if sample(text, "kvgate_user_salts_evicted_total") > 0 else None

        text = poll(evicted, what="evictions counted")
        assert sample(text, "kvgate_user_salts_remembered") == CAPACITY
        assert sample(text, "kvgate_user_salts_evicted_total") >= 40
