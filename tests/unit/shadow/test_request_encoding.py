"""The shadow client's request head follows the relay's URL rules: credentials in a pool URL never reach the
Host header, unsupported schemes and line breaks in headers are refused with the shadow's own error."""

from __future__ import annotations

import pytest

from gateway.shadow.client import ShadowTransportError, encode_request, parse_target


def test_credentials_in_the_url_never_reach_the_host_header() -> None:
    target = parse_target("http://user:secret@127.0.0.1:8001/v1/chat/completions?x=1")
    head = encode_request(target, {"x-request-id": "r1"}, b"{}")
    assert head == (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8001\r\ncontent-length: 2\r\n"
                    b"x-request-id: r1\r\n\r\n{}")
    assert (target.scheme, target.host, target.port) == ("http", "127.0.0.1", 8001)


def test_framing_headers_from_the_caller_are_not_sent_twice() -> None:
    head = encode_request(parse_target("https://vllm.example:8443"), {"Content-Length": "99", "host": "x"}, b"ab")
    assert head == b"POST / HTTP/1.1\r\nhost: vllm.example:8443\r\ncontent-length: 2\r\n\r\nab"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "unix:///tmp/sock", "http:///no-host"])
def test_unsupported_urls_are_the_shadows_error(url: str) -> None:
    with pytest.raises(ShadowTransportError):
        parse_target(url)


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ShadowTransportError):
        encode_request(parse_target("http://127.0.0.1:1/v1"), {"x-a": "1\r\nx-b: 2"}, b"")
