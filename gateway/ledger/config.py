"""Ledger tuning from `KVGATE_LEDGER_*` environment variables; the defaults suit production."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.kvevents.subscriber import SubscriberTiming


class LedgerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_LEDGER_", extra="ignore")

    flush_interval_s: float = Field(default=0.2, gt=0)  # an event is visible in the audit within ~this
    spool_events: int = Field(default=200_000, ge=100_000)  # block events kept while the store is away
    replay_timeout_s: float = Field(default=2.0, gt=0)
    probe_interval_s: float = Field(default=5.0, gt=0)  # idle time before asking replay if all is well
    lost_after_s: float = Field(default=30.0, gt=0)  # replay silent this long: the source's blocks close
    salt_refresh_s: float = Field(default=1.0, gt=0)  # how often other replicas' user salts are picked up
    sweep_interval_s: float = Field(default=5.0, gt=0)  # resident blocks past retention, for the metric
    compact_after_s: float | None = Field(default=None, gt=0)  # None: max(2 x largest retention, 7 days)
    compact_interval_s: float = Field(default=600.0, gt=0)  # how often closed records past that are compacted
    known_hashes: int = Field(default=1_000_000, ge=1_000)  # hash -> tenant memory for chain attribution
    sqlite_busy_timeout_ms: int = Field(default=10_000, ge=0)  # wait for another writer's lock, then retry later
    user_salts: int = Field(default=100_000, ge=100)  # salt digests remembered (LRU), ~150 bytes each
    redis_prefix: str = "kvgate:ledger:"

    def timing(self) -> SubscriberTiming:
        return SubscriberTiming(self.replay_timeout_s, self.probe_interval_s, self.lost_after_s)


MIN_COMPACT_AFTER_S = 7 * 86_400.0


def compaction_horizon(configured: float | None, retentions: list[float]) -> float:
    """How long closed records stay readable one by one (for `--since` windows) before only the totals keep
    them: as configured, else twice the largest retention in the policy set, and at least 7 days."""
    if configured is not None:
        return configured
    return max(MIN_COMPACT_AFTER_S, 2 * max(retentions, default=0.0))
