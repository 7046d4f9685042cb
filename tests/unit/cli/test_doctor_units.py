"""`kvgate doctor` per upstream (gateway.cli.doctor.examine) against a real HTTP server on loopback that answers
/version, /metrics and /server_info as each case says: every way the version, the offload tier and the
failure policy are read, or said to be unknown, and the advice that follows."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.doctor import examine
from gateway.cli.main import main
from gateway.policy.model import PoolConfig
from tests.harness import PolicyDir
from tests.unit.loopback import serving_in_thread

Routes = dict[str, tuple[int, str]]
INFO = ('# TYPE vllm:cache_config_info gauge\n'
        'vllm:cache_config_info{{block_size="16",kv_offloading_size="{size}"}} 1.0\n')
OFFLOAD_FAMILY = "# TYPE vllm:kv_offload_load_bytes counter\nvllm:kv_offload_load_bytes_total 0.0\n"
POLICY_LABEL = '# TYPE vllm:transfer_info gauge\nvllm:transfer_info{kv_load_failure_policy="recompute"} 1.0\n'


@pytest.fixture
def upstream() -> Iterator[tuple[str, Routes]]:
    routes: Routes = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = routes.get(self.path, (404, "not found"))
            data = body.encode()
            self.send_response(status)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    with serving_in_thread(Handler) as url:
        yield url, routes


def _examine(url: str, routes: Routes, answers: Routes, log: Path | None = None, **pool: Any) -> Any:
    routes.clear()
    routes.update(answers)
    with httpx.Client(timeout=5.0) as client:
        return examine(client, "main", PoolConfig(upstreams=[url], **pool), url, log)


@pytest.mark.parametrize(("version_body", "version", "max_load", "recompute"), [
    ('{"version": "0.25.0"}', "0.25.0", "ignored", "salt (auto: this version ignores max_load_tokens)"),
    ('{"version": "0.32.0"}', "0.32.0", "honoured", "max_load_tokens (auto: this version reads it)"),
    ('{"version": "v0.33.1rc1"}', "v0.33.1rc1", "honoured", "max_load_tokens (auto: this version reads it)"),
    ('{"version": 32}', None, "unknown", "salt (auto: version unknown)"),  # not a string: unknown
    ("not json", None, "unknown", "salt (auto: version unknown)"),
    ("[1]", None, "unknown", "salt (auto: version unknown)"),
])
def test_the_version_decides_the_miss_path(upstream: tuple[str, Routes], version_body: str, version: str | None,
                                           max_load: str, recompute: str) -> None:
    url, routes = upstream
    report = _examine(url, routes, {"/version": (200, version_body), "/metrics": (200, "")})
    assert (report.version, report.max_load_tokens, report.miss_path_recompute) == (version, max_load, recompute)
    assert report.reachable


@pytest.mark.parametrize(("setting", "recompute"), [("salt", "salt (pool setting)"),
                                                     ("max_load_tokens", "max_load_tokens (pool setting)")])
def test_a_pool_setting_overrides_the_version(upstream: tuple[str, Routes], setting: str, recompute: str) -> None:
    url, routes = upstream
    report = _examine(url, routes, {"/version": (200, '{"version": "0.25.0"}')}, recompute=setting)
    assert report.miss_path_recompute == recompute


@pytest.mark.parametrize(("metrics", "tier"), [
    (None, "unknown"),
    ("", "no"),
    (OFFLOAD_FAMILY, "yes (vllm:kv_offload_* families)"),
    (INFO.format(size="12.0"), "yes (kv_offloading_size 12.0 GiB)"),
    (INFO.format(size="None"), "no"),
])
def test_the_offload_tier(upstream: tuple[str, Routes], metrics: str | None, tier: str) -> None:
    url, routes = upstream
    answers: Routes = {"/version": (200, '{"version": "0.32.0"}')}
    if metrics is not None:
        answers["/metrics"] = (200, metrics)
    assert _examine(url, routes, answers).offload_tier == tier


SERVER_INFO = "/server_info?config_format=json"


@pytest.mark.parametrize(("answers", "log", "policy"), [
    ({"/metrics": (200, POLICY_LABEL)}, None, "recompute (/metrics vllm:transfer_info)"),
    ({SERVER_INFO: (200, '{"kv_transfer_config": {"kv_load_failure_policy": "fail"}}')}, None,
     "fail (/server_info, dev mode)"),
    ({SERVER_INFO: (200, '{"kv_transfer_config": null}')}, None, "none (/server_info: no KV connector)"),
    ({SERVER_INFO: (200, '{"other": 1}')}, "kv_load_failure_policy='recompute', x", "recompute (server log)"),
    ({}, "engine config: kv_load_failure_policy: fail", "fail (server log)"),
    ({}, "nothing about it", "unknown (not in the server log)"),
    ({}, None, "unknown (not in /metrics; /server_info needs VLLM_SERVER_DEV_MODE=1; or pass --server-log)"),
])
def test_where_the_failure_policy_is_read(upstream: tuple[str, Routes], tmp_path: Path, answers: Routes,
                                          log: str | None, policy: str) -> None:
    url, routes = upstream
    path = None
    if log is not None:
        path = tmp_path / "server.log"
        path.write_text(log)
    report = _examine(url, routes, {"/version": (200, '{"version": "0.32.0"}'), **answers}, path)
    assert report.kv_load_failure_policy == policy


def test_an_unreadable_log_is_said(upstream: tuple[str, Routes], tmp_path: Path) -> None:
    url, routes = upstream
    report = _examine(url, routes, {"/version": (200, '{"version": "0.32.0"}')}, tmp_path / "absent.log")
    assert report.kv_load_failure_policy.startswith("unknown (cannot read ")
    assert "No such file or directory" in report.kv_load_failure_policy


@pytest.mark.parametrize(("answers", "advice"), [
    ({"/version": (200, '{"version": "0.32.0"}'), "/metrics": (200, OFFLOAD_FAMILY)},
     ['start vLLM with "kv_load_failure_policy": "recompute" at the top level of --kv-transfer-config, and/or '
      "give its tenants offload.miss_path: retry"]),
    ({"/version": (200, '{"version": "0.32.0"}'), "/metrics": (200, OFFLOAD_FAMILY + POLICY_LABEL)}, []),
    ({"/version": (200, '{"version": "0.25.0"}'), "/metrics": (200, "")},
     ["max_load_tokens caps are not enforced by this server; the miss path uses a one-time salt"]),
    ({"/version": (503, "")}, ["unreachable: nothing could be checked"]),
])
def test_advice(upstream: tuple[str, Routes], answers: Routes, advice: list[str]) -> None:
    url, routes = upstream
    assert _examine(url, routes, answers).advice == advice


def test_an_upstream_that_answers_only_metrics_is_reachable(upstream: tuple[str, Routes]) -> None:
    url, routes = upstream
    report = _examine(url, routes, {"/metrics": (200, "")})
    assert report.reachable and report.version is None and report.max_load_tokens == "unknown"


def test_doctor_exit_status_and_table(upstream: tuple[str, Routes], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, routes = upstream
    routes.update({"/version": (200, '{"version": "0.32.0"}'), "/metrics": (200, "")})
    policy = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [url]}})
    policy.add_tenant("acme", offload={"admission": "returning", "miss_path": "retry"})
    directory = policy.write()
    assert main(["doctor", "--policies", str(directory), "--server-log", "no-equals-sign"]) == 0
    out = capsys.readouterr().out
    assert "0.32.0" in out and "honoured" in out
    assert any(line.split()[:4] == ["acme", "returning", "retry", "-"] for line in out.splitlines())
    routes.clear()
    assert main(["doctor", "--policies", str(directory), "--format", "json"]) == 1  # nothing answers now
    assert '"reachable": false' in capsys.readouterr().out
    assert main(["doctor", "--policies", str(tmp_path / "absent")]) == 1
    assert "not a directory" in capsys.readouterr().err
