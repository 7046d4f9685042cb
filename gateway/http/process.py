"""Process-wide effects of the server, kept in one place: the SIGHUP handler, garbage-collector and C allocator
settings."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import signal
from collections.abc import Callable


def on_sighup(callback: Callable[[], object] | None) -> None:
    loop = asyncio.get_running_loop()
    if callback is None:
        loop.remove_signal_handler(signal.SIGHUP)
    else:
        loop.add_signal_handler(signal.SIGHUP, callback)


# Start-up leaves ~70k long-lived objects (modules, policies, metrics) that the cyclic collector would re-scan on
# every older-generation pass; with hundreds of streams in flight, collection took 6-16 % of the gateway's CPU
# (loadtests/proxy_overhead.py). Freezing them and collecting the young generation less often roughly halves
# that, with unchanged memory in that benchmark. Collection still runs; only its timing changes.
GC_THRESHOLDS = (10_000, 20, 20)


def settle_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# A large request body is copied three or four times on its way through (the server's buffer, the body, the bytes sent
# upstream), each copy a fresh allocation of the body's size, freed when the request ends. glibc gives a freed block
# above its mmap threshold, and free heap above its trim threshold, back to the kernel, so the next large request
# faults the pages of its copies in again: about 330 page faults per 128k-token prompt, 1.1 ms of the gateway's
# overhead on the shared 2-core box, when nothing else keeps the heap in use between requests (the reuse trace off;
# loadtests/reports/perf-2026-12-03d). With these settings blocks up to glibc's own mmap ceiling come from the heap,
# and up to RETAINED_FREE_BYTES of free heap is kept for the next request: a bound on what a burst of large requests
# leaves resident, not a leak.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
RETAINED_FREE_BYTES = 32 * 1024 * 1024
M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Apply the settings above; True where the C library took them (glibc), False elsewhere (nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    took: list[int] = [mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), mallopt(M_TRIM_THRESHOLD, RETAINED_FREE_BYTES)]
    return took == [1, 1]
