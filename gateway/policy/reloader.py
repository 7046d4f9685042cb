"""Hot reload: poll the directory's content hash and react to SIGHUP; keep the last good set."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicyLoadError, PolicySet, directory_version, load_policy_set

log = get_logger(__name__)


class ReloadGate(Protocol):
    """A last check before a valid set is installed (the salt-epoch floor, gateway/epochs)."""

    def check_cached(self, candidate: PolicySet) -> list[str]: ...

    async def admit(self, candidate: PolicySet) -> list[str]: ...

    async def settle(self) -> None: ...


class PolicyHolder:
    """The policy set in force. Readers take `current` once per request (a forwarded request again once its body
    has arrived, gateway.http.app.readmission); swaps are atomic."""

    def __init__(self, directory: Path, initial: PolicySet, metrics: GatewayMetrics,
                 environ: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.environ = environ
        self.current = initial
        self.metrics = metrics
        self.listeners: list[Callable[[PolicySet], None]] = []
        self.gate: ReloadGate | None = None
        self._seen_version = initial.version
        self._wake = asyncio.Event()
        metrics.policy_reloads.labels("ok").inc()

    def request_reload(self) -> None:
        """Signal-safe: the watcher reloads on its next turn, even if the content looks unchanged."""
        self._seen_version = ""
        self._wake.set()

    def reload(self) -> bool:
        """Load the directory; True if a new set is now in force (the gate checked against cached state)."""
        candidate = self._candidate()
        if candidate is None:
            return False
        problems = self.gate.check_cached(candidate) if self.gate is not None else []
        return self._admit(candidate, problems)

    async def reload_async(self) -> bool:
        """Load the directory; True if a new set is now in force (the gate asks its store)."""
        candidate = self._candidate()
        if candidate is None:
            return False
        problems = await self.gate.admit(candidate) if self.gate is not None else []
        return self._admit(candidate, problems)

    def _candidate(self) -> PolicySet | None:
        """A valid set that differs from the one in force, or None (a failure is logged and counted)."""
        try:
            candidate = load_policy_set(self.directory, self.environ)
        except (PolicyLoadError, OSError) as error:
            self._reject(error)
            return None
        self._seen_version = candidate.version
        return None if candidate.version == self.current.version else candidate

    def _admit(self, candidate: PolicySet, problems: list[str]) -> bool:
        if problems:
            self._reject(PolicyLoadError(problems))
            return False
        self._install(candidate)
        return True

    def _reject(self, error: Exception) -> None:
        self._seen_version = _safe_version(self.directory)
        self.metrics.policy_reloads.labels("error").inc()
        problems = error.problems if isinstance(error, PolicyLoadError) else [str(error)]
        log.error("policy_reload_rejected", kept_version=self.current.version, problems=problems)

    def _install(self, candidate: PolicySet) -> None:
        previous, self.current = self.current.version, candidate
        self.metrics.policy_reloads.labels("ok").inc()
        log.info("policy_reloaded", version=candidate.version, previous_version=previous,
                 tenants=sorted(candidate.tenants))
        for listener in self.listeners:
            listener(candidate)

    async def watch(self, interval_s: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval_s)
            self._wake.clear()
            if _safe_version(self.directory) != self._seen_version:
                await self.reload_async()
            if self.gate is not None:
                await self.gate.settle()


def _safe_version(directory: Path) -> str:
    try:
        return directory_version(directory)
    except OSError:
        return "<unreadable>"
