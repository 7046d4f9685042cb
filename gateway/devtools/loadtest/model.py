"""Scenario files: what traffic the offload A/B protocol sends. Pure data and validation, no I/O but reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.devtools.loadtest.server import ServerSpec
from gateway.policy.model import RESERVED_TENANT, TENANT_NAME

Phase = Literal["cold", "repeat", "pressure", "return", "restart"]
ARMS = ("offload", "control")
"""The two arms of the protocol: the server with the CPU tier, and the same server without it."""
PHASE_ORDER: tuple[Phase, ...] = ("cold", "repeat", "pressure", "return", "restart")
REPEATED_PHASES: tuple[Phase, ...] = ("cold", "repeat", "pressure", "return")


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the problem."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArmSpec(Strict):
    pool: str


def policy_tenant_name(name: str) -> str:
    """A tenant name the policy loader accepts, so a scenario never writes a policy directory it would refuse."""
    if name == RESERVED_TENANT or not TENANT_NAME.match(name):
        raise ValueError(f"{name!r} is not a tenant name a policy accepts (lowercase letters, digits, '-' or '_', "
                         f"at most 63, starting alphanumeric; not {RESERVED_TENANT!r})")
    return name


class TenantSpec(Strict):
    name: str
    policy: dict[str, Any] = Field(default_factory=dict)
    """Merged into the tenant's generated policy file (self-started stacks and --write-policies only)."""

    _policy_name = field_validator("name")(policy_tenant_name)


class PressureSpec(Strict):
    prompts: int | Literal["auto"] = "auto"
    """Other long prompts per repetition and arm; `auto`: enough to overflow the upstream's GPU KV cache
    (from `vllm:cache_config_info`), plus one."""
    tokens: int = Field(default=8000, gt=0)
    min_prompts: int = Field(default=1, ge=1)


class SimSpec(Strict):
    """Simulator settings for a self-started stack (ignored against real upstreams)."""

    gpu_blocks: int = Field(default=1271, gt=0)
    cpu_bytes_to_use: int = Field(default=12_000_000_000, gt=0)
    args: list[str] = Field(default_factory=list)


class Timeouts(Strict):
    request_s: float = Field(default=120.0, gt=0)
    restart_s: float = Field(default=300.0, gt=0)
    ledger_s: float = Field(default=30.0, gt=0)


class Scenario(Strict):
    name: str
    description: str = ""
    model: str = "m"
    arms: dict[str, ArmSpec] = Field(default_factory=lambda: {arm: ArmSpec(pool=arm) for arm in ARMS})
    tenants: list[TenantSpec] = Field(min_length=1)
    prefix_tokens: int = Field(default=8000, gt=1)
    max_tokens: int = Field(default=4, gt=0)
    pressure: PressureSpec = Field(default_factory=PressureSpec)
    repetitions: int = Field(default=3, ge=1)
    warmup_repetitions: int = Field(default=1, ge=0)
    concurrency: int = Field(default=1, ge=1)
    phases: list[Phase] = Field(default_factory=lambda: list(PHASE_ORDER))
    overhead_pairs: int = Field(default=0, ge=0)
    """Fresh prefix-length prompts sent to the control upstream directly and through the gateway, in
    alternating pairs after the protocol: the end-to-end cost of the gateway (0: skipped)."""
    restart_samples: int = Field(default=0, ge=0)
    """Prefixes per tenant sent after the restart (0: one per measured repetition)."""
    seed: int = 1234
    vocab_size: int = Field(default=32000, gt=16)
    sim: SimSpec = Field(default_factory=SimSpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    """Real vLLM server settings per arm, applied by scripts/gpu/host.sh (see server.py); the runner ignores it."""
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @field_validator("arms")
    @classmethod
    def _both_arms(cls, arms: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        if set(arms) != set(ARMS):
            raise ValueError(f"needs exactly the arms {list(ARMS)}, got {sorted(arms)}")
        if arms["offload"].pool == arms["control"].pool:
            raise ValueError("the two arms must use different pools")
        return {arm: arms[arm] for arm in ARMS}

    @field_validator("phases")
    @classmethod
    def _known_order(cls, phases: list[Phase]) -> list[Phase]:
        if len(set(phases)) != len(phases):
            raise ValueError("a phase is listed twice")
        if "return" in phases and "pressure" not in phases:
            raise ValueError("'return' needs 'pressure' before it (nothing would evict the prefix)")
        return [phase for phase in PHASE_ORDER if phase in phases]

    @model_validator(mode="after")
    def _distinct_tenants(self) -> Scenario:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be distinct")
        return self

    @property
    def tenant_names(self) -> list[str]:
        return [tenant.name for tenant in self.tenants]

    def pool(self, arm: str) -> str:
        return self.arms[arm].pool

    def arm_of_pool(self, pool: str) -> str | None:
        return next((arm for arm, spec in self.arms.items() if spec.pool == pool), None)

    def pressure_prompts(self, kv_cache_tokens: int | None) -> int:
        """How many pressure prompts each arm gets per repetition."""
        if isinstance(self.pressure.prompts, int):
            return max(self.pressure.prompts, self.pressure.min_prompts)
        if kv_cache_tokens is None:
            return max(4, self.pressure.min_prompts)
        return max(-(-kv_cache_tokens // self.pressure.tokens) + 1, self.pressure.min_prompts)


def load_scenario(path: Path) -> Scenario:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ScenarioError(f"{path}: cannot read: {error}") from error
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: expected a mapping at the top level")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in item['loc']) or '(top)'}: {item['msg']}"
                             for item in error.errors())
        raise ScenarioError(f"{path}: {problems}") from error
