"""The plan's two entry points: `kvgate plan` (gateway.plan.cli, run in-process on a real SQLite trace store
and a captured vLLM `/metrics`) and the query parsing of `GET /admin/plan` (gateway.plan.admin), each refusal
a 4xx naming its parameter."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from gateway.cli.main import main
from gateway.errors import BadRequest, GatewayError, NotFound
from gateway.plan.admin import plan_view
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.proxy.smallcalls import SmallCalls
from gateway.reuse.record import TraceRecord
from gateway.reuse.store import trace_store_for
from tests.harness import PolicyDir
from tests.unit.plan.traces import blocks, rec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
H200_METRICS = FIXTURES / "vllm-0.25.0" / "metrics" / "offload_metrics_after.txt"
QWEN3 = FIXTURES / "models" / "qwen3-8b-config.json"


def _store(state: Path, records: list[TraceRecord]) -> None:
    async def write() -> None:
        async with trace_store_for(None, state) as store:
            await store.write(records)

    asyncio.run(write())


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite state file holding a small trace: a document sent 4 times by acme, 2 one-offs by beta."""
    path = tmp_path / "state.sqlite3"
    doc = blocks("doc", 64)
    trace = [rec(doc, ts=1000.0 + 60 * i, cached=16 * i) for i in range(4)]
    trace += [rec(blocks(f"upload{i}", 8), ts=1100.0 + i, tenant="beta") for i in range(2)]
    _store(path, trace)
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    monkeypatch.setenv("KVGATE_STATE_PATH", str(path))
    return path


def _json_plan(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    assert main(["plan", "--format", "json", *flags]) == 0
    plan: dict[str, object] = json.loads(capsys.readouterr().out)
    return plan


def test_the_plan_reads_the_store_and_the_captured_metrics(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_plan(capsys, "--metrics", str(H200_METRICS))
    assert plan["pool"] == "main"
    trace = plan["trace"]
    assert isinstance(trace, dict) and trace["records"] == 6 and trace["tenants"] == ["acme", "beta"]
    kv = plan["kv"]
    assert isinstance(kv, dict)
    assert kv["gpu_kv_cache_tokens"] == 20336 and kv["block_size"] == 16
    assert kv["bytes_per_token"] == pytest.approx(3e9 / 20336)


def test_tenant_and_since_select_records(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_plan(capsys, "--gpu-kv-tokens", "4096", "--block-size", "16", "--tenant", "acme",
                      "--since", "1970-01-01T00:17:30Z")  # 1050 s: the last three acme requests
    assert plan["tenant"] == "acme" and plan["since"] == 1050.0
    trace = plan["trace"]
    assert isinstance(trace, dict) and trace["records"] == 3 and trace["tenants"] == ["acme"]


def test_flags_reach_the_inputs(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_plan(capsys, "--gpu-kv-tokens", "4096", "--block-size", "16", "--model-config", str(QWEN3),
                      "--tensor-parallel", "2", "--host-ram", "1000000000", "--weights-bytes", "100",
                      "--headroom", "200", "--cache-process-rss", "300", "--cpu-bytes", "5000000",
                      "--cpu-bytes", "9000000", "--window", "1m,2h", "--prefill-tokens-per-s", "1000")
    kv, budgets = plan["kv"], plan["budgets"]
    assert isinstance(kv, dict) and isinstance(budgets, dict)
    assert kv["model_bytes_per_token"] == 147456 / 2 and kv["bytes_per_token_all_ranks"] == 147456
    assert budgets["left_for_tier_bytes"] == 1_000_000_000 - 600 and budgets["unknown"] == []
    assert [w["window_s"] for w in plan["working_set"]] == [60.0, 7200.0]  # type: ignore[attr-defined]
    assert [p["label"] for p in plan["evaluated"]] == ["5000000 bytes", "9000000 bytes"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("flags", "message"), [
    (["--window", "10q"], "window '10q': use a number and one of s, m, h, d"),
    (["--window", "nanm"], "window 'nanm' must be positive"),
    (["--metrics", "{fixtures}/vllm-0.25.0/http/health.txt"], "no such file"),
    (["--model-config", "{tmp}/absent.json"], "cannot read"),
])
def test_bad_inputs_exit_1_with_one_line(state: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                         message: str) -> None:
    resolved = [flag.format(fixtures=FIXTURES, tmp=state.parent) for flag in flags]
    assert main(["plan", *resolved]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvgate plan: ") and message.lower() in err.lower()


def test_metrics_without_the_cache_family_are_refused(state: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.txt"
    metrics.write_text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
    assert main(["plan", "--metrics", str(metrics)]) == 1
    assert f"kvgate plan: {metrics}: no vllm:cache_config_info in it" in capsys.readouterr().err


def test_no_store_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    monkeypatch.setenv("KVGATE_STATE_PATH", str(tmp_path / "absent.sqlite3"))
    assert main(["plan"]) == 1
    assert "no trace store at" in capsys.readouterr().err
    assert not (tmp_path / "absent.sqlite3").exists()  # a plan never creates a store


@pytest.mark.parametrize(("fmt", "first_line"), [
    ("table", "kvgate plan — pool main, all tenants"),
    ("md", "### kvgate plan — pool main, all tenants"),
])
def test_text_formats(state: Path, capsys: pytest.CaptureFixture[str], fmt: str, first_line: str) -> None:
    assert main(["plan", "--format", fmt, "--gpu-kv-tokens", "4096", "--block-size", "16"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == first_line


def test_the_plot_flag_writes_a_png(state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "curve.png"
    assert main(["plan", "--metrics", str(H200_METRICS), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--link-gbps", "0", "'0' must be a positive number"),  # was a ZeroDivisionError traceback
    ("--link-gbps", "-1", "'-1' must be a positive number"),
    ("--link-gbps", "nan", "'nan' must be a positive number"),
    ("--link-gbps", "inf", "'inf' must be a positive number"),
    ("--prefill-tokens-per-s", "-5", "'-5' must be a positive number"),
    ("--tensor-parallel", "0", "'0' must be positive"),  # was a ZeroDivisionError traceback
    ("--offload-block-tokens", "0", "'0' must be positive"),  # was a ZeroDivisionError traceback
    ("--block-size", "-16", "'-16' must be positive"),
    ("--gpu-kv-tokens", "1.5", "'1.5' is not a whole number"),
    ("--host-ram", "-5", "'-5' must not be negative"),
    ("--cpu-bytes", "12GB", "'12GB' is not a whole number of bytes"),
])
def test_numbers_that_mean_nothing_are_usage_errors(state: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                     value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_zero_bytes_of_weights_in_host_ram_is_a_real_figure(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_plan(capsys, "--gpu-kv-tokens", "4096", "--block-size", "16", "--weights-bytes", "0")
    budgets = plan["budgets"]
    assert isinstance(budgets, dict) and budgets["weights_in_host_ram_bytes"] == 0
    assert "weights_in_host_ram" not in budgets["unknown"]


def test_an_unknown_format_is_an_argparse_error(state: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--format", "xml"])
    assert exited.value.code == 2


# -- GET /admin/plan ------------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def policies(tmp_path: Path) -> PolicySet:
    directory = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [f"http://127.0.0.1:{_closed_port()}"]}})
    directory.add_tenant("acme")
    return load_policy_set(directory.write())


def _refusal(policies: PolicySet, query: str) -> GatewayError:
    async def ask() -> None:
        async with aiohttp.ClientSession() as session:
            await plan_view(None, policies, SmallCalls.using(session), query.encode())

    with pytest.raises(GatewayError) as raised:
        asyncio.run(ask())
    return raised.value


@pytest.mark.parametrize(("query", "kind", "param"), [
    ("tenant=nobody", NotFound, "tenant"),
    ("pool=elsewhere", NotFound, "pool"),
    ("since=yesterday", BadRequest, "since"),
    ("window=10q", BadRequest, "window"),
    ("window=nanh", BadRequest, "window"),
    ("window=10m,0h", BadRequest, "window"),
    ("host_ram=-5", BadRequest, "host_ram"),
    ("host_ram=1e9", BadRequest, "host_ram"),
    ("headroom=%C2%B2", BadRequest, "headroom"),  # "²" is a digit to str.isdigit, not to int(): was a 500
    ("host_ram=%D9%A3", BadRequest, "host_ram"),  # an Arabic-Indic 3: int() reads it, but bytes are ASCII
    ("cache_process_rss=1.5", BadRequest, "cache_process_rss"),
    ("current_cpu_bytes=x", BadRequest, "current_cpu_bytes"),
    ("cpu_bytes=1&cpu_bytes=two", BadRequest, "cpu_bytes"),
    ("link_gbps=0", BadRequest, "link_gbps"),
    ("link_gbps=-1", BadRequest, "link_gbps"),
    ("link_gbps=inf", BadRequest, "link_gbps"),
    ("link_gbps=nan", BadRequest, "link_gbps"),
    ("prefill_tokens_per_s=fast", BadRequest, "prefill_tokens_per_s"),
    ("server_ignores_max_load=yes", BadRequest, "server_ignores_max_load"),
])
def test_admin_plan_refuses_each_bad_parameter_by_name(policies: PolicySet, query: str, kind: type[GatewayError],
                                                        param: str) -> None:
    error = _refusal(policies, query)
    assert type(error) is kind and error.param == param


@pytest.mark.parametrize("query", [
    "", "tenant=acme&pool=main", "since=2026-12-01T12:00:00Z&window=90s,2d", "host_ram=1000&cpu_bytes=5",
    "link_gbps=25.5&prefill_tokens_per_s=8000&server_ignores_max_load=true",
    "&".join(f"cpu_bytes={n}" for n in range(40)),  # more than 16 sizes: the rest are ignored, not refused
    "weights_bytes=&headroom=",  # blank values are absent (parse_qs), so the figures stay unknown
])
def test_admin_plan_accepts_good_queries_and_then_says_the_trace_is_off(policies: PolicySet, query: str) -> None:
    error = _refusal(policies, query)
    assert type(error) is NotFound and "KVGATE_REUSE_TRACE=false" in error.message
