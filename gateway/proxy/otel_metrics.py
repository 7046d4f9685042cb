"""OpenTelemetry GenAI semantic-convention metrics, under the names an OTel→Prometheus export gives them.

Opt-in (`KVGATE_OTEL_METRICS=true`), next to the `kvgate_*` metrics, on the same injected registry, so
dashboards and tools written against the GenAI conventions (Envoy AI Gateway and others emit the same
set) work unchanged against kvgate:

| OTel instrument                          | Prometheus family                               |
| ---------------------------------------- | ----------------------------------------------- |
| `gen_ai.server.request.duration`         | `gen_ai_server_request_duration_seconds`        |
| `gen_ai.server.time_to_first_token`      | `gen_ai_server_time_to_first_token_seconds`     |
| `gen_ai.server.time_per_output_token`    | `gen_ai_server_time_per_output_token_seconds`   |
| `gen_ai.client.token.usage`              | `gen_ai_client_token_usage`                     |

Dots become underscores (Prometheus 2.x rejects dotted names) and the buckets are the conventions'
advisory ones. Attributes: `gen_ai_operation_name`, `gen_ai_provider_name` (required);
`gen_ai_request_model` (when known); `error_type` (on failures, request duration only);
`gen_ai_token_type` (`input`/`output`, token usage only). The tenant is deliberately not a label here:
it is not a convention attribute, and the `kvgate_*` families already carry it.

`gen_ai_request_model` comes from the client's request body, so it is guarded against unbounded
cardinality: only a model that upstream accepted (a reply below 400) becomes a label value, at most
`max_models` distinct ones; anything else is `_OTHER`, the conventions' fallback value.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram

from gateway.outcomes import Outcome
from gateway.proxy.features import RequestFeature
from gateway.proxy.record import Exchange
from gateway.proxy.sse import Usage
from gateway.routes import ROUTES

PROVIDER_NAME = "vllm"  # no well-known value exists for vLLM; the conventions allow a custom one
OTHER = "_OTHER"
DEFAULT_MAX_MODELS = 100

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_DURATION_BUCKETS = tuple(0.01 * 2**step for step in range(14))  # 0.01, 0.02, ... 81.92
TOKEN_USAGE_BUCKETS = tuple(float(4**step) for step in range(14))  # 1, 4, 16, ... 67108864

BASE_LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")


class GenAIExchange(Protocol):
    """What one finished request must tell (gateway.proxy.record.Exchange, once it carries the model)."""

    @property
    def route(self) -> str: ...

    @property
    def status(self) -> int: ...

    @property
    def outcome(self) -> str: ...

    @property
    def model(self) -> str | None: ...

    @property
    def ttft_s(self) -> float | None: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def usage(self) -> Usage | None: ...


class OtelGenAIMetrics:
    def __init__(
        self, registry: CollectorRegistry, provider_name: str = PROVIDER_NAME, max_models: int = DEFAULT_MAX_MODELS
    ) -> None:
        self.provider_name = provider_name
        self.max_models = max_models
        self._models: set[str] = set()
        self.request_duration = Histogram(
            "gen_ai_server_request_duration_seconds", "GenAI server request duration (gen_ai.server.request.duration).",
            [*BASE_LABELS, "error_type"], buckets=REQUEST_DURATION_BUCKETS, registry=registry)
        self.time_to_first_token = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time to generate the first token, for successful streamed responses (gen_ai.server.time_to_first_token).",
            BASE_LABELS, buckets=TTFT_BUCKETS, registry=registry)
        self.time_per_output_token = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first, for successful streamed responses "
            "(gen_ai.server.time_per_output_token).",
            BASE_LABELS, buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS, registry=registry)
        self.token_usage = Histogram(
            "gen_ai_client_token_usage", "Input and output tokens per request (gen_ai.client.token.usage).",
            [*BASE_LABELS, "gen_ai_token_type"], buckets=TOKEN_USAGE_BUCKETS, registry=registry)

    def record(self, exchange: GenAIExchange) -> None:
        spec = ROUTES.get(exchange.route)
        operation = spec.genai_operation if spec is not None else None
        if operation is None:
            return  # not a GenAI operation: /v1/models, /tokenize, admin, health, metrics, unmatched paths
        failed = exchange.status >= 400 or exchange.outcome != Outcome.OK
        base = (operation, self.provider_name, self._model_label(exchange.model, accepted=exchange.status < 400))
        self.request_duration.labels(*base, _error_type(exchange) if failed else "").observe(exchange.duration_s)
        if failed:
            return
        if exchange.ttft_s is not None:
            self.time_to_first_token.labels(*base).observe(exchange.ttft_s)
        usage = exchange.usage
        if usage is not None:
            self.token_usage.labels(*base, "input").observe(usage.prompt_tokens)
            if operation != "embeddings":
                self.token_usage.labels(*base, "output").observe(usage.completion_tokens)
            if exchange.ttft_s is not None and usage.completion_tokens > 1:
                after_first = max(exchange.duration_s - exchange.ttft_s, 0.0)
                self.time_per_output_token.labels(*base).observe(after_first / (usage.completion_tokens - 1))

    def _model_label(self, model: str | None, accepted: bool) -> str:
        if not model:
            return ""
        if model in self._models:
            return model
        if accepted and len(self._models) < self.max_models:
            self._models.add(model)
            return model
        return OTHER


def _error_type(exchange: GenAIExchange) -> str:
    """The HTTP status when there is an error status; else the gateway's outcome name (e.g. a stream that broke)."""
    if exchange.status >= 400:
        return str(exchange.status)
    return exchange.outcome if exchange.outcome != Outcome.OK else OTHER


class OtelFeature(RequestFeature):
    """GenAI metrics for every finished request, refused ones included."""

    name = "otel-genai"

    def __init__(self, metrics: OtelGenAIMetrics) -> None:
        self.metrics = metrics

    def finished(self, ex: Exchange) -> None:
        self.metrics.record(ex)
