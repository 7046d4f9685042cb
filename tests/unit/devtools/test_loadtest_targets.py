"""What the load-test runner talks to and writes (gateway.devtools.loadtest.policies, .targets, .progress,
.procmem): a policy directory the real loader accepts and whose rollout sends each chosen user to its arm, the
access file, PID sources, restart hooks through a real shell, health polling over a real socket, the progress
display and /proc readings of real processes."""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gateway.devtools.loadtest.model import Scenario
from gateway.devtools.loadtest.policies import arm_users, merged, tenant_policy, write_policy_dir
from gateway.devtools.loadtest.procmem import mem_available_bytes, tree_rss_bytes
from gateway.devtools.loadtest.progress import BAR_WIDTH, Progress
from gateway.devtools.loadtest.targets import (
    Access,
    CommandRestart,
    FixedPid,
    PidFile,
    TenantAccess,
    Upstream,
    wait_healthy,
)
from gateway.keys import hash_key
from gateway.policy.loader import load_policy_set
from gateway.proxy.rollout import choose_pool
from tests.unit.loopback import serving_in_thread

SCENARIO = Scenario.model_validate({
    "name": "t", "tenants": [{"name": "acme"}, {"name": "beta", "policy": {"cache": {"isolation": "user"}}}],
    "arms": {"offload": {"pool": "tiered"}, "control": {"pool": "plain"}}})


def _draw(key: str) -> float:
    """The rollout draw as docs/ describe it: the first 8 bytes of sha256(key), big-endian, scaled to [0, 100)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") * 100.0 / 2**64


@pytest.mark.parametrize(("base", "override", "result"), [
    ({}, {}, {}),
    ({"a": 1}, {"a": 2}, {"a": 2}),
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}),
    ({"a": {"b": 1}}, {"a": 5}, {"a": 5}),  # a scalar replaces a mapping
    ({"a": 5}, {"a": {"b": 1}}, {"a": {"b": 1}}),
    ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": None}}}, {"a": {"b": {"c": 1, "d": None}}}),
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),  # lists are replaced, not merged
])
def test_merged_overrides_mapping_by_mapping(base: dict[str, Any], override: dict[str, Any],
                                             result: dict[str, Any]) -> None:
    assert merged(base, override) == result
    assert base == merged(base, {})  # the base is not changed


def test_a_tenant_policy_is_a_fifty_fifty_sticky_split_without_shadow() -> None:
    policy = tenant_policy(SCENARIO, "acme", {"offload": {"retention_seconds": 60}})
    assert policy["rollout"] == {"pool": "tiered", "percent": 50, "else_pool": "plain", "sticky": "user"}
    assert policy["shadow"] == {"sample": 0.0}
    assert policy["offload"]["retention_seconds"] == 60 and policy["offload"]["allowed_media"] == ["GPU", "CPU"]


def test_arm_users_are_the_first_users_each_arm_draws() -> None:
    users = arm_users(SCENARIO, tenant_policy(SCENARIO, "acme", {}))
    for arm, expected_inside in (("offload", True), ("control", False)):
        index = int(users[arm].removeprefix("acme-user"))
        assert (_draw(f"user:acme:{users[arm]}") < 50) is expected_inside
        earlier = [_draw(f"user:acme:acme-user{i}") < 50 for i in range(index)]
        assert expected_inside not in earlier  # no earlier candidate went to this arm


def test_a_rollout_that_never_reaches_an_arm_is_refused() -> None:
    policy = tenant_policy(SCENARIO, "acme", {"rollout": {"percent": 100}})
    with pytest.raises(ValueError, match=r"tenant acme: its rollout never sends a user to \['control'\]"):
        arm_users(SCENARIO, policy)


def test_the_policy_directory_loads_and_routes_each_user_to_its_arm(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    upstreams = {"offload": "http://127.0.0.1:9001", "control": "http://127.0.0.1:9002"}
    access = write_policy_dir(tmp_path, SCENARIO, upstreams, {"offload": ["tcp://127.0.0.1:5557"]},
                              api_key_env={"control": "CONTROL_KEY"})
    monkeypatch.setenv("CONTROL_KEY", "x")  # the loader resolves pool keys at load
    policies = load_policy_set(tmp_path)
    assert policies.gateway.pools["tiered"].kv_events and not policies.gateway.pools["plain"].kv_events
    assert policies.gateway.pools["plain"].api_key_env == "CONTROL_KEY"
    assert set(policies.tenants) == {"acme", "beta"}
    for tenant, entry in access.tenants.items():
        for arm, user in entry.users.items():
            pool = choose_pool(policies, policies.tenants[tenant], user, "request-1")
            assert pool == SCENARIO.pool(arm), (tenant, arm, user)
    acme = policies.tenants["acme"]
    assert {key.sha256 for key in acme.keys} == {hash_key(access.tenants["acme"].key), hash_key(access.admin_key)}
    assert {key.sha256 for key in policies.tenants["beta"].keys} == {hash_key(access.tenants["beta"].key)}
    assert policies.tenants["beta"].cache.isolation == "user"


# -- the access file and PID sources --------------------------------------------------------------------------


def test_the_access_file_round_trips_and_is_private(tmp_path: Path) -> None:
    access = Access("admin-ü", {"acme": TenantAccess("k1", {"offload": "u3", "control": "u0"})})
    path = tmp_path / "deep" / "keys.json"
    access.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Access.load(path) == access
    Access("other", {}).save(path)  # rewritten in place, still private
    assert Access.load(path) == Access("other", {}) and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_access_values_are_read_as_strings() -> None:
    data = {"admin_key": 5, "tenants": {"acme": {"key": 7, "users": {"offload": 1}}}}
    assert Access.from_json(data) == Access("5", {"acme": TenantAccess("7", {"offload": "1"})})


@pytest.mark.parametrize(("content", "pid"), [
    ("123\n", 123), ("123 456", 123), ("  42\t", 42), ("", None), ("abc", None), ("1.5", None),
])
def test_pid_files(tmp_path: Path, content: str, pid: int | None) -> None:
    path = tmp_path / "pid"
    path.write_text(content)
    assert PidFile(path).pid() == pid


def test_a_missing_pid_file_is_none_and_a_rewritten_one_is_followed(tmp_path: Path) -> None:
    source = PidFile(tmp_path / "pid")
    assert source.pid() is None
    (tmp_path / "pid").write_text("10")
    assert source.pid() == 10
    (tmp_path / "pid").write_text("11")
    assert source.pid() == 11


def test_an_upstream_pid_comes_from_its_source() -> None:
    assert Upstream("offload", None).pid() is None
    assert Upstream("offload", None, FixedPid(77)).pid() == 77


def test_a_restart_command_runs_in_a_real_shell(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    CommandRestart(f"echo restarted > '{marker}'").restart(30.0)
    assert marker.read_text() == "restarted\n"


def test_a_failing_restart_command_says_its_status_and_stderr() -> None:
    with pytest.raises(RuntimeError, match=r"exited 3: boom$"):
        CommandRestart("echo boom >&2; exit 3").restart(30.0)


# -- health polling over a real socket ------------------------------------------------------------------------


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def healthy_url() -> Iterator[str]:
    with serving_in_thread(_Health) as url:
        yield url


def test_a_healthy_server_is_found(healthy_url: str) -> None:
    assert wait_healthy(healthy_url, 30.0) >= 0.0


def test_nothing_listening_times_out_with_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(TimeoutError, match=re.escape(f"{url}/health did not answer 200 within 0 s")):
        wait_healthy(url, 0.0)


# -- progress -------------------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_progress_prints_only_milestones() -> None:
    stream = io.StringIO()
    progress = Progress(3, stream)
    progress.step("a")
    progress.step("b")
    progress.note("phase done")
    progress.close()
    assert re.fullmatch(r"\[ +\d+\.\ds 2/3\] phase done\n", stream.getvalue())


def test_a_terminal_gets_a_bar_that_is_cleared_around_notes() -> None:
    stream = _Terminal()
    progress = Progress(4, stream)
    progress.step("first")
    assert stream.getvalue() == "\r[" + "#" * (BAR_WIDTH // 4) + "." * (BAR_WIDTH - BAR_WIDTH // 4) + "] 1/4 first"
    progress.note("milestone")
    text = stream.getvalue()
    assert re.search(r"1/4 first\r {40,}\r\[", text)  # the bar is blanked out before the note
    assert re.search(r"\] milestone\n\r\[#{7}\.{21}\] 1/4 $", text)


def test_force_plain_and_bounds() -> None:
    stream = _Terminal()
    progress = Progress(0, stream, force_plain=True)
    assert progress.total == 1 and not progress.tty
    for _ in range(3):
        progress.step("x")
    assert progress.done == 1 and stream.getvalue() == ""


def test_a_shorter_bar_line_pads_over_the_longer_one() -> None:
    stream = _Terminal()
    progress = Progress(2, stream)
    progress.step("a long label")
    progress.step("")
    last = stream.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("[" + "#" * BAR_WIDTH + "] 2/2 ")
    assert len(last) == len("[" + "#" * 14 + "." * 14 + "] 1/2 a long label")


# -- /proc ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_tree_rss_counts_a_real_child_and_is_none_for_a_gone_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        child_rss = tree_rss_bytes(child.pid)
        own_tree = tree_rss_bytes(os.getpid())
        assert child_rss is not None and child_rss > 0 and child_rss % 1024 == 0
        assert own_tree is not None and own_tree > child_rss
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    assert tree_rss_bytes(child.pid) is None  # reaped: no /proc entry
    available = mem_available_bytes()
    assert available is not None and available > 0 and available % 1024 == 0
