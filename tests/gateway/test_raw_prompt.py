"""Long prompts through a real gateway to an upstream that answers with the request body it received: the prompt
arrives as the very JSON text the client sent, the fields the gateway owns are applied once, and what a full decode
would refuse is still refused before anything goes upstream."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from gateway.proxy.rawprompt import RAW_PROMPT_BYTES
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.procs import ServerProcess, upstream_module


class Echo:
    def __init__(self, gateway: ServerProcess, policy: PolicyDir, secret: str) -> None:
        self.gateway = gateway
        self.policy = policy
        self.secret = secret

    def post(self, path: str, body: bytes) -> httpx.Response:
        headers = {**bearer(self.policy.keys["acme"]), "content-type": "application/json"}
        return httpx.post(f"{self.gateway.url}{path}", content=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Echo]:
    root = tmp_path_factory.mktemp("echo")
    with upstream_module("tests.fault_upstream", root / "echo.log", "--mode", "echo") as upstream:
        policy = PolicyDir(root / "policies", {"echo": {"upstreams": [upstream.url]}})
        policy.add_tenant("acme", cache={"client_salt": "replace"}, offload={"max_load_tokens": 100})
        policy.write()
        secret = new_secret()
        with run_gateway(policy.root, root / "gateway.log", secret) as gateway:
            yield Echo(gateway, policy, secret)


# JSON text a re-encoder would change: escaped non-ASCII and slashes, spaces, raw UTF-8, escaped newlines and quotes
PROMPT_TEXT = '"' + "caf\\u00e9 \\/ \\n \\\"q\\\" é " * 2000 + '"'
MESSAGES_TEXT = ('[ {"role" : "system", "content": "be brief", "content": "keep the last"} ,\n'
                 f'  {{"role": "user", "content": {PROMPT_TEXT}}} ]')


def test_a_long_completion_prompt_reaches_upstream_as_the_client_wrote_it(echo: Echo) -> None:
    body = (f'{{"model": "m", "cache_salt": "mine", "prompt": {PROMPT_TEXT}, "cache_salt": "again", '
            f'"temperature": 1, "temperature": 0, "kv_transfer_params": {{"max_load_tokens": 5000}}}}').encode()
    assert len(PROMPT_TEXT) > RAW_PROMPT_BYTES
    reply = echo.post("/v1/completions", body)
    assert reply.status_code == 200, reply.text
    sent = reply.content
    assert PROMPT_TEXT.encode() in sent
    for key in (b'"cache_salt"', b'"temperature"', b'"kv_transfer_params"', b'"prompt"'):
        assert sent.count(key) == 1, key
    upstream = json.loads(sent)
    assert upstream["cache_salt"] == expected_salt(echo.secret, "acme")
    assert upstream["temperature"] == 0
    assert upstream["kv_transfer_params"] == {"max_load_tokens": 100}


def test_long_chat_messages_reach_upstream_as_the_client_wrote_them(echo: Echo) -> None:
    body = f'{{"model": "m", "messages": {MESSAGES_TEXT}, "priority": 5}}'.encode()
    reply = echo.post("/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    assert MESSAGES_TEXT.encode() in reply.content
    upstream = json.loads(reply.content)
    assert "priority" not in upstream  # engine steering dropped by the default policy
    assert upstream["messages"][0]["content"] == "keep the last"  # what the engine reads of a repeated key


@pytest.mark.parametrize("size", [900 * 1024, 3 * 1024 * 1024])
def test_bodies_around_the_read_ahead_window_arrive_whole(echo: Echo, size: int) -> None:
    prompt = json.dumps("".join(chr(0x41 + index % 26) for index in range(size)))
    reply = echo.post("/v1/completions", f'{{"model": "m", "prompt": {prompt}}}'.encode())
    assert reply.status_code == 200, reply.text
    assert prompt.encode() in reply.content


LONG = b"z" * (RAW_PROMPT_BYTES + 1)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"prompt": "\xff' + LONG + b'"}', "UTF-8"),
    (b'{"prompt": "\\ud800x' + LONG + b'"}', "not valid JSON"),
    (b'{"prompt": "\x01' + LONG + b'"}', "not valid JSON"),
    (b'{"messages": [{"content": "' + LONG + b'"},]}', "not valid JSON"),
])
def test_a_long_prompt_that_is_not_valid_json_is_refused(echo: Echo, body: bytes, message: str) -> None:
    reply = echo.post("/v1/completions", body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"


def http_request(key: str, body: bytes) -> bytes:
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode() + body


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """`count` HTTP/1.1 responses with content-length bodies, in order."""
    data = b""
    responses: list[tuple[int, bytes]] = []
    while len(responses) < count:
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536) or pytest.fail("connection closed")
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
        while len(data) < length:
            data += sock.recv(65536) or pytest.fail("connection closed")
        responses.append((int(lines[0].split(b" ")[1]), data[:length]))
        data = data[length:]
    return responses


def test_pipelined_requests_keep_their_own_bodies(echo: Echo) -> None:
    """The second request arrives (headers and body) while the first is served; the first one's completion must
    not drop the second's buffered body."""
    prompts = [json.dumps(f"{name} " * 4000) for name in ("first", "second")]
    requests = [http_request(echo.policy.keys["acme"], f'{{"model": "m", "prompt": {p}}}'.encode()) for p in prompts]
    with socket.create_connection(("127.0.0.1", echo.gateway.port), timeout=30) as sock:
        sock.sendall(b"".join(requests))
        replies = read_responses(sock, 2)
    for (status, body), prompt in zip(replies, prompts, strict=True):
        assert status == 200, body
        assert prompt.encode() in body


def test_a_connection_serves_on_after_a_large_body_is_refused_unread(echo: Echo) -> None:
    prompt = json.dumps("x" * 600_000)
    body = f'{{"model": "m", "prompt": {prompt}}}'.encode()
    with socket.create_connection(("127.0.0.1", echo.gateway.port), timeout=30) as sock:
        sock.sendall(http_request("not-a-key", body))
        assert read_responses(sock, 1)[0][0] == 401
        sock.sendall(http_request(echo.policy.keys["acme"], body))
        status, echoed = read_responses(sock, 1)[0]
    assert status == 200 and prompt.encode() in echoed
