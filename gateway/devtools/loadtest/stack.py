"""Mode (a): the runner starts the stack itself: one simulated vLLM server per arm (`kvgate sim`, the offload
arm with `--offload`) and the gateway in front of both, on free loopback ports, like `kvgate demo`.
Every process is stopped by its PID when the block exits; the simulators can be restarted in place.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gateway.devtools.loadtest.model import ARMS, Scenario
from gateway.devtools.loadtest.policies import write_policy_dir
from gateway.devtools.loadtest.targets import Targets, Upstream
from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, wait_until_ready

UPSTREAM_KEY_ENV = {"offload": "VLLM_LOADTEST_OFFLOAD_KEY", "control": "VLLM_LOADTEST_CONTROL_KEY"}
READY_TIMEOUT_S = 60.0


@dataclass
class OwnedServer:
    """A child process serving HTTP on 127.0.0.1:`port`, which this runner may stop and start again."""

    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health"
    current: ServerProcess | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})
        self.current = ServerProcess(popen=popen, port=self.port, log_path=self.log_path)
        self.starts += 1
        try:
            wait_until_ready(popen, f"{self.url}{self.ready_path}", self.log_path, READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None

    def pid(self) -> int | None:
        return self.current.popen.pid if self.current is not None else None

    def restart(self, timeout_s: float) -> None:
        self.stop()
        self.start()


def sim_argv(scenario: Scenario, arm: str, port: int, events_port: int, api_key: str) -> list[str]:
    argv = kvgate_command(
        "sim", "--port", str(port), "--model", scenario.model, f"--api-key={api_key}",
        "--gpu-blocks", str(scenario.sim.gpu_blocks), "--seed", "0",
        "--kv-events-endpoint", f"tcp://*:{events_port}",
        "--kv-events-replay-endpoint", f"tcp://*:{events_port + 1}",
    )
    if arm == "offload":
        argv += ["--offload", "--cpu-bytes-to-use", str(scenario.sim.cpu_bytes_to_use)]
    return [*argv, *scenario.sim.args]


@contextmanager
def self_started_stack(scenario: Scenario, workdir: Path) -> Iterator[Targets]:
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_keys = {arm: secrets.token_urlsafe(16) for arm in ARMS}
    ports = {arm: (free_port(), free_port_pair()) for arm in ARMS}
    sims = {arm: OwnedServer(sim_argv(scenario, arm, port, events, upstream_keys[arm]), port,
                             workdir / f"sim-{arm}.log") for arm, (port, events) in ports.items()}
    with ExitStack() as cleanup:
        for server in sims.values():
            cleanup.callback(server.stop)
            server.start()
        access = write_policy_dir(
            workdir / "policies", scenario, {arm: sims[arm].url for arm in ARMS},
            {arm: [f"tcp://127.0.0.1:{events}"] for arm, (_, events) in ports.items()}, UPSTREAM_KEY_ENV)
        gateway = _gateway(workdir, {UPSTREAM_KEY_ENV[arm]: key for arm, key in upstream_keys.items()})
        cleanup.callback(gateway.stop)
        gateway.start()
        upstreams = {arm: Upstream(arm, server.url, server, server, upstream_keys[arm]) for arm, server in sims.items()}
        yield Targets(gateway.url, access, upstreams, mode="self-started (kvgate sim + kvgate serve)")


def _gateway(workdir: Path, upstream_env: dict[str, str]) -> OwnedServer:
    port = free_port()
    env = {**upstream_env, "KVGATE_SALT_SECRET": secrets.token_hex(32),
           "KVGATE_STATE_PATH": str(workdir / "ledger.sqlite3"), "KVGATE_LOG_FORMAT": "json"}
    argv = kvgate_command("serve", "--policies", str(workdir / "policies"), "--port", str(port))
    return OwnedServer(argv, port, workdir / "gateway.log", env, ready_path="/livez")
