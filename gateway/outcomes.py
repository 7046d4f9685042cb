"""The closed sets of outcome names: request outcomes (log lines, GenAI error types) and shadow outcomes (metric
labels and the shadow store's counters). Values are the label strings already published; only the typing is new."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """How a request ended, as far as the gateway is concerned (the HTTP status says the rest)."""

    OK = "ok"
    CLIENT_DISCONNECTED = "client_disconnected"
    UPSTREAM_FAILED_MID_STREAM = "upstream_failed_mid_stream"
    REFUSED = "refused"  # a GatewayError answered by the gateway itself; the log line also names the error class
    MISS_PATH_EXHAUSTED = "miss_path_exhausted"  # every miss-path attempt failed; the client got the last failure


class ShadowOutcome(StrEnum):
    COMPARED = "compared"
    DROPPED = "dropped"  # over the tenant's max_in_flight
    ERROR = "error"  # the shadow arm failed or timed out
