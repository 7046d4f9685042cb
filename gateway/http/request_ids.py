"""Request ids: 128 random bits as 32 hexadecimal characters (the form `uuid.uuid4().hex` had)."""

from __future__ import annotations

import os

POOL_BYTES = 4096  # 256 ids per read of the OS's random source
ID_BYTES = 16


class RequestIds:
    """Draws ids from one read of `os.urandom` per 256 requests: `uuid4().hex` made a getrandom call and a UUID
    object per request. Each id is still 128 bits from the OS's source, never reused (ids are not secrets: they
    are sent to the client and upstream). One per process (`serve --workers` starts each worker afresh)."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> str:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(POOL_BYTES), 0
        self._at = at + ID_BYTES
        return self._pool[at:at + ID_BYTES].hex()
