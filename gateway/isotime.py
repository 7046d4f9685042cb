"""ISO 8601 times as the CLI and the admin API accept them."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_since(text: str) -> datetime:
    """An ISO 8601 time; one without a zone is taken as UTC."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
