"""The shadow's request head is the relay's (`gateway.proxy.upstream`, which the shadow client sends through):
credentials in a pool URL never reach the Host header, the caller's framing headers are not sent twice, and
unsupported pool URLs and line breaks in headers are refused as transport errors, which the runner counts."""

from __future__ import annotations

import pytest

from gateway.proxy.upstream import UpstreamConnectError, UpstreamTransportError, encode_head, parse_base_url


def test_credentials_in_the_url_never_reach_the_host_header() -> None:
    base = parse_base_url("http://user:secret@127.0.0.1:8001/prefix")
    head = encode_head("POST", base.origin, base.path + "/v1/chat/completions?x=1", {"x-request-id": "r1"}, b"{}")
    assert head == (b"POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8001\r\ncontent-length: 2\r\n"
                    b"x-request-id: r1\r\n\r\n")
    assert (base.origin.scheme, base.origin.host, base.origin.port) == ("http", "127.0.0.1", 8001)


def test_framing_headers_from_the_caller_are_not_sent_twice() -> None:
    base = parse_base_url("https://vllm.example:8443")
    head = encode_head("POST", base.origin, base.path + "/", {"Content-Length": "99", "host": "x"}, b"ab")
    assert head == b"POST / HTTP/1.1\r\nhost: vllm.example:8443\r\ncontent-length: 2\r\n\r\n"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "unix:///tmp/sock", "http:///no-host"])
def test_unsupported_urls_are_refused_before_any_connection(url: str) -> None:
    with pytest.raises(UpstreamConnectError):
        parse_base_url(url)


def test_a_header_with_a_line_break_is_refused() -> None:
    base = parse_base_url("http://127.0.0.1:1/v1")
    with pytest.raises(UpstreamTransportError, match="line break"):
        encode_head("POST", base.origin, base.path, {"x-a": "1\r\nx-b: 2"}, b"")
