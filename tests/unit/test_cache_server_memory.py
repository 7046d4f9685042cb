"""The LMCache MP server's resident memory, for the plan: from a real prometheus_client process page, and
from the tier gauge alone (a lower bound)."""

from __future__ import annotations

import subprocess
import sys

from gateway.connectors.cache_server import RSS_METRIC, TIER_METRIC, cache_server_memory

# The exposition a prometheus_client process serves from its default registry (as LMCache's HTTP API does).
EXPOSITION = subprocess.run(
    [sys.executable, "-c", "from prometheus_client import REGISTRY, generate_latest; "
     "import sys; sys.stdout.write(generate_latest(REGISTRY).decode())"],
    capture_output=True, text=True, check=True, timeout=60).stdout


def test_a_default_registry_page_gives_the_process_rss() -> None:
    memory = cache_server_memory(EXPOSITION)
    assert memory is not None and memory.metric == RSS_METRIC and not memory.lower_bound
    assert memory.bytes > 1_000_000  # a Python process holds at least a few MB


def test_without_the_process_collector_the_tier_gauge_is_a_lower_bound() -> None:
    text = (f'# TYPE {TIER_METRIC} gauge\n{TIER_METRIC}{{worker_id="0"}} 4.0e+09\n'
            f'{TIER_METRIC}{{worker_id="1"}} 1.5e+09\nlmcache:remote_cache_usage 7\n')
    memory = cache_server_memory(text)
    assert memory is not None and (memory.bytes, memory.lower_bound) == (5_500_000_000, True)


def test_a_page_with_neither_is_unknown_not_zero() -> None:
    assert cache_server_memory("vllm:num_requests_running 0\n") is None


def test_a_sample_timestamp_is_not_read_as_the_value() -> None:
    text = f"{RSS_METRIC} 2.5e+08 1700000000000\n"
    memory = cache_server_memory(text)
    assert memory is not None and memory.bytes == 250_000_000
