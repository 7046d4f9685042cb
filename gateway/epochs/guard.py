"""Admit a policy set only if no tenant's salt epoch goes below its floor (see `floor`).

The reloader asks `admit` before installing a set (the atomic check in the store), or `check_cached` on its
synchronous path; `settle` persists what was installed while the store was away.
"""

from __future__ import annotations

from gateway.epochs.floor import FloorStore, FloorStoreUnavailable, describe, lowered, policy_epochs
from gateway.log import get_logger
from gateway.policy.loader import PolicyLoadError, PolicySet

log = get_logger(__name__)


class EpochFloorGuard:
    def __init__(self, store: FloorStore) -> None:
        self.store = store
        self.cached: dict[str, int] = {}  # the floors as last seen, for when the store cannot be asked
        self._pending: dict[str, int] | None = None  # epochs in force but not yet persisted

    async def start(self, initial: PolicySet) -> None:
        """The set a gateway starts with passes the same check; PolicyLoadError if it lowers an epoch."""
        try:
            self.cached = await self.store.floors()
        except FloorStoreUnavailable as error:
            log.warning("epoch_floor_store_unavailable", error=str(error))
        problems = await self.admit(initial)
        if problems:
            raise PolicyLoadError(problems)

    def check_cached(self, candidate: PolicySet) -> list[str]:
        epochs = policy_epochs(candidate)
        return describe(lowered(epochs, self.cached), epochs)

    async def admit(self, candidate: PolicySet) -> list[str]:
        """Problems if `candidate` lowers an epoch; otherwise the floors are raised to it, atomically."""
        epochs = policy_epochs(candidate)
        try:
            below = await self.store.check_and_raise(epochs)
        except FloorStoreUnavailable as error:
            log.warning("epoch_floor_store_unavailable", error=str(error), effect="checked against cached floors")
            below = lowered(epochs, self.cached)
            if not below:
                self._pending = epochs
        if below:
            self.cached = {**self.cached, **below}
            return describe(below, epochs)
        self._raise_cached(epochs)
        return []

    def on_installed(self, policies: PolicySet) -> None:
        """Reloader listener: whatever is in force is at least the floor from now on."""
        epochs = policy_epochs(policies)
        if lowered(epochs, self.cached) or any(epochs[name] > self.cached.get(name, -1) for name in epochs):
            self._pending = epochs
        self._raise_cached(epochs)

    async def settle(self) -> None:
        """Persist epochs installed while the store was unreachable (called on every watcher turn)."""
        if self._pending is None:
            return
        try:
            await self.store.check_and_raise(self._pending)
        except FloorStoreUnavailable:
            return
        self._pending = None

    def _raise_cached(self, epochs: dict[str, int]) -> None:
        for name, epoch in epochs.items():
            self.cached[name] = max(epoch, self.cached.get(name, -1))
