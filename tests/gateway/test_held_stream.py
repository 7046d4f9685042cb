"""A stream relayed event by event, with and without the miss path's hold, through a served gateway in front of
an upstream that writes each event only when the test steps it (tests/stepped_upstream.py): so every later read
reaches the gateway on its own, while the stream is held or after it was let go, and the test knows which.

With `offload.miss_path: retry`, the gateway sends no body until the first content and decides there whether to
retry; after that, each event must still go out as it comes (the client gets one before the next is written),
and a stream cut after its first content ends with an error event and is not retried. The head goes out at once
where no retry can change it (every retry left on this pool), and with the first content where one could (a
tenant with a `rollout.else_pool`), so `x-kvgate-pool` names the pool that answered."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess, upstream_module
from tests.sim.helpers import poll
from tests.stepped_upstream import CUT, CUT_BEFORE_CONTENT, retry_answer

WAIT_S = 15.0  # a bound on each wait for an event, not a measure of anything


@dataclass
class Stepped:
    gateway: ServerProcess
    upstream: ServerProcess
    policy: PolicyDir


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stepped]:
    root = tmp_path_factory.mktemp("stepped")
    with upstream_module("tests.stepped_upstream", root / "upstream.log", "--tokens", "3") as upstream:
        pools = {"stepped": {"upstreams": [upstream.url]}, "other": {"upstreams": [upstream.url]}}
        policy = PolicyDir(root / "policies", pools)
        policy.add_tenant("plain", rollout={"pool": "stepped"})
        policy.add_tenant("retrying", offload={"miss_path": "retry"}, rollout={"pool": "stepped"})
        policy.add_tenant("switching", offload={"miss_path": "retry"},
                          rollout={"pool": "stepped", "else_pool": "other"})
        policy.write()
        with run_gateway(policy.root, root / "gateway.log", new_secret()) as gateway:
            yield Stepped(gateway, upstream, policy)


@dataclass
class Reading:
    """A streamed request read on a thread of its own, each `data:` payload put on `events` as it arrives."""

    events: queue.Queue[Any] = field(default_factory=queue.Queue)
    request_id: list[str] = field(default_factory=list)  # set when the head arrives
    pool: list[str] = field(default_factory=list)
    failure: list[BaseException] = field(default_factory=list)

    def next(self) -> Any:
        event = self.events.get(timeout=WAIT_S)
        if isinstance(event, BaseException):
            raise event
        return event


def start_reading(stepped: Stepped, tenant: str, text: str) -> tuple[Reading, threading.Thread]:
    reading = Reading()
    body = {"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": text}]}

    def read() -> None:
        try:
            with httpx.stream("POST", f"{stepped.gateway.url}/v1/chat/completions", json=body,
                              headers=bearer(stepped.policy.keys[tenant]), timeout=WAIT_S) as reply:
                reading.pool.append(reply.headers["x-kvgate-pool"])
                reading.request_id.append(reply.headers["x-request-id"])
                assert reply.status_code == 200
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        payload = line[len("data: "):]
                        reading.events.put(payload if payload == "[DONE]" else json.loads(payload))
        except BaseException as error:  # handed to the test's thread, which raises it
            reading.events.put(error)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return reading, thread


def upstream_state(stepped: Stepped) -> dict[str, int]:
    state: dict[str, int] = httpx.get(f"{stepped.upstream.url}/state", timeout=10).json()
    return state


def step(stepped: Stepped) -> None:
    assert httpx.post(f"{stepped.upstream.url}/step", timeout=10).status_code == 200


def began(stepped: Stepped, requests_before: int, attempt: int = 1) -> None:
    """Wait until the upstream has this request (its `attempt`-th) and has written its role event (the next
    write is a step)."""
    poll(lambda: (lambda state: state["requests"] == requests_before + attempt and state["written"] == 1)(
        upstream_state(stepped)), what="the role event written upstream")


def content(event: Any) -> str | None:
    choices = event.get("choices") if isinstance(event, dict) else None
    return choices[0]["delta"].get("content") if choices else None


def step_through(stepped: Stepped, reading: Reading) -> None:
    """Step the upstream through its answer (role event written, three tokens to come): the role event and t1
    reach the client together, then each later token before the next step, then `[DONE]`."""
    step(stepped)
    assert reading.next()["choices"][0]["delta"]["role"] == "assistant"
    assert content(reading.next()) == "t1"
    for token in ("t2", "t3"):
        step(stepped)
        assert content(reading.next()) == token
    assert reading.next() == "[DONE]"


def log_entry(stepped: Stepped, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for line in stepped.gateway.log_text().splitlines():
            entry: dict[str, Any] = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == "request" and entry.get("request_id") == request_id:
                return entry
        return None
    return poll(find, what="the request's log line")


@pytest.mark.parametrize("tenant", ["plain", "retrying"])
def test_each_event_reaches_the_client_before_the_next_is_written(stepped: Stepped, tenant: str) -> None:
    """The role event comes with the first content for a held stream, on its own otherwise; then every content
    event reaches the client while the upstream still waits to be stepped, so none is held back for the next."""
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, tenant, "hello")
    began(stepped, requests_before)
    step_through(stepped, reading)  # ends with [DONE]: the usage event the gateway asked for on its own is cut out
    thread.join(WAIT_S)
    assert upstream_state(stepped)["requests"] == requests_before + 1
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["status"] == 200 and entry["prompt_tokens"] == 5  # the usage event was read, then cut out
    assert entry["ttft_ms"] is not None and 0 < entry["ttft_ms"] <= entry["duration_ms"]


@pytest.mark.parametrize("tenant", ["plain", "retrying"])
def test_a_stream_cut_after_its_first_content_ends_with_an_error_event_and_is_not_retried(
    stepped: Stepped, tenant: str
) -> None:
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, tenant, f"hello {CUT}")
    began(stepped, requests_before)
    step(stepped)
    assert reading.next()["choices"][0]["delta"]["role"] == "assistant"
    assert content(reading.next()) == "t1"
    step(stepped)  # the upstream closes the connection instead of writing t2
    error = reading.next()
    assert error["error"]["code"] == 502 and "Upstream stream failed" in error["error"]["message"]
    assert reading.next() == "[DONE]"
    thread.join(WAIT_S)
    assert upstream_state(stepped)["requests"] == requests_before + 1  # after the first byte, never again
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["outcome"] == "upstream_failed_mid_stream"
    assert entry["ttft_ms"] is not None


def head_arrived(reading: Reading) -> None:
    """Wait until the client has the response's head (the upstream meanwhile waits to be stepped)."""
    poll(lambda: bool(reading.request_id), what="the response head at the client")


def test_a_held_stream_sends_its_head_at_once_and_a_retry_continues_it(stepped: Stepped) -> None:
    """For a tenant whose retries all stay on its pool, the head goes out when upstream's does, before any
    content; a stream cut before its first content is then retried, and the retry's events (its own role event
    once, not the cut attempt's) follow the head that was sent."""
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, "retrying", f"hello {CUT_BEFORE_CONTENT} {retry_answer(1, 'ok')}")
    began(stepped, requests_before)
    head_arrived(reading)  # while the upstream still holds its first content back
    assert reading.pool == ["stepped"]
    step(stepped)  # the first attempt is cut before its first content
    began(stepped, requests_before, attempt=2)
    step_through(stepped, reading)
    thread.join(WAIT_S)
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["status"] == 200 and entry["outcome"] == "ok"
    assert entry["miss_path"] == [{"pool": "stepped", "failure": "UpstreamTransportError"},
                                  {"pool": "stepped", "action": "recompute_salt", "result": "ok"}]


def test_a_held_stream_whose_retry_is_cut_too_ends_with_an_error_event_after_its_head(stepped: Stepped) -> None:
    """The head went out, so when every attempt is cut before content the client gets what a stream that fails
    midway gets: an error event and `[DONE]`, never a second head or a bare close."""
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, "retrying", f"hello {CUT_BEFORE_CONTENT}")
    began(stepped, requests_before)
    head_arrived(reading)
    step(stepped)  # the first attempt is cut before its first content
    began(stepped, requests_before, attempt=2)
    step(stepped)  # and so is the retry
    error = reading.next()
    assert error["error"]["type"] == "upstream_error" and "unavailable" in error["error"]["message"]
    assert reading.next() == "[DONE]"
    thread.join(WAIT_S)
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["status"] == 200 and entry["outcome"] == "miss_path_exhausted"
    assert [attempt.get("failure") for attempt in entry["miss_path"]] == ["UpstreamTransportError"] * 2
    assert entry["miss_path"][1]["action"] == "recompute_salt"


def test_a_retry_that_answers_with_a_status_after_the_head_ends_the_stream_with_an_error_event(
    stepped: Stepped,
) -> None:
    """After the head only a stream can follow: a retry answered with a status (here 429) is the last failure,
    given as an error event that names it, not relayed as a second response (which the server would refuse)."""
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, "retrying", f"hello {CUT_BEFORE_CONTENT} {retry_answer(1, '429')}")
    began(stepped, requests_before)
    head_arrived(reading)
    step(stepped)
    error = reading.next()
    assert "429" in error["error"]["message"]
    assert reading.next() == "[DONE]"
    thread.join(WAIT_S)
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["status"] == 200 and entry["outcome"] == "miss_path_exhausted"
    assert entry["miss_path"][1] == {"pool": "stepped", "action": "recompute_salt", "result": "failed",
                                     "failure": "status_429"}


def test_a_tenant_with_an_else_pool_gets_the_head_of_the_pool_that_answered(stepped: Stepped) -> None:
    """A retry may move to the else pool, so the head waits for the first content: when both attempts on the
    tenant's pool are cut before content and the else pool answers, `x-kvgate-pool` names the else pool."""
    requests_before = upstream_state(stepped)["requests"]
    reading, thread = start_reading(stepped, "switching", f"hello {CUT_BEFORE_CONTENT} {retry_answer(2, 'ok')}")
    for attempt in (1, 2):
        began(stepped, requests_before, attempt=attempt)
        step(stepped)  # cut before its first content
    began(stepped, requests_before, attempt=3)
    step_through(stepped, reading)
    thread.join(WAIT_S)
    assert reading.pool == ["other"]
    entry = log_entry(stepped, reading.request_id[0])
    assert entry["pool"] == "other" and entry["outcome"] == "ok"
    assert [attempt["pool"] for attempt in entry["miss_path"]] == ["stepped", "stepped", "other"]


def test_a_tenant_with_an_else_pool_gets_the_last_failure_whole_when_every_attempt_is_cut(stepped: Stepped) -> None:
    """Its head is held on every attempt, the else pool's too, so when all three are cut before content the client
    gets what a plain relay gives for an unreachable upstream: a 502, with nothing half-sent before it."""
    requests_before = upstream_state(stepped)["requests"]
    body = {"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": CUT_BEFORE_CONTENT}]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        replied = pool.submit(httpx.post, f"{stepped.gateway.url}/v1/chat/completions", json=body,
                              headers=bearer(stepped.policy.keys["switching"]), timeout=WAIT_S)
        for attempt in (1, 2, 3):
            began(stepped, requests_before, attempt=attempt)
            step(stepped)  # cut before its first content
        reply = replied.result(timeout=WAIT_S)
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["type"] == "upstream_error"
    entry = log_entry(stepped, reply.headers["x-request-id"])
    assert [attempt["pool"] for attempt in entry["miss_path"]] == ["stepped", "stepped", "other"]
    assert [attempt.get("failure") for attempt in entry["miss_path"]] == ["UpstreamTransportError"] * 3
