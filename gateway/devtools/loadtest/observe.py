"""Reads around the traffic: upstream and gateway `/metrics`, the ledger's audit, shadow A/B, host memory."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.devtools.loadtest.procmem import mem_available_bytes, tree_rss_bytes
from gateway.devtools.loadtest.promtext import KEY_FAMILIES, Samples, accumulating_samples, info_labels
from gateway.devtools.loadtest.targets import Targets

SETTLE_INTERVAL_S = 0.02
SETTLE_LIMIT_S = 3.0
KEY_PREFIXES = tuple(name.removesuffix("_total").removesuffix("_sum").removesuffix("_count") for name in KEY_FAMILIES)


@dataclass
class Observer:
    http: httpx.AsyncClient
    targets: Targets

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.targets.access.admin_key}"}

    async def upstream_text(self, arm: str) -> str | None:
        url = self.targets.upstreams[arm].url
        if url is None:
            return None
        try:
            reply = await self.http.get(f"{url}/metrics")
        except httpx.HTTPError:
            return None
        return reply.text if reply.status_code == 200 else None

    async def upstream_samples(self, arm: str) -> Samples | None:
        text = await self.upstream_text(arm)
        return accumulating_samples(text) if text is not None else None

    async def settled_samples(self, arm: str) -> Samples | None:
        """Scrape until the key families stop moving (a KV store can finish just after a stream ends)."""
        deadline = time.monotonic() + SETTLE_LIMIT_S
        last = await self.upstream_text(arm)
        while last is not None and time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_INTERVAL_S)  # polling interval of a condition, not synchronisation
            current = await self.upstream_text(arm)
            if current is None or _key_lines(current) == _key_lines(last):
                last = current or last
                break
            last = current
        return accumulating_samples(last) if last is not None else None

    async def kv_cache_tokens(self, arm: str) -> int | None:
        text = await self.upstream_text(arm)
        labels = info_labels(text, "vllm:cache_config_info") if text else {}
        value = labels.get("kv_cache_size_tokens")
        if value is None and labels.get("num_gpu_blocks", "None").isdigit():
            value = str(int(labels["num_gpu_blocks"]) * int(labels.get("block_size", "16")))
        return int(value) if value and value.isdigit() else None

    async def upstream_json(self, arm: str, path: str) -> Any:
        url = self.targets.upstreams[arm].url
        if url is None:
            return None
        try:
            reply = await self.http.get(f"{url}{path}")
            return reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def gateway_samples(self) -> Samples | None:
        try:
            reply = await self.http.get(f"{self.targets.gateway_url}/metrics", headers=self._admin())
        except httpx.HTTPError:
            return None
        return accumulating_samples(reply.text) if reply.status_code == 200 else None

    async def admin(self, path: str) -> dict[str, Any] | None:
        try:
            reply = await self.http.get(f"{self.targets.gateway_url}{path}", headers=self._admin())
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        body: dict[str, Any] = reply.json()
        return body

    async def settled_audit(self, limit_s: float) -> dict[str, Any] | None:
        """The audit once two consecutive reads agree on every count (events reach it within ~1 s)."""
        deadline = time.monotonic() + limit_s
        last = await self.admin("/admin/audit")
        while last is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.25)  # polling interval of a condition, not synchronisation
            current = await self.admin("/admin/audit")
            if current is None or _audit_counts(current) == _audit_counts(last):
                return current or last
            last = current
        return last

    def memory(self) -> dict[str, Any]:
        arms: dict[str, Any] = {}
        for arm, upstream in self.targets.upstreams.items():
            pid = upstream.pid()
            arms[arm] = {"pid": pid, "rss_bytes": tree_rss_bytes(pid) if pid is not None else None}
        return {"arms": arms, "host_mem_available_bytes": mem_available_bytes()}


def _key_lines(text: str) -> list[str]:
    """The exposition lines of the key families (cheap to compare, no parsing)."""
    return [line for line in text.splitlines() if line.startswith(KEY_PREFIXES)]


def _audit_counts(audit: dict[str, Any]) -> Any:
    tenants = audit.get("tenants", {})
    counts = {tenant: {medium: (stats.get("stored"), stats.get("removed"), stats.get("resident"))
                       for medium, stats in media.items() if isinstance(stats, dict)}
              for tenant, media in tenants.items()}
    return counts, audit.get("gaps")
