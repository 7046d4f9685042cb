"""Fault directives, client disconnects, the request record, operational routes and queueing."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import MODEL, metric_value, poll, record_for, sse_data, words


def fresh_id() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def stream_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}


def outcome(base_url: str, request_id: str, wanted: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        record = record_for(base_url, request_id)
        return record if record and record["outcome"] == wanted else None

    return poll(check, what=f"{request_id} {wanted}")


def test_status_directive(sim: ServerProcess) -> None:
    for stream in (False, True):
        body = {**stream_body("please fail [[sim:status=503]]", 4), "stream": stream}
        reply = httpx.post(f"{sim.url}/v1/completions", json=body, headers={"X-Request-Id": fresh_id()})
        assert reply.status_code == 503
        assert reply.json()["error"]["type"] == "ServiceUnavailableError"
        assert reply.json()["error"]["code"] == 503


def test_drop_after_cuts_the_stream_without_done(sim: ServerProcess) -> None:
    request_id = fresh_id()
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", f"{sim.url}/v1/completions", json=stream_body(words(40) + "[[sim:drop-after=3]]", 10),
        headers={"X-Request-Id": request_id}, timeout=30,
    ) as reply:
        received.extend(line for line in reply.iter_lines() if line.startswith("data: "))
    assert len(received) == 3 and "data: [DONE]" not in received
    assert outcome(sim.url, request_id, "dropped")["completion_tokens"] == 3


def test_non_streaming_faults(sim: ServerProcess) -> None:
    request_id = fresh_id()
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x [[sim:drop-after=0]]", "max_tokens": 3},
                   headers={"X-Request-Id": request_id}, timeout=30)
    assert outcome(sim.url, request_id, "dropped")["status"] == 200
    failed = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x [[sim:error-after=1]]"}, timeout=30)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "InternalServerError"


def test_error_after_sends_the_vllm_error_event(sim: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "x [[sim:error-after=2]]"}], "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body, timeout=30) as reply:
        events = sse_data(reply.read().decode())
    assert len(events) == 5 and events[-1] == "[DONE]"
    assert events[-2] == {"error": {"message": "Simulated mid-stream failure.", "type": "InternalServerError",
                                    "param": None, "code": 500}}


def test_hang_lasts_until_the_client_leaves(sim: ServerProcess) -> None:
    request_id = fresh_id()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/completions", json={"prompt": "[[sim:hang]]"}, timeout=0.5,
                   headers={"X-Request-Id": request_id})
    assert outcome(sim.url, request_id, "aborted")["status"] == 200


def test_delay_directive_still_answers(sim: ServerProcess) -> None:
    reply = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "[[sim:delay-ms=20]]", "max_tokens": 2})
    assert reply.status_code == 200


def test_delay_directive_holds_the_request_before_the_engine(sim: ServerProcess) -> None:
    """A delay far longer than the test: the stream's headers arrive, the request is in flight but neither
    waiting nor running in the engine; leaving ends it as aborted with no token generated."""
    request_id = fresh_id()
    body = stream_body("held [[sim:delay-ms=3600000]]", 4)
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body, headers={"X-Request-Id": request_id},
                      timeout=30) as reply:
        assert reply.status_code == 200
        assert poll(lambda: record_for(sim.url, request_id), what="the record of the held request")
        state = httpx.get(f"{sim.url}/sim/state").json()
        assert state["in_flight"] >= 1 and state["running"] == 0 and state["waiting"] == 0
    record = outcome(sim.url, request_id, "aborted")
    assert not record["completion_tokens"]


def test_client_disconnect_stops_generation(sim: ServerProcess) -> None:
    request_id = fresh_id()
    aborts = metric_value(sim.url, "vllm:request_success_total", {"finished_reason": "abort"})
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=stream_body(words(40), 5000),
                      headers={"X-Request-Id": request_id}, timeout=30) as reply:
        lines = reply.iter_lines()
        first = [next(lines) for _ in range(6)]
    assert sum(line.startswith("data: ") for line in first) == 3
    record = outcome(sim.url, request_id, "aborted")
    assert 3 <= record["completion_tokens"] < 5000
    assert poll(lambda: metric_value(sim.url, "vllm:request_success_total", {"finished_reason": "abort"})
                > aborts, what="abort counted")
    assert poll(lambda: httpx.get(f"{sim.url}/sim/state").json()["running"] == 0, what="engine idle")


def test_record_shows_what_reached_the_server(sim: ServerProcess) -> None:
    request_id = fresh_id()
    body = {**stream_body(words(20), 2), "cache_salt": "salt-1", "kv_transfer_params": {"max_load_tokens": 0},
            "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": request_id, "Authorization": "Bearer tok-xyz-123", "X-Vllm-Priority": "3"}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body, headers=headers, timeout=30) as reply:
        reply.read()
    record = outcome(sim.url, request_id, "completed")
    assert (record["path"], record["method"], record["status"]) == ("/v1/completions", "POST", 200)
    assert (record["cache_salt_present"], record["cache_salt"]) == (True, "salt-1")
    assert record["kv_transfer_params"] == {"max_load_tokens": 0} and record["stream_options_present"]
    assert record["headers"]["x-vllm-priority"] == "3" and "tok-xyz-123" not in str(record)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (20, 2)


def test_operational_routes_are_stubs_that_leave_a_trace(sim: ServerProcess) -> None:
    request_id = fresh_id()
    headers = {"X-Request-Id": request_id}
    assert httpx.post(f"{sim.url}/sleep?level=1", headers=headers).status_code == 200
    assert httpx.get(f"{sim.url}/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.post(f"{sim.url}/wake_up").status_code == 200
    assert httpx.post(f"{sim.url}/collective_rpc", json={"method": "x"}).json() == {"results": []}
    chat = httpx.post(f"{sim.url}/invocations", json={"messages": [{"role": "user", "content": "x"}]}, timeout=30)
    assert chat.json()["object"] == "chat.completion"
    assert outcome(sim.url, request_id, "completed")["path"] == "/sleep"


@pytest.fixture(scope="module")
def slow_sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    """Prefill costs 1 s per uncached token, so a 500-token prompt holds the engine far longer than any test:
    the queued state stays put until the clients leave (no window to catch by polling)."""
    with start_sim("--prefill-us-per-token", "1000000", "--decode-ms-per-token", "0") as server:
        yield server


def test_prefills_are_serialised(slow_sim: ServerProcess) -> None:
    def queued() -> bool:
        state = httpx.get(f"{slow_sim.url}/sim/state").json()
        shown = (state["waiting"], state["running"], state["in_flight"]) == (1, 1, 2)
        return shown and metric_value(slow_sim.url, "vllm:num_requests_waiting") == 1

    ids = [fresh_id(), fresh_id()]
    with contextlib.ExitStack() as streams:
        for request_id in ids:
            reply = streams.enter_context(httpx.stream(
                "POST", f"{slow_sim.url}/v1/completions", json=stream_body(words(500), 1),
                headers={"X-Request-Id": request_id}, timeout=30))
            assert reply.status_code == 200
        assert poll(queued, what="one request prefilling and one queued")
    assert [outcome(slow_sim.url, request_id, "aborted")["outcome"] for request_id in ids] == ["aborted"] * 2
    assert poll(lambda: httpx.get(f"{slow_sim.url}/sim/state").json()["in_flight"] == 0, what="engine idle")
