"""Process settings from `KVGATE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings of one gateway process. Command-line flags override these in `cli.py`."""

    model_config = SettingsConfigDict(env_prefix="KVGATE_", extra="ignore")

    policies: Path = Path("policies")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=256)  # serving processes on the one port (`serve --workers`)
    # How workers share the port: one listening socket (default), or one per worker with SO_REUSEPORT.
    workers_listen: Literal["shared", "reuseport"] = "shared"
    salt_secret: SecretStr | None = None
    redis_url: str | None = None
    state_path: Path = Path("kvgate-state.sqlite3")
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=300.0, gt=0)
    upstream_connections: int = Field(default=1024, ge=1)
    reload_interval_s: float = Field(default=1.0, gt=0)
    shadow_timeout_s: float = Field(default=120.0, gt=0)
    shadow_flush_interval_s: float = Field(default=0.5, gt=0)  # shadow results are written in batches this often
    admission_sketch_width: int = Field(default=65536, ge=1, le=65536)  # counters per row (power of two)
    otel_metrics: bool = False  # also expose the OpenTelemetry GenAI metrics (gateway/proxy/otel_metrics.py)
    # Connection and request limits, enforced before any key is checked (gateway/limits/, docs/limits.md).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)  # request line + headers; beyond: 431
    header_timeout_s: float = Field(default=10.0, gt=0)  # first byte of a request to the end of its headers
    idle_timeout_s: float = Field(default=15.0, gt=0)  # a connection with no request in progress is closed
    body_timeout_s: float = Field(default=60.0, gt=0)  # end of headers to the end of the request body
    max_connections: int = Field(default=4096, ge=1)  # open client connections; beyond: 503 and close
    max_in_flight: int = Field(default=1024, ge=1)  # requests being served, all tenants; beyond: 503
    json_max_depth: int = Field(default=64, ge=2, le=512)  # nesting; the decoder itself stops near 1,000
    json_max_items: int = Field(default=262_144, ge=1)  # values in a body (objects, arrays, members)
    reuse_trace: bool = True  # record the reuse trace (gateway/reuse/trace.py) for `kvgate plan`
    reuse_block_tokens: int = Field(default=16, gt=0)  # tokens per fingerprint: the upstream's GPU block size
    reuse_sample_rate: float = Field(default=1.0, gt=0, le=1)  # starting SHARDS rate of the reuse trace
    reuse_max_roots: int = Field(default=20_000, gt=0)  # distinct sampled prefix roots per tenant
    reuse_max_records: int = Field(default=50_000, gt=0)  # trace records kept per tenant


MIN_SALT_SECRET_BYTES = 32


class SaltSecretError(ValueError):
    """The salt secret is missing or too short to keep salts unguessable."""


def salt_secret_bytes(settings: Settings) -> bytes:
    """The validated salt secret: every cache salt is an HMAC under it, so an empty or short one would let
    anyone who knows tenant names compute salts. The proxy and the ledger use this one value."""
    value = settings.salt_secret.get_secret_value().encode() if settings.salt_secret is not None else b""
    if not value:
        raise SaltSecretError("KVGATE_SALT_SECRET must be set (the secret cache salts are derived from); "
                              "generate one with `openssl rand -hex 32`")
    if len(value) < MIN_SALT_SECRET_BYTES:
        raise SaltSecretError(f"KVGATE_SALT_SECRET is {len(value)} bytes; it must be at least "
                              f"{MIN_SALT_SECRET_BYTES} (generate one with `openssl rand -hex 32`)")
    return value
