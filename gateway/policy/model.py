"""Pydantic models of the policy directory (docs/policies.md). Pure data, no I/O."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Scope = Literal["inference", "metrics", "admin"]
# What `allowed_media` may list: a closed vocabulary. The media events report are an open set
# (gateway/kvevents/media.py), each compared with this list.
Medium = Literal["GPU", "CPU", "STORAGE", "DISK", "REMOTE"]

# What a pool's vLLM servers offload through; decides what the gateway stamps into `kv_transfer_params`
# (docs/lmcache.md). `offloading` is vLLM's native OffloadingConnector, today's behaviour.
Connector = Literal["offloading", "lmcache", "lmcache-mp", "none"]
LMCACHE_CONNECTORS: frozenset[str] = frozenset({"lmcache", "lmcache-mp"})
EventFormat = Literal["vllm", "lmcache"]
RESERVED_TENANT = "unattributed"
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MEDIA: tuple[Medium, ...] = ("GPU", "CPU")
PUBLIC_CAPABLE_PATHS = frozenset({"/livez", "/readyz", "/metrics"})
GATEWAY_ENV_PREFIX = "KVGATE_"
MAX_SALT_EPOCH = 1_000_000  # a counter raised by `tenant forget`; a date-like value is a mistake
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A `tcp://host:port` endpoint's port; the replay endpoint defaults to port + 1 (gateway/kvevents/endpoints.py).
TCP_PORT = re.compile(r"^tcp://.*:(\d+)$")
MAX_PORT = 65535


class Strict(BaseModel):
    # Numeric fields below are declared `strict=True`: a YAML yes/no (a boolean) or a quoted "512" is refused, naming
    # the field, instead of being read as 1 or 512.
    model_config = ConfigDict(extra="forbid", frozen=True)


class KvEventSource(Strict):
    endpoint: str
    replay: str | None = None
    format: EventFormat | None = None  # None: by the pool's connector (lmcache pools: lmcache, else vllm)


class CanaryPolicy(Strict):
    """The isolation canary of one pool (gateway/canary/): off unless an interval is set."""

    interval_s: float | None = Field(default=None, ge=60, strict=True)
    prefix_tokens: int = Field(default=1024, ge=256, le=32768, strict=True)
    model: str | None = None  # the model name to send; None asks the pool's /v1/models
    # Wait between identity A's request and B's, for servers that store asynchronously (an LMCache server):
    # B must not arrive before A's blocks have landed, or a pass proves nothing.
    settle_s: float = Field(default=0.0, ge=0, le=30, strict=True)


class PoolConfig(Strict):
    upstreams: list[str] = Field(min_length=1)
    api_key_env: str | None = None
    kv_events: list[str | KvEventSource] = Field(default_factory=list)
    connector: Connector = "offloading"
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy)

    @property
    def lmcache(self) -> bool:
        return self.connector in LMCACHE_CONNECTORS

    # How the miss path forces a recompute here: `max_load_tokens` (the server honours `max_load_tokens: 0`),
    # `salt` (a one-time cache salt; works on any server), or `auto` (ask GET /version: salt unless the
    # server is a version known to honour max_load_tokens).
    recompute: Literal["auto", "max_load_tokens", "salt"] = "auto"

    @field_validator("upstreams")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must start with http:// or https://")
        return [url.rstrip("/") for url in urls]

    @field_validator("kv_events")
    @classmethod
    def _replay_port_exists(cls, entries: list[str | KvEventSource]) -> list[str | KvEventSource]:
        # Without `replay`, kvgate asks port + 1 for replay; on the last TCP port there is none.
        for entry in entries:
            endpoint = entry if isinstance(entry, str) else None if entry.replay else entry.endpoint
            port = TCP_PORT.match(endpoint) if endpoint is not None else None
            if port is not None and int(port[1]) > MAX_PORT:
                raise ValueError(f"kv_events endpoint {endpoint!r}: {int(port[1])} is not a TCP port (1-{MAX_PORT})")
            if port is not None and int(port[1]) == MAX_PORT:
                raise ValueError(f"kv_events endpoint {endpoint!r}: port {int(port[1])} leaves no port + 1 for "
                                 "replay; give it as {endpoint: ..., replay: ...}")
        return entries

    @field_validator("api_key_env")
    @classmethod
    def _not_a_gateway_variable(cls, name: str | None) -> str | None:
        # The key is sent upstream as a bearer token: naming KVGATE_SALT_SECRET (or any setting) would leak it.
        if name is not None and name.upper().startswith(GATEWAY_ENV_PREFIX):
            raise ValueError(f"{name!r} is a gateway setting; name a variable that holds only the upstream's key")
        if name is not None and not ENV_NAME.match(name):
            raise ValueError("must be an environment variable name (letters, digits, '_', not starting with a digit)")
        return name


class GatewayConfig(Strict):
    pools: dict[str, PoolConfig] = Field(min_length=1)
    default_pool: str
    public_paths: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, gt=0, strict=True)
    # An answer the gateway must hold whole (not streamed to the client as it comes): bounded like a request body.
    max_answer_bytes: int = Field(default=64 * 1024 * 1024, gt=0, strict=True)

    @field_validator("public_paths")
    @classmethod
    def _only_local_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if path not in PUBLIC_CAPABLE_PATHS:
                raise ValueError(f"{path!r} cannot be public; only {sorted(PUBLIC_CAPABLE_PATHS)} can")
        return paths

    @model_validator(mode="after")
    def _default_pool_exists(self) -> GatewayConfig:
        if self.default_pool not in self.pools:
            raise ValueError(f"default_pool {self.default_pool!r} is not one of the pools")
        return self


class KeyEntry(Strict):
    sha256: str
    scopes: list[Scope] = Field(min_length=1)

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if not SHA256_HEX.match(value):
            raise ValueError("must be 64 lowercase hex characters (the output of `kvgate keys hash`)")
        return value


class CachePolicy(Strict):
    isolation: Literal["tenant", "user", "none"] = "tenant"
    salt_epoch: int = Field(default=1, ge=0, le=MAX_SALT_EPOCH, strict=True)
    client_salt: Literal["reject", "replace"] = "reject"


class AdmissionPolicy(Strict):
    """`offload.admission`: `all` (default), `returning`, or an object with the mode and its knobs."""

    mode: Literal["all", "returning"] = "all"
    window_s: float = Field(default=3600.0, gt=0, le=30 * 86400, strict=True)
    min_seen: int = Field(default=1, ge=1, le=254, strict=True)  # counters saturate at 255 (sum of two generations)
    prefix_chunks: int = Field(default=4, ge=1, le=64, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _mode_shorthand(cls, value: object) -> object:
        return {"mode": value} if isinstance(value, str) else value


class OffloadPolicy(Strict):
    max_load_tokens: int | None = Field(default=None, ge=0, strict=True)
    max_offload_tokens: int | None = Field(default=None, ge=0, strict=True)
    retention_seconds: float | None = Field(default=None, gt=0, strict=True)
    allowed_media: list[Medium] = Field(default_factory=lambda: list(DEFAULT_MEDIA))
    admission: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    miss_path: Literal["retry", "off"] = "off"  # retry a pre-first-byte failure with recompute, then else_pool


class RolloutPolicy(Strict):
    pool: str | None = None
    percent: float = Field(default=100.0, ge=0, le=100, strict=True)
    else_pool: str | None = None
    sticky: Literal["user", "request"] = "user"
    user_header: str | None = None

    @model_validator(mode="after")
    def _else_pool_when_split(self) -> RolloutPolicy:
        if self.percent < 100 and self.else_pool is None:
            raise ValueError("else_pool is required when percent is below 100")
        return self


class ShadowPolicy(Strict):
    pool: str | None = None
    sample: float = Field(default=0.0, ge=0, le=1, strict=True)
    max_in_flight: int = Field(default=4, ge=0, strict=True)

    @model_validator(mode="after")
    def _pool_when_sampling(self) -> ShadowPolicy:
        if self.sample > 0 and self.pool is None:
            raise ValueError("pool is required when sample is above 0")
        return self


class TenantLimits(Strict):
    """Admission limits of one tenant (gateway/limits/); null means no limit of that kind."""

    max_in_flight: int | None = Field(default=None, ge=1, strict=True)  # requests open at once, per replica
    requests_per_minute: int | None = Field(default=None, ge=1, strict=True)  # shared through Redis if set
class EngineFieldsPolicy(Strict):
    """Body fields that steer vLLM rather than the generated text (gateway/strict/request_fields.py)."""

    steering: Literal["drop", "reject"] = "drop"  # priority, session_id, request_id, data_parallel_rank, vllm_xargs
    responses_store: bool = False  # allow previous_response_id, store and background on /v1/responses


class TenantPolicy(Strict):
    tenant: str
    keys: list[KeyEntry] = Field(default_factory=list)
    cache: CachePolicy = Field(default_factory=CachePolicy)
    offload: OffloadPolicy = Field(default_factory=OffloadPolicy)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    shadow: ShadowPolicy = Field(default_factory=ShadowPolicy)
    limits: TenantLimits = Field(default_factory=TenantLimits)
    engine_fields: EngineFieldsPolicy = Field(default_factory=EngineFieldsPolicy)
    measure_ttft: bool = False

    @field_validator("tenant")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if name == RESERVED_TENANT:
            raise ValueError(f"{RESERVED_TENANT!r} is reserved for blocks that match no tenant")
        if not TENANT_NAME.match(name):
            raise ValueError("must be lowercase letters, digits, '-' or '_' (at most 63), starting alphanumeric")
        return name

    def referenced_pools(self) -> list[tuple[str, str]]:
        """(field, pool) pairs this tenant names, for cross-checking against gateway.yaml."""
        named = [("rollout.pool", self.rollout.pool), ("rollout.else_pool", self.rollout.else_pool)]
        named.append(("shadow.pool", self.shadow.pool))
        return [(field, pool) for field, pool in named if pool is not None]
