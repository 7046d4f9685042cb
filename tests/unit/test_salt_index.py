"""The salt index: bounded memory whatever the users, fixed work whatever the epoch."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.ledger.records import Attribution, SaltDigestEntry
from gateway.ledger.salts import RECENT_EPOCHS, DigestLru, SaltIndex, salt_digest, user_salt_entry
from gateway.policy.loader import PolicySet
from gateway.policy.model import MAX_SALT_EPOCH, GatewayConfig, TenantPolicy
from gateway.salts import derive_salt

SECRET = b"s" * 32


def policies(**epochs: int) -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://127.0.0.1:9"]}},
                                            "default_pool": "p"})
    tenants = {name: TenantPolicy.model_validate({"tenant": name, "cache": {"salt_epoch": epoch}})
               for name, epoch in epochs.items()}
    return PolicySet(gateway=gateway, tenants=tenants, keys={}, version="v")


def test_the_lru_keeps_at_most_its_capacity_and_counts_evictions() -> None:
    lru = DigestLru(3)
    entries = [user_salt_entry(SECRET, "acme", 1, f"user-{n}" * 1000) for n in range(5)]
    for entry in entries:
        lru.add(entry)
    assert len(lru) == 3 and lru.evicted == 2
    assert all(len(entry.digest) == 16 for entry in lru.entries())  # digests, never the user strings
    assert lru.get(entries[0].digest) is None
    lru.get(entries[2].digest)  # used: now the most recent
    lru.add(user_salt_entry(SECRET, "acme", 1, "another"))
    assert lru.get(entries[2].digest) is not None and lru.get(entries[3].digest) is None


def test_a_huge_epoch_derives_a_fixed_number_of_salts() -> None:
    index = SaltIndex.build(policies(acme=MAX_SALT_EPOCH, beta=0), SECRET, DigestLru(100))
    assert len(index) == (RECENT_EPOCHS + 1) + 1
    newest = derive_salt(SECRET, "acme", MAX_SALT_EPOCH)
    assert index.match([newest]) == Attribution("acme", MAX_SALT_EPOCH)
    assert index.match([derive_salt(SECRET, "acme", MAX_SALT_EPOCH - RECENT_EPOCHS)]) is not None
    assert index.match([derive_salt(SECRET, "acme", 3)]) is None  # never recorded: unattributed, not derived


def test_recorded_epochs_and_user_salts_match_up_to_the_current_epoch() -> None:
    index = SaltIndex.build(policies(acme=100), SECRET, DigestLru(100))
    old = derive_salt(SECRET, "acme", 3)
    index.add_users([SaltDigestEntry("acme", 3, salt_digest(old)),
                     SaltDigestEntry("acme", 101, salt_digest("future")),
                     SaltDigestEntry("gone", 1, salt_digest("removed-tenant"))])
    assert index.match([old]) == Attribution("acme", 3)
    assert index.match(["future"]) is None
    assert index.match(["removed-tenant"]) is None


def test_salt_epoch_is_bounded() -> None:
    TenantPolicy.model_validate({"tenant": "acme", "cache": {"salt_epoch": MAX_SALT_EPOCH}})
    with pytest.raises(ValidationError, match="less than or equal"):
        TenantPolicy.model_validate({"tenant": "acme", "cache": {"salt_epoch": 20261201}})
