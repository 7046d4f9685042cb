"""The opt-in OpenTelemetry GenAI metrics (gateway/proxy/otel_metrics.py): the conventions' names (OTel→Prometheus
translated), buckets and attributes, cardinality guard on the client-supplied model, and an exposition that
`promtool check metrics` accepts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.proxy.otel_metrics import (
    OTHER,
    REQUEST_DURATION_BUCKETS,
    TIME_PER_OUTPUT_TOKEN_BUCKETS,
    TOKEN_USAGE_BUCKETS,
    TTFT_BUCKETS,
    OtelGenAIMetrics,
)
from gateway.proxy.sse import Usage
from gateway.settings import Settings
from tests.deploy.tools import output, run, system_tool


@dataclass
class Finished:
    """The fields of gateway.proxy.record.Exchange that OtelGenAIMetrics.record reads."""

    route: str = "/v1/chat/completions"
    status: int = 200
    outcome: str = "ok"
    model: str | None = "qwen3-8b"
    ttft_s: float | None = 0.05
    duration_s: float = 0.45
    usage: Usage | None = None


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    exposition = generate_latest(registry).decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition) for sample in family.samples}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    wanted = frozenset({**labels}.items())
    return sum(v for (sample, have), v in samples(registry).items() if sample == name and wanted <= have)


# The OpenTelemetry GenAI semantic conventions' advised bucket boundaries, written out from the conventions
# (not from gateway.otel_metrics), and compared with what a scrape actually shows.
CONVENTION_BUCKETS: dict[str, list[float]] = {
    "gen_ai_server_request_duration_seconds": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                               20.48, 40.96, 81.92],
    "gen_ai_server_time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                                  1.0, 2.5, 5.0, 7.5, 10.0],
    "gen_ai_server_time_per_output_token_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                                    1.0, 2.5],
    "gen_ai_client_token_usage": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                                  67108864],
}


def test_the_conventions_buckets() -> None:
    registry = CollectorRegistry()
    OtelGenAIMetrics(registry).record(Finished(usage=Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=5)))
    exposed: dict[str, set[float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf":
                exposed.setdefault(sample.name.removesuffix("_bucket"), set()).add(float(sample.labels["le"]))
    assert {name: sorted(bounds) for name, bounds in exposed.items()} == {
        name: [float(bound) for bound in bounds] for name, bounds in CONVENTION_BUCKETS.items()}
    assert list(REQUEST_DURATION_BUCKETS) == pytest.approx(CONVENTION_BUCKETS["gen_ai_server_request_duration_seconds"])
    assert list(TTFT_BUCKETS) == CONVENTION_BUCKETS["gen_ai_server_time_to_first_token_seconds"]
    assert list(TIME_PER_OUTPUT_TOKEN_BUCKETS) == CONVENTION_BUCKETS["gen_ai_server_time_per_output_token_seconds"]
    assert list(TOKEN_USAGE_BUCKETS) == CONVENTION_BUCKETS["gen_ai_client_token_usage"]


def test_a_streamed_chat_request_records_every_instrument() -> None:
    registry = CollectorRegistry()
    otel = OtelGenAIMetrics(registry)
    otel.record(Finished(usage=Usage(prompt_tokens=1200, cached_tokens=1024, completion_tokens=9)))
    base = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm", "gen_ai_request_model": "qwen3-8b"}
    assert value(registry, "gen_ai_server_request_duration_seconds_count", **base) == 1
    assert value(registry, "gen_ai_server_request_duration_seconds_sum", **base) == 0.45
    assert value(registry, "gen_ai_server_time_to_first_token_seconds_sum", **base) == 0.05
    assert value(registry, "gen_ai_server_time_per_output_token_seconds_sum", **base) == (0.45 - 0.05) / 8
    assert value(registry, "gen_ai_client_token_usage_sum", gen_ai_token_type="input", **base) == 1200
    assert value(registry, "gen_ai_client_token_usage_sum", gen_ai_token_type="output", **base) == 9
    assert value(registry, "gen_ai_server_request_duration_seconds_bucket", le="0.64", **base) == 1
    assert value(registry, "gen_ai_server_request_duration_seconds_bucket", le="0.32", **base) == 0
    labels = {name for (_, have) in samples(registry) for name, _ in have}
    error_types = {label for (_, have) in samples(registry) for name, label in have if name == "error_type"}
    assert error_types == {""}, "error_type is only set on failures (an empty label is an absent one)"
    assert "tenant" not in labels, "tenant is not a convention attribute; the kvgate_* families carry it"


def test_operations_failures_and_routes_outside_the_conventions() -> None:
    registry = CollectorRegistry()
    otel = OtelGenAIMetrics(registry)
    otel.record(Finished(route="/v1/completions", ttft_s=None, usage=Usage(10, 0, 4)))
    otel.record(Finished(route="/v1/embeddings", ttft_s=None, usage=Usage(10, 0, 0)))
    otel.record(Finished(status=503, ttft_s=None))
    otel.record(Finished(outcome="upstream_failed_mid_stream", usage=Usage(10, 0, 3)))
    otel.record(Finished(route="/v1/models"))
    otel.record(Finished(route="/metrics", model=None))
    count = "gen_ai_server_request_duration_seconds_count"
    assert value(registry, count, gen_ai_operation_name="text_completion") == 1
    assert value(registry, count, gen_ai_operation_name="embeddings") == 1
    assert value(registry, count, gen_ai_operation_name="chat", error_type="503") == 1
    assert value(registry, count, gen_ai_operation_name="chat", error_type="upstream_failed_mid_stream") == 1
    assert value(registry, count) == 4, "/v1/models and /metrics are not GenAI operations"
    assert value(registry, "gen_ai_client_token_usage_count", gen_ai_token_type="output") == 1
    assert value(registry, "gen_ai_server_time_to_first_token_seconds_count") == 0, "failures record duration only"


def test_client_supplied_models_cannot_explode_cardinality() -> None:
    registry = CollectorRegistry()
    otel = OtelGenAIMetrics(registry, max_models=2)
    otel.record(Finished(model="junk-1", status=404, ttft_s=None))
    for model in ("a", "b", "c"):
        otel.record(Finished(model=model))
    otel.record(Finished(model="a", status=400, ttft_s=None))
    models = {label for (name, have) in samples(registry) for key, label in have
              if name == "gen_ai_server_request_duration_seconds_count" and key == "gen_ai_request_model"}
    assert models == {"a", "b", OTHER}, "only models upstream accepted, at most max_models of them"


def test_exposition_passes_promtool_check_metrics() -> None:
    registry = CollectorRegistry()
    otel = OtelGenAIMetrics(registry)
    otel.record(Finished(usage=Usage(100, 64, 5)))
    otel.record(Finished(status=502, ttft_s=None))
    result = run([system_tool("promtool"), "check", "metrics"], stdin=generate_latest(registry).decode())
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), output(result)


def test_opt_in_setting() -> None:
    assert Settings().otel_metrics is False
    assert Settings(otel_metrics=True).otel_metrics is True
