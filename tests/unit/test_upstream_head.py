"""The relay's request head: a line break anywhere in a header value is refused (a CRLF inside one value would
otherwise start a header of the caller's choosing upstream)."""

from __future__ import annotations

import pytest

from gateway.proxy.upstream import Origin, UpstreamTransportError, encode_head

ORIGIN = Origin("http", "127.0.0.1", 8000, "127.0.0.1:8000")


@pytest.mark.parametrize("value", ["1\r\nx-injected: 2", "1\nx-injected: 2", "1\rx", "\r\n"])
def test_a_value_with_a_line_break_is_refused(value: str) -> None:
    with pytest.raises(UpstreamTransportError, match="line break"):
        encode_head("POST", ORIGIN, "/v1/completions", {"x-a": value}, b"{}")


def test_a_plain_head() -> None:
    head = encode_head("POST", ORIGIN, "/v1/completions", {"x-request-id": "r1", "Content-Length": "9"}, b"{}")
    assert head == (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-length: 2\r\n"
                    b"x-request-id: r1\r\n\r\n")
