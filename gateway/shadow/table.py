"""The shadow comparison as a plain-text table (`kvgate shadow report`, `kvgate demo`)."""

from __future__ import annotations

from typing import Any

from gateway.tables import cell, ms, table


def shadow_table(shadow: dict[str, Any]) -> str:
    rows = []
    for tenant, stats in sorted(shadow.get("tenants", {}).items()):
        ci = stats.get("ttft_delta_ci95_s") or [None, None]
        rows.append([tenant, stats.get("pairs"), ms(stats.get("ttft_delta_p50_s")), ms(stats.get("ttft_delta_p90_s")),
                     f"[{cell(ms(ci[0]))}, {cell(ms(ci[1]))}]", stats.get("mismatches"), stats.get("verdict", "")])
    header = ["tenant", "pairs", "ΔTTFT p50 ms", "ΔTTFT p90 ms", "95% CI ms", "mismatches", "note"]
    return table(header, rows)
