"""Block hashes at the store boundary: vLLM sends uint64 ints (default) or raw bytes.

SQLite integers are signed 64-bit, so a uint64 is stored as its two's-complement value; Redis keys and
msgpack take a text token (decimal for ints, `x` + hex for bytes).
"""

from __future__ import annotations

from gateway.kvevents.wire import HashValue

TWO_64 = 1 << 64
TWO_63 = 1 << 63


def to_sql(value: HashValue | None) -> int | bytes | None:
    if isinstance(value, int) and value >= TWO_63:
        return value - TWO_64
    return value


def from_sql(value: int | bytes | None) -> HashValue | None:
    if isinstance(value, int) and value < 0:
        return value + TWO_64
    return value


def to_token(value: HashValue | None) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else "x" + value.hex()


def from_token(token: str) -> HashValue:
    return bytes.fromhex(token[1:]) if token.startswith("x") else int(token)
