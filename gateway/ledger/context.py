"""What every part of a running ledger shares: its store, its settings, the policies in force, its metrics."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ledger.base import LedgerStore
from gateway.ledger.config import LedgerSettings
from gateway.ledger.observe import LedgerMetrics
from gateway.policy.reloader import PolicyHolder


@dataclass(frozen=True)
class LedgerContext:
    store: LedgerStore
    config: LedgerSettings
    holder: PolicyHolder
    metrics: LedgerMetrics
