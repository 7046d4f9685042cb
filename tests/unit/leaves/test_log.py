"""Logging as a served process sets it up, run in a child interpreter (structlog's configuration is global, so the
test process's own stays untouched): one JSON object per line, levels filtered, request context merged, and the
standard-library bridge that keeps exception messages (which may quote a prompt or a key) out of the log."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.log import UtcIsoStamper, stack_frames

SECRET = "PROMPT-TEXT-kvg_secretkey-salt"  # stands for anything that must never reach a log line


def run_logging(body: str, fmt: str = "json", level: str = "info") -> str:
    script = textwrap.dedent(f"""
        import logging, pathlib, structlog
        from gateway.log import configure_logging, get_logger
        configure_logging({fmt!r}, {level!r})
        log = get_logger("test")
    """) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == ""  # everything goes to stderr
    return done.stderr


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_each_event_is_one_json_object_with_level_and_utc_time() -> None:
    (line,) = json_lines(run_logging('log.info("request_done", tenant="acme", status=200, ttft_s=0.25)'))
    assert {key: line[key] for key in ("event", "tenant", "status", "ttft_s", "level")} == {
        "event": "request_done", "tenant": "acme", "status": 200, "ttft_s": 0.25, "level": "info"}
    assert line["timestamp"].endswith("Z")


@pytest.mark.parametrize(("level", "events"), [
    ("debug", ["d", "i", "w", "e"]), ("info", ["i", "w", "e"]), ("warning", ["w", "e"]), ("error", ["e"]),
])
def test_events_below_the_level_are_dropped(level: str, events: list[str]) -> None:
    out = run_logging('log.debug("d"); log.info("i"); log.warning("w"); log.error("e")', level=level)
    assert [line["event"] for line in json_lines(out)] == events


def test_request_context_from_contextvars_is_merged_into_every_line() -> None:
    out = run_logging("""
        structlog.contextvars.bind_contextvars(request_id="req-1")
        log.info("one")
        structlog.contextvars.clear_contextvars()
        log.info("two")
    """)
    one, two = json_lines(out)
    assert one["request_id"] == "req-1" and "request_id" not in two


def test_values_json_cannot_encode_are_written_as_text() -> None:
    (line,) = json_lines(run_logging('log.info("paths", path=pathlib.Path("/tmp/x"), raw=b"ab")'))
    assert line["path"] == "/tmp/x"


def test_library_log_records_join_the_same_json_stream() -> None:
    (line,) = json_lines(run_logging('logging.getLogger("uvicorn.error").warning("port %d busy", 8080)'))
    assert (line["event"], line["logger"], line["level"]) == ("port 8080 busy", "uvicorn.error", "warning")


def test_an_exceptions_message_never_reaches_the_log_only_its_type_and_frames() -> None:
    out = run_logging(f"""
        def handler():
            raise ValueError("could not parse {SECRET}")
        try:
            handler()
        except ValueError:
            logging.getLogger("asyncio").exception("Task exception was never retrieved")
    """)
    assert SECRET not in out
    (line,) = json_lines(out)
    assert (line["event"], line["error_type"], line["level"]) == ("Task exception was never retrieved",
                                                                  "ValueError", "error")
    assert line["stack"][-1].endswith(" in handler")


def test_library_records_below_the_level_are_dropped() -> None:
    assert run_logging('logging.getLogger("lib").info("chatty")', level="warning") == ""


def test_the_console_format_is_plain_text() -> None:
    out = run_logging('log.info("hello", tenant="acme")', fmt="console")
    assert "hello" in out and "tenant=acme" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_stack_frames_name_file_line_and_function() -> None:
    def inner() -> None:
        raise RuntimeError(SECRET)

    try:
        inner()
    except RuntimeError as error:
        frames = stack_frames(error.__traceback__)
    assert len(frames) == 2
    assert frames[-1].startswith(__file__ + ":") and frames[-1].endswith(" in inner")
    assert all(SECRET not in frame for frame in frames)
    assert stack_frames(None) == []


@pytest.mark.parametrize("nanos", [
    0, 1_000, 999_999_999, 1_764_613_805_000_000_000, 1_764_613_805_000_000_999, 1_764_613_805_123_456_789,
    1_764_613_806_000_001_000,
])
def test_the_cached_stamp_is_the_text_structlogs_iso_utc_stamper_writes(nanos: int) -> None:
    expected = datetime.fromtimestamp(nanos // 1000 / 1e6, tz=UTC).isoformat().replace("+00:00", "Z")
    assert UtcIsoStamper(lambda: nanos)(None, "info", {})["timestamp"] == expected


def test_the_stamp_follows_the_clock_across_seconds() -> None:
    now = [1_764_613_805_999_999_000]
    stamper = UtcIsoStamper(lambda: now[0])
    first = stamper(None, "info", {})["timestamp"]
    now[0] += 2_000
    assert (first, stamper(None, "info", {})["timestamp"]) == (
        "2025-12-01T18:30:05.999999Z", "2025-12-01T18:30:06.000001Z")


# -- the per-request line (gateway.log.EventLine) ----------------------------------------------------------------

BOTH_WAYS = """
    from gateway.log import EventLine
    structlog.contextvars.bind_contextvars(worker=3)
    fields = {"request_id": "r1", "tenant": "acme", "status": 200, "outcome": "ok", "ttft_ms": 12.5, "error": None,
              "miss_path": [{"pool": "a", "failure": "x"}]}
    log.info("request", **fields)
    EventLine("test", FORMAT, LEVEL).info("request", dict(fields))
"""


def both_ways(fmt: str, level: str) -> str:
    return run_logging(BOTH_WAYS.replace("FORMAT", repr(fmt)).replace("LEVEL", repr(level)), fmt=fmt, level=level)


def without_time(line: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in line.items() if key != "timestamp"]


def test_the_request_line_is_the_line_structlog_writes_keys_in_order() -> None:
    """Wrong version: the context variable (the worker) or the level left out, or the keys in another order."""
    out = both_ways("json", "info")
    through_structlog, direct = json_lines(out)
    assert without_time(direct) == without_time(through_structlog)
    assert list(direct)[-4:] == ["event", "worker", "level", "timestamp"]
    assert direct["timestamp"].endswith("Z")


@pytest.mark.parametrize("level", ["warning", "error"])
def test_the_request_line_follows_the_level(level: str) -> None:
    assert both_ways("json", level) == ""


def test_the_console_format_goes_through_structlog() -> None:
    out = both_ways("console", "info")
    structlog_line, direct_line = out.splitlines()
    assert direct_line.split(" ", 1)[1] == structlog_line.split(" ", 1)[1]  # the same text after the time
