"""The benchmark's bare relays (loadtests/floor_relay.py) pass every event of a stream on, request after request
on one client connection: a floor that dropped events or failed on reuse would make kvgate look dearer than it
is."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.devtools.localproc import free_port, run_server
from loadtests.proxy_overhead import importable_here

TOKENS = 5


@pytest.fixture(scope="module")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("floor-upstream")
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(port), "--ttft-ms", "1",
            "--token-ms", "0", "--tokens", str(TOKENS)]
    with run_server(argv, port, work / "upstream.log", env=importable_here(), ready_path="/health") as upstream:
        yield upstream.url


def stream_body() -> bytes:
    return json.dumps({"model": "m", "stream": True, "max_tokens": TOKENS, "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "hello"}]}).encode()


@pytest.mark.parametrize("kind", ["asgi", "protocol"])
def test_a_floor_relay_passes_every_event_on_request_after_request(
    kind: str, upstream_url: str, tmp_path: Path
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.floor_relay", kind, "--port", str(port), "--upstream", upstream_url]
    headers = {"content-type": "application/json"}
    with run_server(argv, port, tmp_path / "floor.log", env=importable_here(), ready_path="/health") as floor, \
            httpx.Client(timeout=10) as client:
        direct = client.post(f"{upstream_url}/v1/chat/completions", content=stream_body(), headers=headers)
        relayed = [client.post(f"{floor.url}/v1/chat/completions", content=stream_body(), headers=headers)
                   for _ in range(3)]
    assert direct.status_code == 200
    for answer in relayed:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.content.count(b"data: ") == direct.content.count(b"data: ") == TOKENS + 3
        assert answer.content.endswith(b"data: [DONE]\n\n")
