"""The per-tenant LMCache tag: keyed, never the salt, and new per epoch and per user."""

from __future__ import annotations

from gateway.connectors.lmcache_tags import SKIP_SAVE_KEY, TAG_KEY, derive_tag, lmcache_params
from gateway.policy.model import OffloadPolicy
from gateway.salts import derive_salt

SECRET = b"unit-secret"


def test_the_tag_changes_with_epoch_and_user_and_never_shows_the_salt() -> None:
    salts = [derive_salt(SECRET, "acme", 1), derive_salt(SECRET, "acme", 2), derive_salt(SECRET, "acme", 1, "u1"),
             derive_salt(SECRET, "acme", 1, "u2"), derive_salt(SECRET, "beta", 1)]
    tags = [derive_tag(SECRET, salt) for salt in salts]
    assert len(set(tags)) == len(tags)
    assert all(tag not in salt and salt[:32] != tag for tag, salt in zip(tags, salts, strict=True))
    assert derive_tag(b"other-secret", salts[0]) != tags[0]  # keyed: the salt alone does not give the tag


def test_params_carry_skip_save_only_for_a_store_cap_of_zero() -> None:
    salt = derive_salt(SECRET, "acme", 1)
    assert lmcache_params(SECRET, salt, OffloadPolicy(), {}) == {TAG_KEY: derive_tag(SECRET, salt)}
    assert lmcache_params(SECRET, salt, OffloadPolicy(max_offload_tokens=0), {})[SKIP_SAVE_KEY] is True
    assert lmcache_params(SECRET, salt, OffloadPolicy(), {"max_offload_tokens": 0})[SKIP_SAVE_KEY] is True
    assert SKIP_SAVE_KEY not in lmcache_params(SECRET, salt, OffloadPolicy(max_offload_tokens=512), {})
    assert lmcache_params(SECRET, None, OffloadPolicy(), {}) == {}  # isolation none: no salt, no tag
