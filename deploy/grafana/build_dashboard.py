"""Build kvgate's Grafana dashboard from code (Grafana foundation SDK, the Grafana 11.6 flavour).

    pip install 'grafana-foundation-sdk==1769699379!11.6.0'    # mind the epoch: a plain install picks 10.1
    python deploy/grafana/build_dashboard.py                     # rewrites dashboards/kvgate.json
    python deploy/grafana/build_dashboard.py --check             # exit 1 if the committed JSON is stale

CI (tests/deploy/test_grafana.py) checks that the committed JSON equals a fresh build, that every query
parses (promtool), and, against a real Prometheus scraping a running gateway, that every query returns data.

Rows, one per concern: traffic and errors; time to first token and ΔTTFT; prefix cache and offload;
KV blocks and retention; KV-event health; protection; ledger health; offload economics. Every per-tenant query
honours the $tenant (and $pool) variables.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

# The SDK lives in the deploy tools' environment (tests/deploy/tools-requirements.txt). Type-check this file
# against it with `mypy --python-executable ~/.cache/kvgate/deploy-tools-venv/bin/python`; where the SDK is
# absent the imports are Any, hence the ignores (and unused-ignore for when it is present).
from grafana_foundation_sdk.builders import common as common_builders  # type: ignore[import-not-found, unused-ignore]
from grafana_foundation_sdk.builders import (  # type: ignore[import-not-found, unused-ignore]
    dashboard,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.cog.builder import Builder  # type: ignore[import-not-found, unused-ignore]
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # type: ignore[import-not-found, unused-ignore]
from grafana_foundation_sdk.models import common  # type: ignore[import-not-found, unused-ignore]
from grafana_foundation_sdk.models.dashboard import (  # type: ignore[import-not-found, unused-ignore]
    DashboardCursorSync,
    DataSourceRef,
    VariableModel,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.dashboard import Panel as PanelModel  # type: ignore[import-not-found, unused-ignore]

PanelBuilder = TypeVar("PanelBuilder", stat.Panel, timeseries.Panel)

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "kvgate.json"
UID = "kvgate-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
TENANT = 'tenant=~"$tenant"'
TENANT_POOL = 'tenant=~"$tenant", pool=~"$pool"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Graph:
    """One panel: a time series by default, a stat (current value per series) when `stat` is set."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 8
    stat: bool = False


def q(expr: str, legend: str) -> Query:
    return Query(" ".join(expr.split()), legend)


def quantile(phi: float, metric: str, by: str, selector: str) -> str:
    return f"histogram_quantile({phi}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}{RATE})))"


def ratio(numerator: str, denominator: str, by: str) -> str:
    return f"sum by ({by}) (rate({numerator}{RATE})) / sum by ({by}) (rate({denominator}{RATE}))"


def none_while_scraped(expr: str, label: str) -> str:
    """`expr`, or a single 0 labelled `label="none"` while Prometheus scrapes kvgate.

    A labelled counter child is born at its first event, so a family that never fired has no series at all. While
    some gateway is scraped that absence means "none since start" and is shown as 0; when no gateway is scraped
    the panel stays empty (unknown), never 0."""
    return f'{expr} or on () label_replace(0 * count(up{{job="kvgate"}} == 1), "{label}", "none", "", "")'


TRAFFIC = (
    Graph("Requests by tenant and status", "Answered requests per second, from kvgate_requests_total.", "reqps",
          (q(f"sum by (tenant, status) (rate(kvgate_requests_total{{{TENANT_POOL}}}{RATE}))",
             "{{tenant}} {{status}}"),)),
    Graph("5xx share by tenant and pool", "Share of requests answered with a 5xx status (the alert fires above 5 %).",
          "percentunit",
          (q(ratio(f'kvgate_requests_total{{{TENANT_POOL}, status=~"5.."}}', f"kvgate_requests_total{{{TENANT_POOL}}}",
                   "tenant, pool"), "{{tenant}} on {{pool}}"),)),
    Graph("Refused requests by reason", "Requests refused before routing: missing, malformed or unknown keys, scopes.",
          "reqps", (q(f"sum by (reason) (rate(kvgate_auth_failures_total{RATE}))", "{{reason}}"),)),
    Graph("Gateway overhead p99 by route", "Time kvgate itself adds, before upstream and before replying.", "s",
          (q(quantile(0.99, "kvgate_overhead_seconds", "route", ""), "{{route}}"),), width=12),
    Graph("Request duration p90 by tenant and pool", "Arrival at the gateway to the last byte sent.", "s",
          (q(quantile(0.9, "kvgate_request_duration_seconds", "tenant, pool", TENANT_POOL), "{{tenant}} on {{pool}}"),),
          width=12),
)

TTFT = (
    Graph("TTFT p50 by tenant and pool", "Time to first token measured at the gateway (streamed requests, and "
          "non-streamed ones of tenants with measure_ttft).", "s",
          (q(quantile(0.5, "kvgate_ttft_seconds", "tenant, pool", TENANT_POOL), "{{tenant}} on {{pool}}"),)),
    Graph("TTFT p90 by tenant and pool", "90th percentile of the gateway-measured TTFT.", "s",
          (q(quantile(0.9, "kvgate_ttft_seconds", "tenant, pool", TENANT_POOL), "{{tenant}} on {{pool}}"),)),
    Graph("Shadow ΔTTFT (offload − control) by tenant", "TTFT of the primary (offload) minus TTFT of the same request "
          "mirrored to the control pool. Below zero, offloading saves time.", "s",
          (q(quantile(0.5, "kvgate_shadow_ttft_delta_seconds", "tenant", TENANT), "{{tenant}} p50"),
           q(quantile(0.9, "kvgate_shadow_ttft_delta_seconds", "tenant", TENANT), "{{tenant}} p90"))),
    Graph("Shadow requests by tenant and outcome",
          "Mirrored requests: compared pairs, dropped (max_in_flight), errors.",
          "reqps", (q(f"sum by (tenant, outcome) (rate(kvgate_shadow_requests_total{{{TENANT}}}{RATE}))",
                      "{{tenant}} {{outcome}}"),), width=12),
    Graph("Shadow output mismatches by tenant", "Deterministic pairs whose texts differed, since the gateway started. "
          "Offloading must never change outputs.", "short",
          (q(f"sum by (tenant) (kvgate_shadow_mismatches_total{{{TENANT}}})", "{{tenant}}"),), width=12, stat=True),
)

CACHE = (
    Graph("Cached share of prompt tokens by tenant and pool", "usage.prompt_tokens_details.cached_tokens over "
          "prompt_tokens, as upstream reported them (GPU and offload tier together).", "percentunit",
          (q(ratio(f"kvgate_cached_prompt_tokens_total{{{TENANT_POOL}}}",
                   f"kvgate_prompt_tokens_total{{{TENANT_POOL}}}", "tenant, pool"), "{{tenant}} on {{pool}}"),)),
    Graph("vLLM prefix cache hit ratio by pool", "From vLLM's counters: the GPU prefix cache, and the connector "
          "(CPU tier) for the tokens the GPU missed.", "percentunit",
          (q(ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "pool"), "{{pool}} GPU"),
           q(ratio("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total", "pool"),
             "{{pool}} CPU tier"))),
    Graph("KV offload bytes by pool", "OffloadingConnector transfers: store = GPU → CPU tier, load = CPU tier → GPU.",
          "Bps",
          (q(f"sum by (pool) (rate(vllm:kv_offload_store_bytes_total{RATE}))", "{{pool}} store"),
           q(f"sum by (pool) (rate(vllm:kv_offload_load_bytes_total{RATE}))", "{{pool}} load"))),
)

BLOCKS = (
    Graph("Resident KV blocks by tenant and medium", "Blocks the ledger holds as resident now (max over gateway "
          "replicas, which share one ledger).", "short",
          (q(f"max by (tenant, medium) (kvgate_kv_blocks_resident{{{TENANT}}})", "{{tenant}} {{medium}}"),)),
    Graph("Lifetime of removed blocks, p99, by tenant and medium", "How long blocks lived before vLLM removed them; "
          "compare with each tenant's retention_seconds. `kvgate audit` shows the oldest resident block.", "s",
          (q(quantile(0.99, "kvgate_kv_block_lifetime_seconds", "tenant, medium", TENANT), "{{tenant}} {{medium}}"),)),
    Graph("Retention and medium violations by tenant", "Blocks found breaking retention_seconds (age) or allowed_media "
          "(medium), since the gateway started.", "short",
          (q(f"sum by (tenant, kind) (kvgate_retention_violations_total{{{TENANT}}})", "{{tenant}} {{kind}}"),),
          stat=True),
    Graph("Blocks stored by tenant and medium", "New KV blocks per second, from vLLM's KV events.", "ops",
          (q(f"sum by (tenant, medium) (rate(kvgate_kv_blocks_stored_total{{{TENANT}}}{RATE}))",
             "{{tenant}} {{medium}}"),), width=12),
    Graph("Blocks removed by tenant and medium", "KV blocks removed per second, from vLLM's KV events.", "ops",
          (q(f"sum by (tenant, medium) (rate(kvgate_kv_blocks_removed_total{{{TENANT}}}{RATE}))",
             "{{tenant}} {{medium}}"),), width=12),
)

EVENTS = (
    Graph("Missed KV-event batches by source", "Batches neither received nor recovered by replay, since the gateway "
          "started: the ledger of that source is incomplete.", "short",
          (q("sum by (source) (kvgate_kv_event_gaps_total)", "{{source}}"),), stat=True),
    Graph("KV-event blocks by medium", "Stored and removed blocks per second over all tenants: a flat line while "
          "traffic flows means events stopped arriving.", "ops",
          (q(f"sum by (medium) (rate(kvgate_kv_blocks_stored_total{RATE}))", "stored {{medium}}"),
           q(f"sum by (medium) (rate(kvgate_kv_blocks_removed_total{RATE}))", "removed {{medium}}"))),
    Graph("Policy reloads by result", "Policy directory loads since the gateway started; an error keeps the last "
          "good policies.", "short",
          (q("sum by (result) (kvgate_policy_reloads_total)", "{{result}}"),), stat=True),
    Graph("Worker processes by instance", "Serving worker processes against those configured (`kvgate serve "
          "--workers N`, docs/workers.md). Alert: KvgateWorkersMissing.", "short",
          (q("max by (instance) (kvgate_workers)", "{{instance}} serving"),
           q("max by (instance) (kvgate_workers_configured)", "{{instance}} configured")), width=12),
    Graph("Worker restarts and salt hand-offs failed", "Workers that exited and were started again, and user-salt "
          "announcements to the ingesting worker that failed, since the gateway started. Alert: "
          "KvgateWorkerRestarted.", "short",
          (q("sum by (instance) (kvgate_worker_restarts_total)", "{{instance}} restarts"),
           q("sum by (instance) (kvgate_worker_salt_announcements_failed_total)",
             "{{instance}} salt hand-offs failed")),
          width=12, stat=True),
    Graph("Scrape targets up", "1 when Prometheus can scrape kvgate (with its metrics key) and each vLLM server.",
          "short", (q('up{job=~"kvgate|vllm"}', "{{job}} {{instance}}"),), width=24),
)

PROTECTION = (
    Graph("Connections closed by reason", "Client connections kvgate closed itself: header_too_large, header_timeout, "
          "idle_timeout, too_many_connections, malformed (docs/limits.md).", "cps",
          (q(f"sum by (reason) (rate(kvgate_connections_closed_total{RATE}))", "{{reason}}"),)),
    Graph("Streams waiting for slow clients by tenant", "Times a streamed answer stopped reading from upstream "
          "because 1 MiB of it waited for a slow client; reading resumes when it catches up (docs/http.md).", "ops",
          (q(f"sum by (tenant) (rate(kvgate_client_stalls_total{{{TENANT}}}{RATE}))", "{{tenant}}"),)),
    Graph("Stream events passed on unread by tenant", "Upstream events still not complete after 8 MiB, passed on "
          "without being read (no TTFT, usage or usage stripping in them); the events after them are read "
          "(docs/limits.md).", "ops",
          (q(f"sum by (tenant) (rate(kvgate_stream_events_unread_total{{{TENANT}}}{RATE}))", "{{tenant}}"),)),
    Graph("Rate-limited requests by tenant and limit", "Requests refused by max_in_flight or requests_per_minute "
          "(429), and by the process-wide cap (tenant _all, global_in_flight, 503).", "reqps",
          (q(f"sum by (tenant, limit) (rate(kvgate_rate_limited_total{{{TENANT}}}{RATE}))", "{{tenant}} {{limit}}"),)),
    Graph("Rate-limit decisions taken locally", "requests_per_minute decisions a replica took alone because Redis "
          "did not answer: each replica then grants up to the whole limit. Alert: KvgateRateLimitFallback.", "ops",
          (q(f"sum (rate(kvgate_rate_limit_fallbacks_total{RATE}))", "local decisions"),)),
    Graph("Internal errors by route", "Requests that hit an unexpected gateway error since the gateway started (500 "
          "when the answer had not started); any is a bug. Alert: KvgateInternalErrors.", "short",
          (q(none_while_scraped("sum by (route) (kvgate_internal_errors_total)", "route"), "{{route}}"),), stat=True),
    Graph("Engine fields dropped or refused by tenant", "Body fields that steer vLLM (priority, session_id, "
          "request_id, data_parallel_rank, vllm_xargs), dropped or refused (400) by engine_fields.steering.", "ops",
          (q(f"sum by (tenant, field, action) (rate(kvgate_engine_fields_total{{{TENANT}}}{RATE}))",
             "{{tenant}} {{field}} {{action}}"),)),
    Graph("Isolation canary probes by pool and result", "Canary probes since the gateway started; a fail means a "
          "cache layer served one identity's tokens to another. Alert: KvgateIsolationCanaryFailed.", "short",
          (q("sum by (pool, result) (kvgate_isolation_canary_total)", "{{pool}} {{result}}"),), stat=True),
)

LEDGER = (
    Graph("Ledger store errors by kind", "Failed ledger store writes or reads since the gateway started (kept and "
          "retried): unavailable or the error class. Alert: KvgateLedgerStoreFailing.", "short",
          (q(none_while_scraped("sum by (kind) (kvgate_ledger_store_errors_total)", "kind"), "{{kind}}"),), stat=True),
    Graph("Ledger task restarts by task", "Ledger tasks (writer, subscribers, loops) that ended and were restarted "
          "since the gateway started. Alert: KvgateLedgerTaskRestarting.", "short",
          (q(none_while_scraped("sum by (task) (kvgate_ledger_task_restarts_total)", "task"), "{{task}}"),), stat=True),
    Graph("Ledger events dropped (spool full)", "Block events dropped since the gateway started because the spool "
          "was full; their batches are recorded as gaps. Alert: KvgateLedgerEventsDropped.", "short",
          (q("sum (kvgate_ledger_spool_dropped_events_total)", "dropped events"),), stat=True),
    Graph("Salt digests remembered by replica", "Salt digests each replica keeps for attribution, at most "
          "KVGATE_LEDGER_USER_SALTS (default 100,000).", "short",
          (q("sum by (instance) (kvgate_user_salts_remembered)", "{{instance}}"),), width=12),
    Graph("Salt digests evicted", "Digests the bounded LRU forgot per second; blocks under them are reported as "
          "unattributed. Steady evictions: raise KVGATE_LEDGER_USER_SALTS.", "ops",
          (q(f"sum by (instance) (rate(kvgate_user_salts_evicted_total{RATE}))", "{{instance}}"),), width=12),
)

ECONOMICS = (
    Graph("Offload admission decisions by tenant", "Requests of admission: returning tenants: returning (stored up "
          "to the cap), new and short (sent with max_offload_tokens 0). docs/admission.md.", "reqps",
          (q(f"sum by (tenant, decision) (rate(kvgate_offload_admission_total{{{TENANT}}}{RATE}))",
             "{{tenant}} {{decision}}"),)),
    Graph("Share of requests admitted to the CPU tier by tenant", "returning decisions over all decisions: the "
          "share of a tenant's requests allowed to store their prefix in the offload tier.", "percentunit",
          (q(ratio(f'kvgate_offload_admission_total{{{TENANT}, decision="returning"}}',
                   f"kvgate_offload_admission_total{{{TENANT}}}", "tenant"), "{{tenant}}"),)),
    Graph("Admission decided locally by tenant", "Admission decisions taken by the replica's own sketch because "
          "Redis did not answer: replicas then count only their own traffic.", "ops",
          (q(f"sum by (tenant) (rate(kvgate_offload_admission_errors_total{{{TENANT}}}{RATE}))", "{{tenant}}"),)),
    Graph("Miss-path retries by action and result", "Retries of answers that failed before their first byte: "
          "recompute on the same pool (max_load_tokens or salt), then else_pool; result ok or failed.", "ops",
          (q(f"sum by (tenant, pool, action, result) (rate(kvgate_miss_path_total{{{TENANT_POOL}}}{RATE}))",
             "{{tenant}} on {{pool}} {{action}} {{result}}"),), width=12),
    Graph("Reuse trace requests by tenant and outcome", "Generation requests seen by the reuse trace behind "
          "`kvgate plan`, by what the trace did with them.", "reqps",
          (q(f"sum by (tenant, outcome) (rate(kvgate_reuse_trace_requests_total{{{TENANT}}}{RATE}))",
             "{{tenant}} {{outcome}}"),), width=12),
    Graph("Reuse trace sample rate by tenant", "The trace's current SHARDS sampling rate (lowered as distinct "
          "prefixes exceed the bound).", "percentunit",
          (q(f"max by (tenant) (kvgate_reuse_trace_sample_rate{{{TENANT}}})", "{{tenant}}"),), width=12),
    Graph("Reuse trace store failures", "Failed trace-store writes (kept and retried) and records given up because "
          "the store stayed unreachable, since the gateway started.", "short",
          (q("sum (kvgate_reuse_trace_write_failures_total)", "failed writes"),
           q("sum (kvgate_reuse_trace_records_given_up_total)", "records given up")), width=12, stat=True),
)

ROWS = (
    ("Traffic and errors", TRAFFIC),
    ("Time to first token and ΔTTFT", TTFT),
    ("Prefix cache and offload", CACHE),
    ("KV blocks and retention", BLOCKS),
    ("KV-event health", EVENTS),
    ("Protection", PROTECTION),
    ("Ledger health", LEDGER),
    ("Offload economics", ECONOMICS),
)


def with_queries(builder: PanelBuilder, graph: Graph, panel_id: int) -> PanelBuilder:
    builder = (builder.id(panel_id).title(graph.title).description(graph.description).unit(graph.unit)
               .datasource(DATASOURCE).height(8).span(graph.width))
    for index, query in enumerate(graph.queries):
        builder = builder.with_target(
            prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id("ABCDEFGH"[index])
            .datasource(DATASOURCE))
    return builder


def panel(graph: Graph, panel_id: int) -> Builder[PanelModel]:
    if graph.stat:
        return (with_queries(stat.Panel(), graph, panel_id)
                .graph_mode(common.BigValueGraphMode.NONE).text_mode(common.BigValueTextMode.VALUE_AND_NAME)
                .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return (with_queries(timeseries.Panel(), graph, panel_id)
            .legend(common_builders.VizLegendOptions().show_legend(True)
                    .display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM)))


def label_variable(name: str, label: str) -> Builder[VariableModel]:
    return (dashboard.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query(f"label_values(kvgate_requests_total, {name})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all")))


def build() -> dict[str, object]:
    builder = (dashboard.Dashboard("kvgate").uid(UID).tags(["kvgate", "vllm"]).editable().refresh("30s")
               .description("kvgate in front of vLLM: traffic, TTFT and ΔTTFT, cache and offload, KV-block "
                            "retention and KV-event health, protection, ledger health and offload economics, "
                            "per tenant.")
               .time("now-1h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
               .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
                              .current(VariableOption(selected=True, text="Prometheus", value="prometheus")))
               .with_variable(label_variable("tenant", "Tenant"))
               .with_variable(label_variable("pool", "Pool")))
    panel_id = 0
    for title, graphs in ROWS:
        panel_id += 1
        builder = builder.with_row(dashboard.Row(title).id(panel_id))
        for graph in graphs:
            panel_id += 1
            builder = builder.with_panel(panel(graph, panel_id))
    built: dict[str, object] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return built


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default {OUTPUT})")
    parser.add_argument("--check", action="store_true", help="compare with --output instead of writing it")
    parser.add_argument("--stdout", action="store_true", help="print the dashboard instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
