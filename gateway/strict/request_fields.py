"""Body fields checked before a request is rewritten (docs/http.md, "Request fields").

Two concerns, both pure:

* The fields the gateway itself reads must hold exactly one JSON type (or null). vLLM's models are lax
  (`"stream": "true"` streams), so a loose value would make the gateway and the engine disagree about the
  request — e.g. no usage, no TTFT — and is refused with 400 instead.
* Fields that steer the engine (scheduling priority, session and request ids, data-parallel rank, the
  free-form `vllm_xargs`) follow the tenant's `engine_fields.steering` policy, like the steering headers
  that never travel upstream: `drop` (default) removes them, `reject` answers 400. Transfer parameters
  smuggled through `vllm_xargs` or `ec_transfer_params` are always refused. On `/v1/responses`,
  `previous_response_id`, `store: true` and `background: true` are refused unless the tenant's
  `engine_fields.responses_store` is true, and `store: false` is sent explicitly (vLLM stores by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import BadRequest
from gateway.policy.model import EngineFieldsPolicy
from gateway.routes import Kind, RouteSpec

RESPONSES_PATH = "/v1/responses"
# Request-model fields of vLLM's completions, chat, responses and embeddings APIs that steer scheduling or
# identity rather than the generated text.
STEERING_FIELDS = ("priority", "session_id", "request_id", "data_parallel_rank", "vllm_xargs")
# Transfer parameters reach the KV/encoder connectors; only the gateway may set them (kv_transfer_params caps).
TRANSFER_FIELDS = ("kv_transfer_params", "ec_transfer_params")
STORE_FIELDS = ("previous_response_id", "store", "background")
# Every field this module may name in a metric label: a closed set.
COUNTED_FIELDS = frozenset(STEERING_FIELDS + TRANSFER_FIELDS + STORE_FIELDS)


class FieldRefused(BadRequest):
    """A steering, transfer or store field refused by policy (counted per field)."""

    def __init__(self, message: str, *, param: str, field: str) -> None:
        super().__init__(message, param=param)
        self.field = field


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_object(value: object) -> bool:
    return isinstance(value, dict)


Check = tuple[Callable[[object], bool], str]
TYPED_FIELDS: dict[str, Check] = {
    "stream": (_is_bool, "a boolean"),
    "stream_options": (_is_object, "an object"),
    "temperature": (_is_number, "a number"),
    "seed": (_is_int, "an integer"),
    "user": (_is_str, "a string"),
    "kv_transfer_params": (_is_object, "an object"),
}
STREAM_OPTION_FIELDS: dict[str, Check] = {
    "include_usage": (_is_bool, "a boolean"),
    "continuous_usage_stats": (_is_bool, "a boolean"),
}
RESPONSES_FIELDS: dict[str, Check] = {
    "store": (_is_bool, "a boolean"),
    "background": (_is_bool, "a boolean"),
    "previous_response_id": (_is_str, "a string"),
}


def check_types(request: dict[str, Any], route: RouteSpec) -> None:
    """400 unless every field the gateway reads is null or of its one JSON type."""
    _check(request, TYPED_FIELDS, "")
    options = request.get("stream_options")
    if isinstance(options, dict):
        _check(options, STREAM_OPTION_FIELDS, "stream_options.")
    if route.path == RESPONSES_PATH:
        _check(request, RESPONSES_FIELDS, "")


def _check(holder: dict[str, Any], checks: dict[str, Check], prefix: str) -> None:
    for name, (accepts, kind) in checks.items():
        value = holder.get(name)
        if value is not None and not accepts(value):
            raise BadRequest(f"{prefix}{name} must be {kind} (got {_json_type(value)}).", param=prefix + name)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "null"


def apply_engine_policy(request: dict[str, Any], route: RouteSpec, policy: EngineFieldsPolicy) -> list[str]:
    """Refuse or drop engine-steering fields per policy; returns the names of the fields dropped."""
    if route.kind not in (Kind.GENERATE, Kind.EMBED):
        return []
    _refuse_transfer_doors(request)
    dropped = _steering(request, policy)
    if route.path == RESPONSES_PATH:
        _responses_store(request, policy)
    return dropped


def _refuse_transfer_doors(request: dict[str, Any]) -> None:
    if "ec_transfer_params" in request:
        raise FieldRefused("ec_transfer_params is not allowed.", param="ec_transfer_params",
                           field="ec_transfer_params")
    xargs = request.get("vllm_xargs")
    if isinstance(xargs, dict):
        for name in TRANSFER_FIELDS:
            if name in xargs:
                raise FieldRefused(f"vllm_xargs.{name} is not allowed.", param=f"vllm_xargs.{name}", field=name)


def _steering(request: dict[str, Any], policy: EngineFieldsPolicy) -> list[str]:
    present = [name for name in STEERING_FIELDS if name in request]
    if present and policy.steering == "reject":
        name = present[0]
        raise FieldRefused(f"{name} steers the inference engine; this tenant may not send it.", param=name,
                           field=name)
    for name in present:
        del request[name]
    return present


def _responses_store(request: dict[str, Any], policy: EngineFieldsPolicy) -> None:
    if policy.responses_store:
        return
    for name in ("previous_response_id", "store", "background"):
        value = request.get(name)
        if value is not None and value is not False:
            raise FieldRefused(f"{name} needs stored responses, which this tenant's policy does not allow.",
                               param=name, field=name)
    request["store"] = False
