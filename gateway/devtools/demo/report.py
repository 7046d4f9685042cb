"""Plain-text tables for the demo's results."""

from __future__ import annotations

import statistics
from typing import Any

from gateway.devtools.demo.workload import Sample
from gateway.shadow.stats import quantile
from gateway.tables import ms as _ms
from gateway.tables import table


def traffic_table(samples: list[Sample]) -> str:
    rows = []
    for tenant, pool in sorted({(s.tenant, s.pool) for s in samples}):
        group = [s for s in samples if (s.tenant, s.pool) == (tenant, pool)]
        ttfts = [s.ttft_s for s in group if s.ttft_s is not None]
        back = [s.ttft_s for s in group if s.phase == "return" and s.ttft_s is not None]
        prompt = sum(s.prompt_tokens for s in group)
        share = f"{100 * sum(s.cached_tokens for s in group) / prompt:.0f} %" if prompt else "-"
        rows.append([tenant, pool, len(group), _ms(quantile(ttfts, 0.5)), _ms(quantile(ttfts, 0.9)),
                     _ms(statistics.median(back)) if back else None, share])
    header = ["tenant", "pool", "requests", "TTFT p50 ms", "TTFT p90 ms", "return p50 ms", "cached share"]
    return table(header, rows)


def phase_table(samples: list[Sample], tenant: str) -> str:
    """TTFT p50 per phase and pool for one tenant: the rollout's A/B between its users."""
    phases = ["cold", "repeat", "pressure", "return"]
    pools = sorted({s.pool for s in samples if s.tenant == tenant})
    rows = []
    for phase in phases:
        medians = {}
        for pool in pools:
            values = [s.ttft_s for s in samples if (s.tenant, s.phase, s.pool) == (tenant, phase, pool)
                      and s.ttft_s is not None]
            medians[pool] = statistics.median(values) if values else None
        delta = _delta(medians.get("offload"), medians.get("control"))
        rows.append([phase, *(_ms(medians[pool]) for pool in pools), _ms(delta)])
    return table(["phase", *(f"{pool} p50 ms" for pool in pools), "offload − control ms"], rows)


def _delta(offload: float | None, control: float | None) -> float | None:
    return None if offload is None or control is None else offload - control


def _known(value: float | None) -> float | str:
    """The audit gives null when nothing was observed (no block removed, none open): shown as "unknown"."""
    return "unknown" if value is None else value


def retention_table(audit: dict[str, Any]) -> str:
    rows = []
    for tenant, media in sorted(audit.get("tenants", {}).items()):
        for medium, stats in sorted(media.items()):
            if not isinstance(stats, dict) or "stored" not in stats:
                continue
            violations = stats.get("violations", {})
            rows.append([tenant, medium, stats["stored"], stats["removed"], stats["resident"],
                         _known(stats.get("lifetime_p50_s")), _known(stats.get("oldest_resident_age_s")),
                         violations.get("age", 0), violations.get("medium", 0)])
    header = ["tenant", "medium", "stored", "removed", "resident", "lifetime p50 s", "oldest s",
              "age viol.", "medium viol."]
    return table(header, rows)
