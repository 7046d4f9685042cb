"""The miss path through a served gateway: failed CPU-tier loads (simulated as vLLM's `fail` policy), 5xx,
refused connections, and what must not be retried. Servers: a 0.25.0-like offload simulator that ignores
`max_load_tokens`, a 0.32.0-like one that honours it, and a control simulator without a CPU tier."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess, free_port
from tests.sim.helpers import poll, sse_data

FAIL = "[[sim:fail-load]]"
OFFLOAD_FLAGS = ("--offload", "--gpu-blocks", "64", "--cpu-bytes-to-use", str(64 * 64 * 147456),
                 "--decode-ms-per-token", "0", "--prefill-us-per-token", "2")


@dataclass
class MissStack:
    gateway: ServerProcess
    old: ServerProcess  # reports 0.25.0 and ignores max_load_tokens
    new: ServerProcess  # reports 0.32.0 and honours it
    control: ServerProcess
    policy: PolicyDir

    def key(self, tenant: str) -> str:
        return self.policy.keys[tenant]


def policy_for(root: Path, old: str, new: str, control: str, dead: str) -> PolicyDir:
    auth = {"api_key_env": UPSTREAM_KEY_ENV}
    pools = {"old": {"upstreams": [old], **auth}, "new": {"upstreams": [new], **auth},
             "old_forced": {"upstreams": [old], "recompute": "max_load_tokens", **auth},
             "control": {"upstreams": [control], **auth}, "dead": {"upstreams": [dead], **auth}}
    policy = PolicyDir(root, pools, public_paths=["/livez", "/metrics"])
    retry = {"miss_path": "retry"}
    policy.add_tenant("auto", offload=retry, rollout={"pool": "old"})
    policy.add_tenant("honours", offload=retry, rollout={"pool": "new"})
    policy.add_tenant("forced", offload=retry, rollout={"pool": "old_forced", "else_pool": "control"})
    policy.add_tenant("gone", offload=retry, rollout={"pool": "dead", "else_pool": "control"})
    policy.add_tenant("plain", rollout={"pool": "old"})
    policy.add_tenant("timed", offload=retry, rollout={"pool": "old"}, measure_ttft=True)
    return policy


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MissStack]:
    root = tmp_path_factory.mktemp("miss")
    with sim_process(root, *OFFLOAD_FLAGS, "--ignore-max-load-tokens") as old, \
            sim_process(root, *OFFLOAD_FLAGS, "--vllm-version", "0.32.0") as new, \
            sim_process(root, "--decode-ms-per-token", "0") as control:
        policy = policy_for(root / "policies", old.url, new.url, control.url, f"http://127.0.0.1:{free_port()}")
        policy.write()
        env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
        with run_gateway(policy.root, root / "gateway.log", new_secret(), env) as gateway:
            yield MissStack(gateway, old, new, control, policy)


def prompt(failing: bool = True) -> str:
    text = uuid.uuid4().hex * 16  # 512 byte tokens
    return (FAIL + text)[:512] if failing else text


def complete(stack: MissStack, tenant: str, text: str, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {"model": SIM_MODEL, "prompt": text, "max_tokens": 4, "stream": stream}
    return httpx.post(f"{stack.gateway.url}/v1/completions", json=body, headers=bearer(stack.key(tenant)), timeout=30)


def in_cpu_tier_only(stack: MissStack, tenant: str, text: str) -> None:
    """Store `text` in the CPU tier of the tenant's pool, then push it out of that server's GPU cache."""
    assert complete(stack, tenant, text).status_code == 200
    for _ in range(3):
        assert complete(stack, tenant, prompt(failing=False)).status_code == 200


def sim_records(sim: ServerProcess, request_id: str) -> list[dict[str, Any]]:
    records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
    return [r for r in records if (r["request_id"] or "").startswith(request_id)]


def miss_count(stack: MissStack, tenant: str, pool: str, action: str, result: str) -> float:
    text = httpx.get(f"{stack.gateway.url}/metrics", timeout=10).text
    sample = f'kvgate_miss_path_total{{action="{action}",pool="{pool}",result="{result}",tenant="{tenant}"}} '
    line = next((line for line in text.splitlines() if line.startswith(sample)), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def log_entry(stack: MissStack, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for line in stack.gateway.log_text().splitlines():
            if request_id in line and line.startswith("{"):
                entry: dict[str, Any] = json.loads(line)
                if entry.get("event") == "request" and entry.get("request_id") == request_id:
                    return entry
        return None
    return poll(find, what="the request's log line")


def test_a_failed_load_is_answered_by_a_one_time_salt_on_a_025_server(stack: MissStack) -> None:
    text = prompt()
    in_cpu_tier_only(stack, "auto", text)
    before = miss_count(stack, "auto", "old", "recompute_salt", "ok")
    reply = complete(stack, "auto", text)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # recomputed
    first, retry = sim_records(stack.old, reply.headers["x-request-id"])
    assert first["outcome"] == "load_failed" and retry["outcome"] == "completed"
    assert retry["request_id"].endswith("-retry1")
    assert retry["cache_salt"] != first["cache_salt"]
    assert retry["kv_transfer_params"] == {"max_offload_tokens": 0}
    assert miss_count(stack, "auto", "old", "recompute_salt", "ok") == before + 1
    entry = log_entry(stack, reply.headers["x-request-id"])
    assert entry["status"] == 200
    assert entry["miss_path"] == [{"pool": "old", "failure": "status_500"},
                                  {"pool": "old", "action": "recompute_salt", "result": "ok"}]


def test_a_stream_whose_first_event_is_an_error_is_retried(stack: MissStack) -> None:
    text = prompt()
    in_cpu_tier_only(stack, "auto", text)
    reply = complete(stack, "auto", text, stream=True)
    assert reply.status_code == 200
    events = sse_data(reply.text)
    assert not any(isinstance(event, dict) and "error" in event for event in events)
    assert "".join(event["choices"][0]["text"] for event in events if isinstance(event, dict) and event["choices"])
    outcomes = [r["outcome"] for r in sim_records(stack.old, reply.headers["x-request-id"])]
    assert outcomes == ["load_failed", "completed"]
    assert log_entry(stack, reply.headers["x-request-id"])["miss_path"][0]["failure"] == "error_event"


def test_measure_ttft_tenants_are_retried_too(stack: MissStack) -> None:
    # The gateway streams from upstream for them and answers in one body: the error event comes first there.
    text = prompt()
    in_cpu_tier_only(stack, "timed", text)
    reply = complete(stack, "timed", text)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"]
    outcomes = [r["outcome"] for r in sim_records(stack.old, reply.headers["x-request-id"])]
    assert outcomes == ["load_failed", "completed"]
    assert log_entry(stack, reply.headers["x-request-id"])["miss_path"][0]["failure"] == "error_event"


def test_a_server_that_honours_max_load_tokens_keeps_its_gpu_cache(stack: MissStack) -> None:
    text = prompt()
    in_cpu_tier_only(stack, "honours", text)
    reply = complete(stack, "honours", text)
    assert reply.status_code == 200, reply.text
    first, retry = sim_records(stack.new, reply.headers["x-request-id"])
    assert retry["kv_transfer_params"] == {"max_load_tokens": 0}
    assert retry["cache_salt"] == first["cache_salt"]
    assert miss_count(stack, "honours", "new", "recompute_max_load_tokens", "ok") >= 1


def test_max_load_tokens_on_a_025_server_fails_again_and_else_pool_answers(stack: MissStack) -> None:
    text = prompt()
    in_cpu_tier_only(stack, "forced", text)
    reply = complete(stack, "forced", text)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-kvgate-pool"] == "control"
    outcomes = [r["outcome"] for r in sim_records(stack.old, reply.headers["x-request-id"])]
    assert outcomes == ["load_failed", "load_failed"]  # 0.25.0 ignored max_load_tokens: 0 and loaded again
    assert [r["outcome"] for r in sim_records(stack.control, reply.headers["x-request-id"])] == ["completed"]
    assert miss_count(stack, "forced", "old_forced", "recompute_max_load_tokens", "failed") >= 1
    assert miss_count(stack, "forced", "control", "else_pool", "ok") >= 1


def test_a_refused_connection_goes_to_else_pool(stack: MissStack) -> None:
    reply = complete(stack, "gone", prompt(failing=False))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-kvgate-pool"] == "control"
    assert miss_count(stack, "gone", "dead", "recompute_salt", "failed") >= 1
    entry = log_entry(stack, reply.headers["x-request-id"])
    assert entry["miss_path"][0] == {"pool": "dead", "failure": "UpstreamConnectError"}


def test_no_retry_when_the_policy_says_off(stack: MissStack) -> None:
    text = prompt()
    in_cpu_tier_only(stack, "plain", text)
    reply = complete(stack, "plain", text)
    assert reply.status_code == 500
    assert len(sim_records(stack.old, reply.headers["x-request-id"])) == 1


def test_no_retry_after_the_first_byte(stack: MissStack) -> None:
    reply = complete(stack, "auto", "[[sim:error-after=2]]" + prompt(failing=False), stream=True)
    assert reply.status_code == 200
    events = [event for event in sse_data(reply.text) if isinstance(event, dict)]
    assert "error" in events[-1] and events[0]["choices"][0]["text"]
    assert len(sim_records(stack.old, reply.headers["x-request-id"])) == 1


def test_when_every_attempt_fails_the_client_gets_the_last_answer(stack: MissStack) -> None:
    reply = complete(stack, "forced", "[[sim:status=503]]" + prompt(failing=False))
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == 503
    assert len(sim_records(stack.old, reply.headers["x-request-id"])) == 2
    assert len(sim_records(stack.control, reply.headers["x-request-id"])) == 1
    assert miss_count(stack, "forced", "control", "else_pool", "failed") >= 1


@pytest.mark.parametrize("client_usage", [False, True])
def test_a_held_stream_reaches_the_client_whole_with_its_ttft_and_only_the_usage_it_asked_for(
    stack: MissStack, client_usage: bool
) -> None:
    """The miss path holds a stream back until its first content, then passes on what it held in one write and
    tells the relay's watch that content was seen: every event must still arrive once, in order, TTFT must be
    taken, and the usage event the gateway asked for on its own must still be cut out."""
    body: dict[str, Any] = {"model": SIM_MODEL, "max_tokens": 4, "stream": True,
                            "messages": [{"role": "user", "content": prompt(failing=False)}]}
    if client_usage:
        body["stream_options"] = {"include_usage": True}
    reply = httpx.post(f"{stack.gateway.url}/v1/chat/completions", json=body, headers=bearer(stack.key("auto")),
                       timeout=30)
    assert reply.status_code == 200, reply.text
    events = sse_data(reply.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [event for event in events if isinstance(event, dict)]
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([piece for piece in pieces if piece]) == 4
    assert [c for c in chunks if c.get("usage")] == ([chunks[-1]] if client_usage else [])
    entry = log_entry(stack, reply.headers["x-request-id"])
    assert entry["ttft_ms"] is not None and 0 < entry["ttft_ms"] <= entry["duration_ms"]
    assert entry["prompt_tokens"] > 0  # the usage event was read, whether passed on or cut out
    assert "miss_path" not in entry
