"""Offload admission through a served gateway: what reaches the simulator, the metric, and two replicas
sharing one doorkeeper through a real redis-server (including Redis being killed)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.ledger.redis_proc import RedisProcess
from tests.procs import ServerProcess

CAP = 8192
DOC_CHARS = 4096  # 1,024 byte tokens: 16 whole 64-token chunks


def doc(tag: str | None = None) -> str:
    seed = tag or uuid.uuid4().hex
    return (seed * (DOC_CHARS // len(seed) + 1))[:DOC_CHARS]


def admission_policy(root: Path, sim_url: str) -> PolicyDir:
    pools = {"offload": {"upstreams": [sim_url], "api_key_env": UPSTREAM_KEY_ENV}}
    policy = PolicyDir(root, pools, public_paths=["/livez", "/metrics"])
    policy.add_tenant("keep", offload={"max_offload_tokens": CAP, "admission": "returning"})
    policy.add_tenant("twice", offload={"admission": {"mode": "returning", "min_seen": 2, "window_s": 600}})
    policy.add_tenant("open", offload={"max_offload_tokens": CAP})
    return policy


def send(gateway: ServerProcess, key: str, prompt: str | list[int], **extra: Any) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 1, **extra}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def sent_params(sim: ServerProcess, reply: httpx.Response) -> Any:
    request_id = reply.headers["x-request-id"]
    records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
    matches = [record for record in records if record["request_id"] == request_id]
    assert len(matches) == 1
    return matches[0]["kv_transfer_params"]


def admission_count(gateway: ServerProcess, tenant: str, decision: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    sample = f'kvgate_offload_admission_total{{decision="{decision}",tenant="{tenant}"}}'
    line = next((line for line in text.splitlines() if line.startswith(sample)), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


@pytest.fixture(scope="module")
def gateway(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    root = tmp_path_factory.mktemp("admission")
    policy = admission_policy(root / "policies", sim.url)
    policy.write()
    with run_gateway(policy.root, root / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as server:
        yield server, policy


def test_a_new_prefix_stores_nothing_and_a_returning_one_gets_the_cap(
    gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    server, policy = gateway
    key = policy.keys["keep"]
    prompt = doc()
    assert sent_params(sim, send(server, key, prompt)) == {"max_offload_tokens": 0}
    assert sent_params(sim, send(server, key, prompt)) == {"max_offload_tokens": CAP}
    # Same document, a different question after it: the key covers the first 256 tokens only.
    assert sent_params(sim, send(server, key, prompt + " and then what?")) == {"max_offload_tokens": CAP}
    # A client's own smaller cap still wins on a returning prefix.
    reply = send(server, key, prompt, kv_transfer_params={"max_offload_tokens": 100})
    assert sent_params(sim, reply) == {"max_offload_tokens": 100}


def test_min_seen_two_needs_two_earlier_sightings(
    gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    server, policy = gateway
    key = policy.keys["twice"]
    prompt = [7 + (i % 900) for i in range(640)]  # token ids: 10 chunks
    seen = [sent_params(sim, send(server, key, prompt)) for _ in range(3)]
    assert seen == [{"max_offload_tokens": 0}, {"max_offload_tokens": 0}, None]


def test_short_prompts_and_chat_and_tenants_without_admission(
    gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    server, policy = gateway
    before = admission_count(server, "keep", "short")
    assert sent_params(sim, send(server, policy.keys["keep"], "hi")) == {"max_offload_tokens": 0}
    assert admission_count(server, "keep", "short") == before + 1
    chat = {"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": doc()}]}
    replies = [httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers=bearer(policy.keys["keep"]),
                          timeout=30) for _ in range(2)]
    assert [sent_params(sim, reply) for reply in replies] == [{"max_offload_tokens": 0}, {"max_offload_tokens": CAP}]
    prompt = doc()
    assert sent_params(sim, send(server, policy.keys["open"], prompt)) == {"max_offload_tokens": CAP}
    assert admission_count(server, "open", "new") == 0


def test_a_long_chat_message_is_admitted_by_the_content_the_engine_reads(
    gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    """A message repeating its content key after a long first value: the engine reads the second, so admission
    must key on it too, though the gateway reads a long prompt from its head."""
    server, policy = gateway
    first, second = (doc() * 20, doc() * 20)  # 80 KiB each: past HEAD_SPAN_FROM, so read from the head
    repeated = json.dumps({"model": SIM_MODEL, "max_tokens": 1, "messages": "MESSAGES"}).replace(
        '"MESSAGES"', f'[{{"role": "user", "content": {json.dumps(first)}, "content": {json.dumps(second)}}}]')

    def chat(body: str) -> httpx.Response:
        headers = {**bearer(policy.keys["keep"]), "content-type": "application/json"}
        return httpx.post(f"{server.url}/v1/chat/completions", content=body, headers=headers, timeout=30)

    def plain(content: str) -> str:
        return json.dumps({"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": content}]})

    assert sent_params(sim, chat(repeated)) == {"max_offload_tokens": 0}
    assert sent_params(sim, chat(plain(second))) == {"max_offload_tokens": CAP}  # the engine saw it before
    assert sent_params(sim, chat(plain(first))) == {"max_offload_tokens": 0}  # it never did


def test_decisions_are_counted(gateway: tuple[ServerProcess, PolicyDir]) -> None:
    server, policy = gateway
    key = policy.keys["keep"]
    new, returning = admission_count(server, "keep", "new"), admission_count(server, "keep", "returning")
    prompt = doc()
    send(server, key, prompt)
    send(server, key, prompt)
    assert admission_count(server, "keep", "new") == new + 1
    assert admission_count(server, "keep", "returning") == returning + 1


def test_two_replicas_share_the_doorkeeper_through_redis(sim: ServerProcess, tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis").start()
    policy = admission_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_REDIS_URL": redis.url}
    secret = new_secret()  # replicas share the salt secret, hence the fingerprint key
    key = policy.keys["keep"]
    try:
        with run_gateway(policy.root, tmp_path / "a.log", secret, env) as first, \
                run_gateway(policy.root, tmp_path / "b.log", secret, env) as second:
            prompt = doc()
            assert sent_params(sim, send(first, key, prompt)) == {"max_offload_tokens": 0}
            # Never seen by this replica, but seen by the other one: returning.
            assert sent_params(sim, send(second, key, prompt)) == {"max_offload_tokens": CAP}
            redis.kill()
            after = doc()
            assert sent_params(sim, send(second, key, after)) == {"max_offload_tokens": 0}
            assert sent_params(sim, send(second, key, after)) == {"max_offload_tokens": CAP}  # local sketch
            text = httpx.get(f"{second.url}/metrics", timeout=10).text
            assert 'kvgate_offload_admission_errors_total{tenant="keep"} 2.0' in text
    finally:
        redis.stop()


def test_a_reloaded_rule_decides_the_next_request(sim: ServerProcess, tmp_path: Path) -> None:
    """The feature keeps each tenant's rule between requests; a reload that changes `min_seen` must still decide
    the very next request."""
    policy = admission_policy(tmp_path / "policies", sim.url)
    policy.add_tenant("root", scopes=("admin",))
    policy.write()
    key = policy.keys["keep"]
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as server:
        prompt = doc()
        assert [sent_params(sim, send(server, key, prompt)) for _ in range(2)] == [
            {"max_offload_tokens": 0}, {"max_offload_tokens": CAP}]
        policy.tenants["keep"]["offload"]["admission"] = {"mode": "returning", "min_seen": 3}
        policy.write_tenant("keep", policy.tenants["keep"])
        reload = httpx.post(f"{server.url}/admin/reload", headers=bearer(policy.keys["root"]), timeout=30)
        assert reload.status_code == 200, reload.text
        # Seen twice before: enough under min_seen 1, not under 3.
        assert sent_params(sim, send(server, key, prompt)) == {"max_offload_tokens": 0}
        assert sent_params(sim, send(server, key, prompt)) == {"max_offload_tokens": CAP}
