"""The ledger as `kvgate serve` hosts it: requests go through a served gateway, KV events come from real
publishers over ZMQ, and every total is read back from `GET /admin/audit`. Nothing the gateway does is
done by hand here: it issues the salts (per user too), remembers them and writes the ledger itself.

Expected totals are hand-computed: the simulator tokenizes one token per byte into 16-token blocks, so a
512-character prompt stores exactly 32 GPU blocks.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_with_kv_events
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.ledger.publisher import VllmPublisher, removed, stored
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import counts
from tests.procs import ServerProcess

DEADLINE_S = 30.0
PROMPT_CHARS = 512
BLOCKS_PER_PROMPT = 32  # 512 tokens / 16 tokens per block
SECRET = new_secret()


def ledger_env(**extra: str) -> dict[str, str]:
    return {"KVGATE_LEDGER_FLUSH_INTERVAL_S": "0.05", "KVGATE_LEDGER_REPLAY_TIMEOUT_S": "0.5",
            "KVGATE_LEDGER_PROBE_INTERVAL_S": "0.3", "KVGATE_LEDGER_LOST_AFTER_S": "60",
            "KVGATE_LEDGER_SALT_REFRESH_S": "0.1", "KVGATE_LEDGER_REDIS_PREFIX": f"kvgate-test:{uuid.uuid4().hex}:",
            UPSTREAM_KEY_ENV: UPSTREAM_KEY, **extra}


def write_policy(root: Path, upstream: str, sources: list[str]) -> PolicyDir:
    pools = {"offload": {"upstreams": [upstream], "api_key_env": UPSTREAM_KEY_ENV, "kv_events": sources}}
    policy = PolicyDir(root, pools)
    policy.add_tenant("acme", offload={"retention_seconds": 3600, "allowed_media": ["GPU", "CPU"]})
    policy.add_tenant("gamma", cache={"isolation": "user"}, offload={"allowed_media": ["GPU"]})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    return policy


def audit(gateway: ServerProcess, policy: PolicyDir) -> dict[str, Any]:
    reply = httpx.get(f"{gateway.url}/admin/audit", headers=bearer(policy.keys["root"]), timeout=DEADLINE_S)
    assert reply.status_code == 200, reply.text
    report: dict[str, Any] = reply.json()
    return report


def audit_until(gateway: ServerProcess, policy: PolicyDir, check: Any) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while not check(report := audit(gateway, policy)):
        assert time.monotonic() < deadline, f"audit never satisfied the check; last report: {report}"
        time.sleep(0.05)  # polling the served audit, not synchronisation
    return report


@pytest.fixture
def sim_with_events(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    with sim_with_kv_events(tmp_path / "sim") as found:
        yield found


def _prompt(label: str) -> str:
    return f"{label} document ".ljust(PROMPT_CHARS, "x")  # distinct first block per label


def _complete(gateway: ServerProcess, key: str, prompt: str, **extra: object) -> None:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 1, **extra}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=DEADLINE_S)
    assert reply.status_code == 200, reply.text


def test_requests_through_the_gateway_are_attributed_per_tenant_and_per_user(
    tmp_path: Path, sim_with_events: tuple[ServerProcess, int]
) -> None:
    """Wrong version: the proxy stops telling the ledger which per-user salts it issued; every block of the
    user-isolated tenant then lands in `unattributed`."""
    sim, events = sim_with_events
    policy = write_policy(tmp_path / "policies", sim.url, [f"tcp://127.0.0.1:{events}"])
    with run_gateway(policy.root, tmp_path / "gateway.log", SECRET, ledger_env()) as gateway:
        _complete(gateway, policy.keys["acme"], _prompt("acme one"))
        _complete(gateway, policy.keys["acme"], _prompt("acme two"))
        _complete(gateway, policy.keys["gamma"], _prompt("shared"), user="alice")
        _complete(gateway, policy.keys["gamma"], _prompt("shared"), user="bob")  # same text, another salt
        # Straight to the simulator with a salt kvgate never issued: stored, and nobody's.
        httpx.post(f"{sim.url}/v1/completions", timeout=DEADLINE_S, headers=bearer(UPSTREAM_KEY),
                   json={"model": SIM_MODEL, "prompt": _prompt("stranger"), "max_tokens": 1,
                         "cache_salt": "not-issued-by-kvgate"}).raise_for_status()
        report = audit_until(gateway, policy, lambda r: counts(r, "unattributed", "GPU")[0] == BLOCKS_PER_PROMPT
                             and counts(r, "gamma", "GPU")[0] == 2 * BLOCKS_PER_PROMPT
                             and counts(r, "acme", "GPU")[0] == 2 * BLOCKS_PER_PROMPT)
        assert counts(report, "acme", "GPU") == (64, 0, 64)
        assert counts(report, "gamma", "GPU") == (64, 0, 64)
        assert counts(report, "unattributed", "GPU") == (32, 0, 32)
        assert report["gaps"][0]["missing_batches"] == 0
        text = str(report) + gateway.log_text()
        for tenant, user in (("acme", None), ("gamma", "alice"), ("gamma", "bob")):
            assert expected_salt(SECRET, tenant, 1, user) not in text


def test_user_salts_the_gateway_issued_survive_a_gateway_restart(
    tmp_path: Path, sim_with_events: tuple[ServerProcess, int]
) -> None:
    """The second gateway never sees alice's request; it attributes her blocks from the stored salt digests."""
    sim, events = sim_with_events
    policy = write_policy(tmp_path / "policies", sim.url, [f"tcp://127.0.0.1:{events}"])
    env = ledger_env(KVGATE_STATE_PATH=str(tmp_path / "ledger.sqlite3"))
    with run_gateway(policy.root, tmp_path / "first.log", SECRET, env) as gateway:
        _complete(gateway, policy.keys["gamma"], _prompt("before restart"), user="alice")
        audit_until(gateway, policy, lambda r: counts(r, "gamma", "GPU")[0] == BLOCKS_PER_PROMPT)
    with run_gateway(policy.root, tmp_path / "second.log", SECRET, env) as gateway:
        alice = expected_salt(SECRET, "gamma", 1, "alice")
        httpx.post(f"{sim.url}/v1/completions", timeout=DEADLINE_S, headers=bearer(UPSTREAM_KEY),
                   json={"model": SIM_MODEL, "prompt": _prompt("after restart"), "max_tokens": 1,
                         "cache_salt": alice}).raise_for_status()
        report = audit_until(gateway, policy, lambda r: counts(r, "gamma", "GPU")[0] == 2 * BLOCKS_PER_PROMPT)
        assert counts(report, "unattributed", "GPU") == (0, 0, 0)


# -- two sources with the same sequence numbers ---------------------------------------------------------


@pytest.fixture
def two_publishers() -> Iterator[tuple[VllmPublisher, VllmPublisher]]:
    first, second = VllmPublisher(), VllmPublisher()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {}
        return
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield {"KVGATE_REDIS_URL": server.url}
    finally:
        server.stop()


def test_two_sources_with_equal_sequence_numbers_are_both_recorded(
    tmp_path: Path, two_publishers: tuple[VllmPublisher, VllmPublisher], store_env: dict[str, str]
) -> None:
    """Each source numbers its batches from 0, at the same timestamps here. Wrong version: records keyed by
    sequence (and time) alone, so the second source's batches look like replays of the first's."""
    first, second = two_publishers
    policy = write_policy(tmp_path / "policies", "http://127.0.0.1:9", [first.endpoint, second.endpoint])
    salt = expected_salt(SECRET, "acme", 1)
    with run_gateway(policy.root, tmp_path / "gateway.log", SECRET, ledger_env(**store_env)) as gateway:
        ts = time.time()
        for index in range(5):
            for number, publisher in enumerate((first, second)):
                base = 10_000 * (number + 1) + 10 * index
                seq = publisher.publish([stored([base, base + 1], salt=salt)], ts=ts + index)
                assert seq == index
        first.publish([removed([10_000])], ts=ts + 5)
        second.publish([removed([20_000])], ts=ts + 5)
        report = audit_until(gateway, policy, lambda r: counts(r, "acme", "GPU") == (20, 2, 18))
        gaps = {row["source"]: row["missing_batches"] for row in report["gaps"]}
        assert gaps == {"offload/0": 0, "offload/1": 0}


# -- Redis killed while a flush is in flight ----------------------------------------------------------------


def _redis_unread_bytes(port: int) -> int:
    """Bytes clients sent to Redis that it has not read (its sockets' receive queues), from /proc/net/tcp."""
    unread = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        state, queues = fields[3], fields[4]
        if local_port == port and state == "01":  # ESTABLISHED, Redis's end of a client connection
            unread += int(queues.split(":")[1], 16)
    return unread


@contextmanager
def _stopped(server: RedisProcess) -> Iterator[None]:
    assert server.popen is not None
    os.kill(server.popen.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if server.popen.poll() is None:
            os.kill(server.popen.pid, signal.SIGCONT)


def test_redis_killed_during_a_flush_loses_nothing_and_counts_nothing_twice(
    tmp_path: Path, two_publishers: tuple[VllmPublisher, VllmPublisher]
) -> None:
    """Redis is frozen (SIGSTOP) so the gateway's next flush is sent and never answered, then SIGKILLed with
    that flush in flight, then restarted from its append-only file. Wrong version: a writer that drops the
    batch it was writing when the connection breaks."""
    publisher, _unused = two_publishers
    redis_dir = tmp_path / "redis"
    server = RedisProcess(redis_dir, persistent=True).start()
    restarted = RedisProcess(redis_dir, persistent=True, port=server.port)
    policy = write_policy(tmp_path / "policies", "http://127.0.0.1:9", [publisher.endpoint])
    salt = expected_salt(SECRET, "acme", 1)
    # Salt refresh off: the only Redis traffic while it is frozen is the ledger's flush.
    env = ledger_env(KVGATE_REDIS_URL=server.url, KVGATE_LEDGER_SALT_REFRESH_S="3600")
    with ExitStack() as cleanup:
        cleanup.callback(restarted.stop)
        cleanup.callback(server.stop)
        gateway = cleanup.enter_context(run_gateway(policy.root, tmp_path / "gateway.log", SECRET, env))
        for index in range(5):
            publisher.publish([stored([1000 + 10 * index, 1001 + 10 * index], salt=salt)])
        audit_until(gateway, policy, lambda r: counts(r, "acme", "GPU") == (10, 0, 10))
        with _stopped(server):
            for index in range(5):
                publisher.publish([stored([5000 + 10 * index, 5001 + 10 * index], salt=salt)])
            publisher.publish([removed([1000, 5000])])
            deadline = time.monotonic() + DEADLINE_S
            while _redis_unread_bytes(server.port) < 200:  # the flush of those batches, sent and unanswered
                assert time.monotonic() < deadline, "the gateway never sent a flush to the frozen Redis"
                time.sleep(0.05)  # polling the kernel's socket queues, not synchronisation
            server.kill()
        restarted.start()
        report = audit_until(gateway, policy, lambda r: counts(r, "acme", "GPU") == (20, 2, 18))
        assert report["gaps"][0]["missing_batches"] == 0
        stored_total = _metric(gateway, policy, 'kvgate_kv_blocks_stored_total{medium="GPU",tenant="acme"}')
        assert stored_total == 20


def _metric(gateway: ServerProcess, policy: PolicyDir, series: str) -> float:
    reply = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["root"]), timeout=DEADLINE_S)
    line = next(line for line in reply.text.splitlines() if line.startswith(series + " "))
    return float(line.rsplit(" ", 1)[1])
