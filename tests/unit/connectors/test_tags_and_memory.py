"""Connector helpers called directly: the LMCache tenant tag against `openssl dgst -hmac` known answers, the
`lmcache.*` parameters and the body each pool receives, and the cache server's memory read from /metrics pages of
every shape (labels, comments, several samples, malformed lines)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.connectors.cache_server import RSS_METRIC, TIER_METRIC, CacheServerMemory, cache_server_memory
from gateway.connectors.lmcache_tags import SKIP_SAVE_KEY, TAG_KEY, body_for_pool, derive_tag, lmcache_params
from gateway.policy.model import OffloadPolicy, PoolConfig

SECRET = b"unit-secret"
SALT = "a177b1287e445c7b774eff569fea8abdfb3497e60c0629368b399ac6f094addb"


@pytest.mark.parametrize(("salt", "tag"), [
    # printf 'kvgate-lmcache-tag-v1\0%s' SALT | openssl dgst -sha256 -hmac unit-secret, first 32 hex characters
    (SALT, "77ec57ea1824c52f3e4611fca5d14dbc"),
    ("", "2173cb278ad15807173f6b23a5c9100e"),
    ("ünï", "36e6646ba6477191b123292b089250b5"),
])
def test_the_tag_is_a_truncated_hmac_of_the_context_and_the_salt(salt: str, tag: str) -> None:
    assert derive_tag(SECRET, salt) == tag


@pytest.mark.parametrize(("policy_cap", "sent", "skip"), [
    (None, {}, False),
    (0, {}, True),
    (None, {"max_offload_tokens": 0}, True),
    (512, {"max_offload_tokens": 512}, False),
    (512, {"max_offload_tokens": 0}, True),  # the client asked for less: still honoured as skip_save
    (None, {"max_offload_tokens": "0"}, False),  # only the number 0 means nothing stored
])
def test_skip_save_only_when_nothing_may_be_stored(policy_cap: int | None, sent: dict[str, Any], skip: bool) -> None:
    params = lmcache_params(SECRET, SALT, OffloadPolicy(max_offload_tokens=policy_cap), sent)
    assert params[TAG_KEY] == "77ec57ea1824c52f3e4611fca5d14dbc"
    assert (SKIP_SAVE_KEY in params) is skip
    if skip:
        assert params[SKIP_SAVE_KEY] is True


def test_without_a_salt_there_is_no_tag_but_skip_save_still_applies() -> None:
    assert lmcache_params(SECRET, None, OffloadPolicy(max_offload_tokens=0), {}) == {SKIP_SAVE_KEY: True}


LMCACHE = PoolConfig(upstreams=["http://a"], connector="lmcache")
OFFLOADING = PoolConfig(upstreams=["http://a"])
TAGS = {TAG_KEY: "t", SKIP_SAVE_KEY: True}


@pytest.mark.parametrize(("request_body", "lmcache", "pool", "expected"), [
    ({"model": "m", "kv_transfer_params": {"max_load_tokens": 0}}, TAGS, OFFLOADING,
     {"model": "m", "kv_transfer_params": {"max_load_tokens": 0}}),  # no LMCache there: no lmcache.* keys
    ({"model": "m"}, {}, LMCACHE, {"model": "m"}),
    ({"model": "m"}, TAGS, LMCACHE, {"model": "m", "kv_transfer_params": TAGS}),
    ({"model": "m", "kv_transfer_params": {"max_load_tokens": 0}}, TAGS, LMCACHE,
     {"model": "m", "kv_transfer_params": {"max_load_tokens": 0, **TAGS}}),
    ({"kv_transfer_params": None}, TAGS, LMCACHE, {"kv_transfer_params": TAGS}),
    ({"kv_transfer_params": {TAG_KEY: "forged"}}, TAGS, LMCACHE, {"kv_transfer_params": TAGS}),  # the gateway's wins
    ({"prompt": "ünï ✓"}, {}, OFFLOADING, {"prompt": "ünï ✓"}),
])
def test_the_body_each_pool_receives(request_body: dict[str, Any], lmcache: dict[str, Any], pool: PoolConfig,
                                     expected: dict[str, Any]) -> None:
    before = json.dumps(request_body)
    assert json.loads(body_for_pool(request_body, lmcache, pool)) == expected
    assert json.dumps(request_body) == before  # the request itself is not changed


PAGE = """# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2345e+09
process_resident_memory_bytes_total 7
lmcache:local_cache_usage{worker="0"} 100
"""


@pytest.mark.parametrize(("page", "expected"), [
    (PAGE, CacheServerMemory(1_234_500_000, RSS_METRIC, lower_bound=False)),
    ('lmcache:local_cache_usage{worker="0"} 100\nlmcache:local_cache_usage{worker="1"} 250.0\n',
     CacheServerMemory(350, TIER_METRIC, lower_bound=True)),  # one sample per worker: summed
    ("process_resident_memory_bytes{pid=\"1\"} 10\nprocess_resident_memory_bytes{pid=\"2\"} 20\n",
     CacheServerMemory(30, RSS_METRIC, lower_bound=False)),
    ("process_resident_memory_bytes NaN-ish\nprocess_resident_memory_bytes 42\n",
     CacheServerMemory(42, RSS_METRIC, lower_bound=False)),  # a malformed sample is skipped
    ("process_resident_memory_bytes\nlmcache:local_cache_usage 5\n", CacheServerMemory(5, TIER_METRIC, True)),
    ("process_resident_memory_bytes 0\n", CacheServerMemory(0, RSS_METRIC, lower_bound=False)),  # a real zero
    ("# process_resident_memory_bytes 99\n", None),
    ("process_resident_memory_bytes_total 7\nprocess_virtual_memory_bytes 9\n", None),
    ("", None),
])
def test_the_cache_servers_memory_from_its_metrics_page(page: str, expected: CacheServerMemory | None) -> None:
    assert cache_server_memory(page) == expected
