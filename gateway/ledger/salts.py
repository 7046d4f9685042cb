"""Match the salt found in a root block against the salts kvgate issued, without keeping any salt.

Salts are derived, hashed and dropped; only 16-byte digests are kept. The index has two parts:

* each configured tenant's salts of its current epoch and the `RECENT_EPOCHS` before it, derived when a policy
  set comes into force — a fixed number of HMACs per tenant, never one per epoch up to the current one, so a
  large `salt_epoch` costs nothing;
* a bounded LRU (`DigestLru`) of digests remembered from the store: per-user salts the gateway issued, and
  the tenant salts of every epoch that was ever in force (the ledger records those as it installs a set).
  They match for configured tenants and epochs the tenant has reached. Beyond its capacity the least recently
  used digest is forgotten (counted), and a block under it is reported `unattributed`, never guessed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from gateway.ledger.records import Attribution, SaltDigestEntry
from gateway.policy.loader import PolicySet
from gateway.salts import derive_salt

DIGEST_BYTES = 16
RECENT_EPOCHS = 8  # earlier epochs derived beside the current one (those recorded in the store match too)


def salt_digest(salt: str) -> bytes:
    return hashlib.sha256(salt.encode()).digest()[:DIGEST_BYTES]


def user_salt_entry(secret: bytes, tenant: str, epoch: int, user: str) -> SaltDigestEntry:
    return SaltDigestEntry(tenant, epoch, salt_digest(derive_salt(secret, tenant, epoch, user)))


def tenant_salt_entry(secret: bytes, tenant: str, epoch: int) -> SaltDigestEntry:
    return SaltDigestEntry(tenant, epoch, salt_digest(derive_salt(secret, tenant, epoch)))


class DigestLru:
    """Salt digests (16 bytes each) with their tenant and epoch, least recently used first; bounded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evicted = 0
        self._entries: OrderedDict[bytes, SaltDigestEntry] = OrderedDict()

    def add(self, entry: SaltDigestEntry) -> None:
        self._entries[entry.digest] = entry
        self._entries.move_to_end(entry.digest)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evicted += 1

    def get(self, digest: bytes) -> SaltDigestEntry | None:
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
        return entry

    def entries(self) -> list[SaltDigestEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


class SaltIndex:
    def __init__(self, remembered: DigestLru) -> None:
        self._current: dict[bytes, Attribution] = {}  # each tenant's salts of its current and recent epochs
        self._tenants: dict[str, int] = {}  # configured tenant -> current epoch
        self.remembered = remembered  # shared by the indexes of successive policy sets

    @classmethod
    def build(cls, policies: PolicySet, secret: bytes | None, remembered: DigestLru) -> SaltIndex:
        index = cls(remembered)
        index._tenants = {name: tenant.cache.salt_epoch for name, tenant in policies.tenants.items()}
        if secret is not None:
            for name, current in index._tenants.items():
                for epoch in range(max(0, current - RECENT_EPOCHS), current + 1):
                    index._current[tenant_salt_entry(secret, name, epoch).digest] = Attribution(name, epoch)
        return index

    def add_users(self, entries: Iterable[SaltDigestEntry]) -> None:
        """Remembered salts (per user, or tenant salts of earlier epochs)."""
        for entry in entries:
            self.remembered.add(entry)

    def match(self, extra_keys: Any) -> Attribution | None:
        """The tenant whose salt is among a root block's extra keys (LoRA names are strings too)."""
        if not isinstance(extra_keys, list | tuple):
            return None
        for key in extra_keys:
            if not isinstance(key, str):
                continue
            digest = salt_digest(key)
            found = self._current.get(digest)
            if found is not None:
                return found
            entry = self.remembered.get(digest)
            if entry is not None and 0 <= entry.epoch <= self._tenants.get(entry.tenant, -1):
                return Attribution(entry.tenant, entry.epoch)
        return None

    def users(self) -> list[SaltDigestEntry]:
        return self.remembered.entries()

    def __len__(self) -> int:
        return len(self._current) + len(self.remembered)
