"""Generated HTTP requests for fuzzing a served gateway (hypothesis strategies), and a raw-socket sender.

Every route, with mutated methods, paths, query strings, credential headers (valid, unknown, repeated,
arbitrary bytes), content types and encodings, and bodies: near-valid requests whose fields take every JSON
type, arbitrary JSON, deep nesting, and arbitrary bytes. Used by loadtests/fuzz_gateway.py (10,000+ requests)
and tests/gateway/test_fuzz.py (a few hundred).
"""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from gateway.routes import ROUTES

METHODS = ("GET", "POST", "POST", "POST", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "TRACE")
ODD_METHODS = ("CONNECT", "PROPFIND", "BREW", "get", "X")  # the HTTP parser refuses some of these itself
PATH_MUTATIONS = ("", "/", "//", "/..", "%2F", "%2e", "%00", "/x", ";a", "%C3%A9", "\\", "?")
MODEL = "sim-model"
READ_TIMEOUT_S = 30.0

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
                | st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
weird = json_values | st.sampled_from(["true", "false", 1, 0, "1", -1, 2**64, 1.5, "", [], {}])


@dataclass(frozen=True)
class Credentials:
    """Keys the fuzzer may present (the ops key has the metrics and admin scopes)."""

    inference: str
    ops: str


@dataclass(frozen=True)
class Reply:
    status: int | None  # None: the connection closed without a status line
    head: bytes
    body: bytes

    @property
    def gateway_error_code(self) -> object:
        try:
            error = json.loads(self.body).get("error", {})
        except (ValueError, AttributeError):
            return None
        return error.get("code") if isinstance(error, dict) else None


HEADER_SAFE = bytes(byte for byte in range(256) if byte == 9 or 32 <= byte != 127)  # what HTTP lets a value hold


def header_bytes(max_size: int) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes that HTTP/1.1 allows in a header value (so the request reaches the application)."""
    return st.lists(st.sampled_from(HEADER_SAFE), max_size=max_size).map(bytes)


def paths() -> st.SearchStrategy[bytes]:
    routes = st.sampled_from(sorted(ROUTES))
    mutated = st.tuples(routes, st.sampled_from(PATH_MUTATIONS)).map(lambda pair: pair[0] + pair[1])
    anything = st.binary(max_size=20).map(lambda raw: b"/" + raw.replace(b" ", b"").replace(b"\r", b"")
                                          .replace(b"\n", b""))
    # Mostly real routes, so most requests reach the application; some bytes the HTTP parser itself refuses.
    return st.one_of(routes.map(str.encode), routes.map(str.encode), mutated.map(str.encode), anything)


def queries() -> st.SearchStrategy[bytes]:
    names = st.sampled_from(["pairs", "tenant", "since", "x", "pairs", "a"])
    values = st.one_of(st.sampled_from(["3", "%C2%B2", "9" * 30, "-1", "2026-11-29T12:00:00Z", "acme", "%ff", ""]),
                       st.text(alphabet="abcz019%:-T", max_size=12))
    pair = st.tuples(names, values).map(lambda item: f"{item[0]}={item[1]}")
    return st.one_of(st.just(b""), st.lists(pair, min_size=1, max_size=3).map(lambda items: b"?" + "&".join(items)
                                                                               .encode()))


def credential_headers(keys: Credentials) -> st.SearchStrategy[list[tuple[bytes, bytes]]]:
    good = st.sampled_from([keys.inference, keys.ops]).map(str.encode)
    odd = header_bytes(24) | st.binary(max_size=8).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b""))
    token = good | good | odd | st.just(b"kvg_unknown")
    bearer = token.map(lambda value: (b"authorization", b"Bearer " + value))
    scheme = st.sampled_from([b"Basic abc", b"bearer", b"Bearer ", b"Token x"]).map(lambda v: (b"authorization", v))
    api_key = token.map(lambda value: (b"x-api-key", value))
    valid = good.map(lambda key: [(b"authorization", b"Bearer " + key)])
    return st.lists(bearer | api_key | scheme, max_size=3) | valid


def other_headers() -> st.SearchStrategy[list[tuple[bytes, bytes]]]:
    content_type = st.sampled_from([b"application/json", b"application/json; charset=utf-8", b"text/plain",
                                    b"APPLICATION/JSON", b"multipart/form-data"]).map(lambda v: (b"content-type", v))
    encoding = st.sampled_from([b"gzip", b"br", b"identity", b"deflate, gzip"]).map(
        lambda v: (b"content-encoding", v))
    accept = st.sampled_from([b"gzip", b"*", b"identity;q=0"]).map(lambda v: (b"accept-encoding", v))
    user = header_bytes(300).map(lambda value: (b"x-end-user", value))
    steering = st.sampled_from([(b"x-vllm-priority", b"-100"), (b"x-session-id", b"s1"), (b"x-request-id", b"r")])
    return st.lists(content_type | encoding | accept | user | steering, max_size=4)


def generation_bodies() -> st.SearchStrategy[dict[str, Any]]:
    base = st.fixed_dictionaries({
        "model": st.just(MODEL) | weird,
        "max_tokens": st.integers(0, 6) | weird,
    }, optional={
        "prompt": st.text(max_size=60) | weird,
        "messages": st.just([{"role": "user", "content": "hi"}]) | weird,
        "input": st.text(max_size=30) | weird,
        "stream": st.booleans() | weird,
        "stream_options": st.just({"include_usage": True}) | weird,
        "user": st.text(max_size=300) | weird,
        "temperature": st.just(0) | weird,
        "seed": weird,
        "cache_salt": weird,
        "kv_transfer_params": st.dictionaries(st.sampled_from(["max_load_tokens", "max_offload_tokens", "x"]),
                                              weird, max_size=2) | weird,
        "vllm_xargs": weird,
        "priority": weird,
    })
    return base


def bodies() -> st.SearchStrategy[bytes]:
    return st.one_of(
        generation_bodies().map(lambda body: json.dumps(body).encode()),
        json_values.map(lambda value: json.dumps(value).encode()),
        st.integers(1, 3000).map(lambda depth: b'{"model":"m","prompt":' + b"[" * depth + b"]" * depth + b"}"),
        st.binary(max_size=64),
        st.just(b""),
    )


@st.composite
def requests(draw: st.DrawFn, keys: Credentials) -> bytes:
    method = draw(st.sampled_from(METHODS * 4 + ODD_METHODS)).encode()
    target = draw(paths()) + draw(queries())
    headers = [(b"host", b"gateway"), *draw(credential_headers(keys)), *draw(other_headers())]
    body = draw(bodies()) if method != b"GET" or draw(st.booleans()) else b""
    chunked = draw(st.booleans()) and bool(body)
    framing = [(b"transfer-encoding", b"chunked")] if chunked else [(b"content-length", str(len(body)).encode())]
    lines = [method + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in [*headers, *framing, (b"connection", b"close")]]
    payload = (hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n") if chunked else body
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def send_raw(port: int, request: bytes) -> Reply:
    """Send one request on a fresh connection (`Connection: close`) and read until the gateway closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
        with contextlib.suppress(OSError):  # the gateway may refuse and close before the whole request is sent
            sock.sendall(request)
        chunks: list[bytes] = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None
    return Reply(status, head, body)
