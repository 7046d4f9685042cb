"""Gateway errors and their OpenAI-shaped bodies."""

from __future__ import annotations

import json
from typing import Any


class GatewayError(Exception):
    """An error the gateway answers itself, in the OpenAI error shape."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return openai_error_body(self.message, self.error_type, self.param, self.code)

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers of this error (e.g. Retry-After)."""
        return []


class BadRequest(GatewayError):
    status_code = 400


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(GatewayError):
    status_code = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status_code = 405


class PayloadTooLarge(GatewayError):
    status_code = 413


class UnsupportedMediaType(GatewayError):
    status_code = 415


class RequestTimeout(GatewayError):
    status_code = 408


class Retryable(GatewayError):
    """A refusal the client may retry after `retry_after_s` seconds (sent as Retry-After); every refusal of one
    kind carries that kind's `error_code`."""

    error_code: str

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, code=self.error_code)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]


class TooManyRequests(Retryable):
    status_code = 429
    error_type = "rate_limit_error"
    error_code = "rate_limit_exceeded"


class Overloaded(Retryable):
    status_code = 503
    error_type = "overloaded_error"
    error_code = "overloaded"


class InternalError(GatewayError):
    status_code = 500
    error_type = "internal_error"


class ServiceUnavailable(GatewayError):
    """A store the endpoint reads (ledger, shadow results, reuse trace) cannot be read now; the client may retry."""

    status_code = 503
    error_type = "service_unavailable"


class UpstreamUnavailable(GatewayError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamAnswerTooLarge(GatewayError):
    """An answer the gateway reads whole (a body, an error, a stream it assembles) grew past `max_answer_bytes`."""

    status_code = 502
    error_type = "upstream_error"


class UpstreamTimeout(GatewayError):
    status_code = 504
    error_type = "upstream_error"


def openai_error_body(
    message: str, error_type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_bytes(error: GatewayError) -> bytes:
    return json.dumps(error.body()).encode()
