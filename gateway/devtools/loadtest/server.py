"""The `server:` block of a scenario: how the real vLLM servers behind each arm are configured.

The runner itself never reads it (it talks to whatever servers it is given); `scripts/gpu/host.sh` does, through
`scripts/gpu/runplan.py`, to decide before each scenario whether an arm's server must be restarted with other
settings, or only have its caches emptied, and which runner sends the traffic. Other runners' scenario files carry
the same block (their loaders ignore it). Kept apart from `model.py` so the GPU host's needs stay in one place.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Connector = Literal["offloading", "lmcache", "none"]
DEFAULT_CPU_BYTES = 12_000_000_000
"""The CPU tier of the 2026-11-29 H200 runs (12 GB)."""
DEFAULT_CONNECTOR: dict[str, Connector] = {"offload": "offloading", "control": "none"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArmServer(_Strict):
    connector: Connector | None = None
    """None: the arm's default (offload: the OffloadingConnector; control: no connector)."""
    cpu_bytes_to_use: int | None = Field(default=None, gt=0)
    """The CPU tier's size in bytes (offloading and lmcache connectors); None: 12 GB."""


class RunnerCommands(_Strict):
    """Shell commands for a runner host.sh does not know by name; they see the variables host.sh exports for a run
    (SCENARIO, POLICIES, REPORT, GATEWAY, OFFLOAD_URL, CONTROL_URL, OFFLOAD_EVENTS, CONTROL_EVENTS, RESTART_OFFLOAD,
    RESTART_CONTROL, RESET_OFFLOAD, RESET_CONTROL, ENSURE_OFFLOAD, OFFLOAD_PIDFILE, CONTROL_PIDFILE, PY, KVG)."""

    write_policies: str = Field(min_length=1)
    """Writes the policy directory $POLICIES, with the plain keys the run needs in $POLICIES/keys.json."""
    run: str = Field(min_length=1)
    """Sends the traffic through $GATEWAY and writes its report under $REPORT."""


class ServerSpec(_Strict):
    runner: Literal["loadtest", "hotscan"] | RunnerCommands = "loadtest"
    """What drives the traffic: `loadtest` (this package's offload A/B runner), `hotscan` (the admission A/B on
    the hot-plus-scan workload, `python -m loadtests.hotscan`), or explicit commands."""
    cpu_bytes_to_use: int | list[int] | None = None
    """Shorthand for the offload arm's tier size. A list runs the scenario once per value, in order (the
    offload server is restarted in between): one workload at several tier sizes."""
    offload: ArmServer = Field(default_factory=ArmServer)
    control: ArmServer = Field(default_factory=ArmServer)
    fresh: Literal["reset", "restart", "keep"] = "reset"
    """Before the scenario, for a server that keeps its settings: `reset` empties its GPU prefix cache and its
    connector's tier (vLLM's POST /reset_prefix_cache?reset_external=true, dev mode), `restart` restarts it,
    `keep` leaves what the previous scenario stored. A server whose settings change is always restarted."""

    @model_validator(mode="after")
    def _one_way_to_size(self) -> ServerSpec:
        if self.cpu_bytes_to_use is not None and self.offload.cpu_bytes_to_use is not None:
            raise ValueError("give the offload arm's tier size once: cpu_bytes_to_use or offload.cpu_bytes_to_use")
        sizes = self.cpu_bytes_to_use if isinstance(self.cpu_bytes_to_use, list) else []
        if isinstance(self.cpu_bytes_to_use, list) and not sizes:
            raise ValueError("cpu_bytes_to_use: an empty list")
        if any(size <= 0 for size in sizes) or (isinstance(self.cpu_bytes_to_use, int) and self.cpu_bytes_to_use <= 0):
            raise ValueError("cpu_bytes_to_use must be positive")
        return self

    def offload_sizes(self) -> list[int | None]:
        """One entry per run of the scenario: the offload arm's tier size (None: its own default)."""
        if isinstance(self.cpu_bytes_to_use, list):
            return list(self.cpu_bytes_to_use)
        return [self.cpu_bytes_to_use if self.cpu_bytes_to_use is not None else self.offload.cpu_bytes_to_use]


def arm_setting(spec: ServerSpec, arm: str, offload_size: int | None) -> str:
    """What one arm's server runs with, as `connector` or `connector:cpu_bytes` (what vllm_server.sh reads)."""
    arm_spec = spec.offload if arm == "offload" else spec.control
    connector = arm_spec.connector or DEFAULT_CONNECTOR[arm]
    if connector == "none":
        return "none"
    size = offload_size if arm == "offload" else arm_spec.cpu_bytes_to_use
    return f"{connector}:{size or DEFAULT_CPU_BYTES}"
