"""Connection limits of a served gateway, before any key is checked: head size, head and idle deadlines,
body deadline, the open-connection cap, malformed HTTP. Raw sockets, so the client controls every byte."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy
from tests.harness import bearer, new_secret, run_gateway
from tests.procs import ServerProcess

SHORT = {"KVGATE_HEADER_TIMEOUT_S": "1", "KVGATE_IDLE_TIMEOUT_S": "1", "KVGATE_BODY_TIMEOUT_S": "1"}
GUARD_S = 20.0  # a socket read that waits longer than this means the gateway never closed the connection


class Guarded:
    def __init__(self, gateway: ServerProcess, keys: dict[str, str]) -> None:
        self.gateway = gateway
        self.keys = keys


def start(tmp_path: Path, sim_url: str, env: dict[str, str]) -> Iterator[Guarded]:
    policy = standard_policy(tmp_path / "policies", sim_url)
    policy.write()
    gateway_env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, **env}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), gateway_env) as gateway:
        yield Guarded(gateway, policy.keys)


@pytest.fixture(scope="module")
def guarded(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    yield from start(tmp_path_factory.mktemp("guarded"), sim.url, SHORT)


def connect(gateway: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=GUARD_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (a guard timeout fails the test)."""
    chunks: list[bytes] = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def status_and_body(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def closed_count(guarded: Guarded, reason: str) -> float:
    reply = httpx.get(f"{guarded.gateway.url}/metrics", headers=bearer(guarded.keys["ops"]), timeout=10)
    for line in reply.text.splitlines():
        if line.startswith(f'kvgate_connections_closed_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_oversized_head_is_431_before_it_is_all_sent(guarded: Guarded) -> None:
    before = closed_count(guarded, "header_too_large")
    with connect(guarded.gateway) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        sent = 0
        try:
            while sent < 10 * 1024 * 1024:  # a 10 MB header; the gateway must stop reading long before
                sock.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = read_until_closed(sock) if sent < 10 * 1024 * 1024 else b""
    assert sent < 10 * 1024 * 1024, "the gateway kept reading a 10 MB header"
    if raw:  # the 431 may be lost when the kernel resets a connection whose unread data we were still sending
        status, body = status_and_body(raw)
        assert status == 431
        assert body["error"]["code"] == "header_too_large"  # type: ignore[index]
    assert closed_count(guarded, "header_too_large") == before + 1


def test_many_headers_over_the_bound_in_one_packet_are_431(guarded: Guarded) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (index, b"v" * 100) for index in range(200))  # ~21 KiB, one send
    with connect(guarded.gateway) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        status, _ = status_and_body(read_until_closed(sock))
    assert status == 431


def test_head_within_the_bound_is_served(guarded: Guarded) -> None:
    reply = httpx.get(f"{guarded.gateway.url}/livez", headers={"x-pad": "a" * 12000}, timeout=10)
    assert reply.status_code == 200


def test_slow_head_is_408_and_closed(guarded: Guarded) -> None:
    before = closed_count(guarded, "header_timeout")
    with connect(guarded.gateway) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        status, body = status_and_body(read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "header_timeout"  # type: ignore[index]
    assert closed_count(guarded, "header_timeout") == before + 1


def test_blank_lines_do_not_keep_a_connection_open(guarded: Guarded) -> None:
    with connect(guarded.gateway) as sock:
        deadline = time.monotonic() + GUARD_S
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"\r\n")
                sock.settimeout(0.3)
                closed = sock.recv(1024) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
    assert closed


def test_idle_connections_are_closed_fresh_and_kept_alive(guarded: Guarded) -> None:
    before = closed_count(guarded, "idle_timeout")
    with connect(guarded.gateway) as fresh:
        assert read_until_closed(fresh) == b""
    with connect(guarded.gateway) as kept:
        kept.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = read_until_closed(kept)
    assert raw.startswith(b"HTTP/1.1 200")
    assert closed_count(guarded, "idle_timeout") >= before + 2


def test_a_stream_longer_than_the_idle_deadline_is_not_cut(guarded: Guarded) -> None:
    body = {"model": SIM_MODEL, "prompt": "[[sim:delay-ms=2500]] slow", "max_tokens": 3, "stream": True}
    client = httpx.Client(base_url=guarded.gateway.url, headers=bearer(guarded.keys["acme"]), timeout=30)
    with client, client.stream("POST", "/v1/completions", json=body) as reply:
        text = b"".join(reply.iter_bytes())
    assert reply.status_code == 200
    assert text.endswith(b"data: [DONE]\n\n")


def test_slow_body_is_408(guarded: Guarded) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + guarded.keys["acme"].encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
    with connect(guarded.gateway) as sock:
        sock.sendall(head)
        raw = read_until_closed(sock)  # the idle deadline closes the connection after the answer
    status, body = status_and_body(raw)
    assert status == 408
    assert "body" in body["error"]["message"]  # type: ignore[index]


def test_malformed_http_is_an_openai_shaped_400(guarded: Guarded) -> None:
    with connect(guarded.gateway) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nBad Header\r\n\r\n")
        status, body = status_and_body(read_until_closed(sock))
    assert status == 400
    assert body["error"]["code"] == "malformed"  # type: ignore[index]


def test_connections_over_the_cap_get_503(sim: ServerProcess, tmp_path: Path) -> None:
    env = {"KVGATE_MAX_CONNECTIONS": "3", "KVGATE_IDLE_TIMEOUT_S": "60"}
    for capped in start(tmp_path, sim.url, env):
        with ExitStack() as held:
            for _ in range(3):
                sock = held.enter_context(connect(capped.gateway))
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            with connect(capped.gateway) as extra:
                status, body = status_and_body(read_until_closed(extra))
            assert status == 503
            assert body["error"]["code"] == "too_many_connections"  # type: ignore[index]
        assert livez_answers_200(capped.gateway)  # the held ones are closed: room again


def livez_answers_200(gateway: ServerProcess) -> bool:
    """Poll until the gateway has noticed closed connections and admits a new one."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if httpx.get(f"{gateway.url}/livez", timeout=10).status_code == 200:
            return True
    return False
