"""The gateway keeps the memory of large request copies for the next request (gateway.http.process.
keep_freed_memory): with glibc's default thresholds, the copies a large body leaves behind are handed back to the
kernel and fault in again on the next request; once the gateway's lifespan has started, they do not. Both counts
come from child interpreters (tests/unit/http/freed_memory_child.py), since the allocator's settings are
process-wide."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.conftest import UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's mallopt")


def child_faults(*args: str) -> int:
    child = subprocess.run([sys.executable, "-m", "tests.unit.http.freed_memory_child", *args], capture_output=True,
                           text=True, timeout=120, env={**os.environ, UPSTREAM_KEY_ENV: UPSTREAM_KEY})
    assert child.returncode == 0, child.stderr[-3000:]
    faults: int = json.loads(child.stdout.strip().splitlines()[-1])["faults"]
    return faults


def test_a_started_gateway_reuses_the_memory_of_large_copies_instead_of_faulting_it_in_again(tmp_path: Path) -> None:
    policy = standard_policy(tmp_path / "policies", "http://127.0.0.1:9")  # no upstream is contacted
    policy.write()
    bare = child_faults("bare")
    served = child_faults("served", str(policy.root), str(tmp_path / "state.sqlite3"))
    pages_per_copy = 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    assert bare >= 20 * pages_per_copy  # the default thresholds: at least one copy of each round faults in again
    assert served < pages_per_copy  # kept: not even one copy's pages over twenty rounds
