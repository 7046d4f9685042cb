"""Match the salt found in a root block against every salt kvgate issued, without keeping any salt.

The index maps a digest of each salt to its (tenant, epoch): tenant salts of epochs 0..current for every
tenant, and the per-user salts the gateway remembered issuing. Salts themselves are derived, hashed and
dropped; the stores keep only digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from gateway.ledger.records import Attribution, SaltDigestEntry
from gateway.policy.loader import PolicySet
from gateway.salts import derive_salt

DIGEST_BYTES = 16


def salt_digest(salt: str) -> bytes:
    return hashlib.sha256(salt.encode()).digest()[:DIGEST_BYTES]


def user_salt_entry(secret: bytes, tenant: str, epoch: int, user: str) -> SaltDigestEntry:
    return SaltDigestEntry(tenant, epoch, salt_digest(derive_salt(secret, tenant, epoch, user)))


class SaltIndex:
    def __init__(self) -> None:
        self._by_digest: dict[bytes, Attribution] = {}
        self._tenants: dict[str, int] = {}  # configured tenant -> current epoch
        self._users: dict[bytes, SaltDigestEntry] = {}  # every user salt remembered, valid now or not

    @classmethod
    def build(cls, policies: PolicySet, secret: bytes | None, users: Iterable[SaltDigestEntry]) -> SaltIndex:
        index = cls()
        index._tenants = {name: tenant.cache.salt_epoch for name, tenant in policies.tenants.items()}
        if secret is not None:
            for name, epoch in index._tenants.items():
                index._add_tenant_epochs(secret, name, epoch)
        index.add_users(users)
        return index

    def _add_tenant_epochs(self, secret: bytes, tenant: str, current: int) -> None:
        for epoch in range(current + 1):
            self._by_digest[salt_digest(derive_salt(secret, tenant, epoch))] = Attribution(tenant, epoch)

    def add_users(self, entries: Iterable[SaltDigestEntry]) -> None:
        """Per-user salts; they match only for configured tenants and epochs they have reached."""
        for entry in entries:
            self._users[entry.digest] = entry
            if 0 <= entry.epoch <= self._tenants.get(entry.tenant, -1):
                self._by_digest[entry.digest] = Attribution(entry.tenant, entry.epoch)

    def match(self, extra_keys: Any) -> Attribution | None:
        """The tenant whose salt is among a root block's extra keys (LoRA names are strings too)."""
        if not isinstance(extra_keys, list | tuple):
            return None
        for key in extra_keys:
            if isinstance(key, str) and (found := self._by_digest.get(salt_digest(key))) is not None:
                return found
        return None

    def users(self) -> list[SaltDigestEntry]:
        return list(self._users.values())

    def __len__(self) -> int:
        return len(self._by_digest)
