"""vLLM-shaped error replies: `{"error": {"message", "type", "param", "code"}}` with `code` the HTTP status."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """vLLM's `type` for an error status: its error class name, else the HTTP phrase."""
    if status in _TYPES:
        return _TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_body(status: int, message: str, type_: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_ or error_type(status), "param": param, "code": status}}


class SimError(Exception):
    """An error reply to send instead of a result."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(status, message, type_, param)


def bad_request(message: str, param: str | None = None) -> SimError:
    """An engine-side 400 (`BadRequestError`), e.g. context overflow or an out-of-vocabulary token."""
    return SimError(400, message, param=param)


def validation_error(loc: tuple[str | int, ...], kind: str, msg: str, param: str | None = None) -> SimError:
    """A request-validation 400 shaped like vLLM's pydantic path (`type` "Bad Request", param from loc)."""
    detail = {"type": kind, "loc": loc, "msg": msg}
    dotted = ".".join(str(part) for part in loc)
    return SimError(400, f"1 validation error:\n  {detail!r}", "Bad Request", param if param else dotted)


def salt_error(message: str) -> SimError:
    return validation_error(("body",), "value_error", f"Value error, {message} (parameter=cache_salt)", "cache_salt")


def unknown_model(name: str) -> SimError:
    return SimError(404, f"The model `{name}` does not exist.", param="model")


def route_error(status: int) -> SimError:
    """Starlette-style route errors (unknown path, wrong method), in vLLM's error shape."""
    phrase = HTTPStatus(status).phrase
    return SimError(status, phrase, phrase)
