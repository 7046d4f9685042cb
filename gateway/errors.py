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


class UpstreamUnavailable(GatewayError):
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
