"""Shadow promises the broken-pool test cannot see: a shadow that cannot even connect or be read must not
hold the primary, KVGATE_SHADOW_TIMEOUT_S abandons a shadow and counts it, and outputs are compared only for
deterministic requests. No timing is measured: each check is an event (an answer, a counter, a report)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, sim_process
from tests.gateway.test_shadow import CONTROL_KEY, admin_shadow, shadow_counts, shadow_gateway, wait_counts
from tests.harness import bearer
from tests.procs import ServerProcess, free_port, run_server

DEADLINE_S = 30.0
NEVER_S = "3600"  # connect and shadow timeouts that cannot expire while a test runs


@pytest.fixture(scope="module")
def corrupt_control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sim_process(tmp_path_factory.mktemp("corrupt"), "--corrupt-output", api_key=CONTROL_KEY) as server:
        yield server


def _complete(gateway: ServerProcess, key: str, prompt: str, **extra: object) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 6, **extra}
    return httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=DEADLINE_S)


# -- a shadow pool that never accepts, or never reads ------------------------------------------------------


@pytest.fixture
def unaccepting_listener() -> Iterator[str]:
    """A port whose accept queue is full: a connection attempt to it never completes (its SYNs are dropped)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with socket.create_connection(listener.getsockname()):  # fills the queue of one; never accepted
            yield url


@pytest.fixture
def unread_listener() -> Iterator[str]:
    """A port that completes connections (from the kernel's backlog) but never reads: a sender blocks once the
    small receive buffer and its own send buffer are full."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("mode", ["never_accepts", "never_reads"])
def test_primary_is_answered_while_its_shadow_cannot_connect_or_send(
    sim: ServerProcess, tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    """Wrong version: await the shadow's connect (or its send) before forwarding the primary. With connect and
    shadow timeouts that cannot expire, such a gateway never answers; this one answers every primary while
    every shadow is still in flight (none settled, none dropped)."""
    shadow_url = request.getfixturevalue("unaccepting_listener" if mode == "never_accepts" else "unread_listener")
    env = {"KVGATE_CONNECT_TIMEOUT_S": NEVER_S, "KVGATE_SHADOW_TIMEOUT_S": NEVER_S}
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, shadow_url, max_in_flight=4, env=env)
    # Beyond the kernel's buffers (4 MiB send buffer at most here): a shadow send cannot complete.
    padding = "p" * (6 * 1024 * 1024) if mode == "never_reads" else ""
    with gateway_cm as gateway:
        for index in range(3):
            reply = _complete(gateway, policy.keys["ab"], f"primary {index}", temperature=0, padding=padding)
            assert reply.status_code == 200
            assert reply.json()["choices"][0]["text"]
        assert shadow_counts(gateway, policy) == {}  # three shadows started, none finished or dropped
        assert _complete(gateway, policy.keys["plain"], "no shadow").status_code == 200


# -- KVGATE_SHADOW_TIMEOUT_S -------------------------------------------------------------------------------


@pytest.fixture
def hanging_shadow(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.fault_upstream", "--port", str(port), "--mode", "hang"]
    with run_server(argv, port, tmp_path / "fault.log", ready_path="/health") as server:
        yield server.url


def test_a_shadow_past_its_timeout_is_abandoned_and_counted_as_an_error(
    sim: ServerProcess, hanging_shadow: str, tmp_path: Path
) -> None:
    """Wrong version: no timeout, so hung shadows hold their slots forever and later requests are dropped."""
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, hanging_shadow, max_in_flight=2,
                                           env={"KVGATE_SHADOW_TIMEOUT_S": "1"})
    with gateway_cm as gateway:
        for round_number in (1, 2):
            for index in range(2):
                assert _complete(gateway, policy.keys["ab"], f"r{round_number} {index}").status_code == 200
            assert wait_counts(gateway, policy, 2 * round_number) == {"error": 2.0 * round_number}
        assert "shadow_failed" in gateway.log_text()


def test_primaries_never_wait_for_a_connection_slot_a_shadow_holds(
    sim: ServerProcess, hanging_shadow: str, tmp_path: Path
) -> None:
    """One upstream connection slot, shadows that never end. Wrong version: the shadow shares the relay's client,
    so the first hung shadow takes the only slot and every later primary waits behind it. Here the shadow's
    client has slots of its own: every primary is answered while its shadows hang."""
    env = {"KVGATE_UPSTREAM_CONNECTIONS": "1", "KVGATE_SHADOW_TIMEOUT_S": NEVER_S}
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, hanging_shadow, max_in_flight=4, env=env)
    with gateway_cm as gateway:
        for index in range(3):
            reply = _complete(gateway, policy.keys["ab"], f"primary {index}", temperature=0)
            assert reply.status_code == 200
            assert reply.json()["choices"][0]["text"]
        assert shadow_counts(gateway, policy) == {}  # the shadows are still in flight, none dropped


# -- outputs compared only for deterministic requests -----------------------------------------------------


@pytest.mark.parametrize(
    ("sampling", "compared"),
    [({"temperature": 0.8}, 0), ({}, 0), ({"temperature": 0.8, "seed": 7}, 4), ({"temperature": 0}, 4)],
    ids=["temperature", "default-temperature", "seeded", "greedy"],
)
def test_outputs_are_compared_only_for_deterministic_requests(
    sim: ServerProcess, corrupt_control: ServerProcess, tmp_path: Path, sampling: dict[str, object], compared: int
) -> None:
    """The shadow arm always answers differently (--corrupt-output). Wrong version: compare every pair, which
    reports sampled requests as mismatches."""
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, corrupt_control.url)
    with gateway_cm as gateway:
        for index in range(4):
            assert _complete(gateway, policy.keys["ab"], f"sampled {index}", **sampling).status_code == 200
        assert wait_counts(gateway, policy, 4) == {"compared": 4.0}
        report = admin_shadow(gateway, policy)
        assert report["pairs"] == 4
        assert report["compared_outputs"] == compared
        assert report["mismatches"] == compared
