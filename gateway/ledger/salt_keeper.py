"""The salts the ledger matches blocks against: per-user salts requests were given, each tenant's epochs in
force, and those other replicas recorded in the store. Only digests are kept (gateway/ledger/salts.py)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

from gateway.ledger.base import LedgerStore
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.records import SaltDigestEntry
from gateway.ledger.salts import SaltIndex, tenant_salt_entry, user_salt_entry
from gateway.ledger.writer import BatchWriter
from gateway.policy.loader import PolicySet


class SaltKeeper:
    """Owns the current `SaltIndex`; new digests go both into it and, through the writer, into the store."""

    def __init__(self, index: SaltIndex, secret: bytes | None, writer: BatchWriter, metrics: LedgerMetrics) -> None:
        self.index = index
        self.secret = secret
        self.writer = writer
        self.metrics = metrics
        # Requests already remembered, keyed by a 16-byte digest of (tenant, epoch, user), never the user itself:
        # repeat calls are one dict lookup, and memory per entry is fixed whatever the `user` length.
        self._remembered: OrderedDict[bytes, None] = OrderedDict()
        self._store_position = 0
        # Under `serve --workers N`, a worker that does not ingest passes each new digest to the one that does,
        # before the request goes upstream (gateway/http/workers.py).
        self.issued: Callable[[SaltDigestEntry], None] | None = None

    def rebuild(self, policies: PolicySet) -> SaltIndex:
        """A new index for the set in force (remembered digests carry over); its epochs are recorded."""
        self.index = SaltIndex.build(policies, self.secret, self.index.remembered)
        self.remember_tenant_epochs(policies)
        return self.index

    def remember_user_salt(self, tenant: str, epoch: int, user: str) -> None:
        """Called per request for `isolation: user`; memory only, repeat calls are a dict lookup."""
        if self.secret is None:
            return
        key = hashlib.blake2b(f"{tenant}\0{epoch}\0{user}".encode(), digest_size=16).digest()
        if key in self._remembered:
            self._remembered.move_to_end(key)
            return
        self._remembered[key] = None
        if len(self._remembered) > self.index.remembered.capacity:
            self._remembered.popitem(last=False)
        entry = user_salt_entry(self.secret, tenant, epoch, user)
        self.index.add_users([entry])
        self.writer.add_salts([entry])
        self.metrics.user_salts(self.index.remembered)
        if self.issued is not None:
            self.issued(entry)

    def remember_tenant_epochs(self, policies: PolicySet) -> None:
        """Every epoch in force is recorded (as a digest) so late events under it are still attributed, here
        and after a restart, without ever deriving the epochs in between."""
        if self.secret is None:
            return
        entries = [tenant_salt_entry(self.secret, name, tenant.cache.salt_epoch)
                   for name, tenant in policies.tenants.items()]
        self.index.add_users(entries)
        self.writer.add_salts(entries)
        self.metrics.user_salts(self.index.remembered)

    async def refresh(self, store: LedgerStore) -> None:
        """Digests recorded since the last call (by any replica) join the index."""
        entries, self._store_position = await store.salt_entries(self._store_position)
        self.learn(entries)

    def learn(self, entries: list[SaltDigestEntry]) -> None:
        """Digests another process issued: they match from now on (the store already has them)."""
        if entries:
            self.index.add_users(entries)
            self.metrics.user_salts(self.index.remembered)
