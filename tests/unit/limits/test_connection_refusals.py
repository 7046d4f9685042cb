"""The pure part of the connection limits: the complete HTTP/1.1 refusal written before closing a connection,
read back with an independent HTTP parser (httptools' response parser), and the protocol class the limits make."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httptools
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.limits.connections import ConnectionLimits, GuardedHttpToolsProtocol, guarded_protocol, refusal_bytes


@dataclass
class ParsedResponse:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def parse(raw: bytes) -> tuple[int, ParsedResponse, Any]:
    parsed = ParsedResponse()
    parser = httptools.HttpResponseParser(parsed)
    parser.feed_data(raw)
    return parser.get_status_code(), parsed, parser


@pytest.mark.parametrize(("status", "phrase", "code"), [
    (408, "Request Timeout", "header_timeout"),
    (431, "Request Header Fields Too Large", "header_too_large"),
    (503, "Service Unavailable", "too_many_connections"),
    (400, "Bad Request", "malformed"),
])
def test_a_refusal_is_one_complete_response_that_closes_the_connection(status: int, phrase: str, code: str) -> None:
    raw = refusal_bytes(status, "Nöt accepted: ✓", code)
    assert raw.startswith(f"HTTP/1.1 {status} {phrase}\r\n".encode())
    parsed_status, parsed, parser = parse(raw)
    assert parsed_status == status and parsed.complete
    assert not parser.should_keep_alive()
    headers = dict(parsed.headers)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    assert int(headers[b"content-length"]) == len(parsed.body)
    assert json.loads(parsed.body) == {"error": {"message": "Nöt accepted: ✓", "type": "invalid_request_error",
                                                 "param": None, "code": code}}


def test_an_unknown_status_is_refused_loudly() -> None:
    with pytest.raises(ValueError):
        refusal_bytes(499, "x", "y")


def test_each_server_gets_its_own_protocol_class_with_its_limits() -> None:
    limits = ConnectionLimits(max_header_bytes=2048, header_timeout_s=1.0, idle_timeout_s=2.0, max_connections=3)
    closed = Counter("closed", "test", ["reason"], registry=CollectorRegistry())
    one = guarded_protocol(limits, closed)
    other = guarded_protocol(ConnectionLimits(4096, 1.0, 2.0, 9), closed)
    assert issubclass(one, GuardedHttpToolsProtocol) and one is not other
    assert (one.limits, one.closed) == (limits, closed)
    assert other.limits.max_connections == 9
    assert not hasattr(GuardedHttpToolsProtocol, "limits")  # the base class is never configured in place
