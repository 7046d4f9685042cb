"""structlog set-up: one JSON object per line (or a console rendering), request context from contextvars.

Callers log identifiers and numbers only: never prompts, outputs, API keys or salts.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import TracebackType
from typing import Literal

import msgspec
import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: Literal["json", "console"] = "json", level: str = "info") -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_json)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # uvicorn, asyncio and libraries log through the standard library; route them into the same JSON stream
    # so nothing (tracebacks included) reaches stderr as plain text.
    root = logging.getLogger()
    root.handlers = [StdlibBridge()]
    root.setLevel(LEVELS[level])


class StdlibBridge(logging.Handler):
    """A logging handler that re-emits standard-library records as structlog events.

    An exception is logged as its type and stack frames (file, line, function) only: exception messages
    may quote request data.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, object] = {"logger": record.name}
            if record.exc_info is not None and record.exc_info[1] is not None:
                fields["error_type"] = type(record.exc_info[1]).__name__
                fields["stack"] = stack_frames(record.exc_info[2])
            get_logger(record.name).log(record.levelno, record.getMessage(), **fields)
        except Exception:  # a broken log record must never take a request down
            self.handleError(record)


def stack_frames(tb: TracebackType | None) -> list[str]:
    return [f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in traceback.extract_tb(tb)]


def _json(event: object, **_: object) -> str:
    return msgspec.json.encode(event, enc_hook=str).decode()


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
