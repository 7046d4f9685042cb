"""`kvgate` commands run in-process (gateway.cli.main and gateway.cli.audit): exit statuses, what goes to stdout
and stderr, on real policy directories and a real SQLite state file under tmp_path."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import audit as audit_cli
from gateway.cli.main import build_parser, main
from gateway.reuse.store import trace_store_for
from tests.harness import PolicyDir
from tests.unit.plan.traces import blocks, rec


@pytest.fixture(autouse=True)
def _own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command reads this test's own (absent until written) state file, never a shared one."""
    for name in ("KVGATE_REDIS_URL", "KVGATE_POLICIES", "KVGATE_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVGATE_STATE_PATH", str(tmp_path / "state.sqlite3"))


def _policies(tmp_path: Path, **tenant: Any) -> Path:
    directory = PolicyDir(tmp_path / "policies", {"main": {"upstreams": ["http://127.0.0.1:9"]}})
    directory.add_tenant("acme", **tenant)
    directory.add_tenant("beta")
    return directory.write()


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: kvgate") and "COMMAND" in out


def test_every_documented_command_is_registered() -> None:
    parser = build_parser()
    actions = [action for action in parser._actions if action.dest == "==SUPPRESS==" and action.choices]
    commands = set(actions[0].choices or {})
    assert commands == {"serve", "policy", "keys", "sim", "shadow", "audit", "tenant", "ledger", "demo", "loadtest",
                        "canary", "doctor", "plan"}


@pytest.mark.parametrize("argv", [["keys"], ["policy"]])
def test_a_command_group_without_an_action_prints_help_and_exits_2(argv: list[str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().out.startswith("usage: kvgate")


@pytest.mark.parametrize("argv", [["nonsense"], ["audit", "--format", "xml"], ["policy", "check"],
                                  ["ledger", "reset-source", "offload/0"], ["tenant"]])
def test_bad_usage_is_an_argparse_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2


def test_keys_new_prints_a_key_and_the_line_that_hashes_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "acme"]) == 0
    out = capsys.readouterr().out
    key = out.splitlines()[1]
    assert re.fullmatch(r"kvg_[A-Za-z0-9_-]{43}", key)
    expected = hashlib.sha256(key.encode()).hexdigest()
    assert f'  - sha256: "{expected}"\n    scopes: [inference]' in out
    assert "tenants/acme.yaml" in out


@pytest.mark.parametrize(("stdin", "status", "out"), [
    ("kvg_abc\n", 0, hashlib.sha256(b"kvg_abc").hexdigest() + "\n"),
    ("  kvg_ü  \nsecond line\n", 0, hashlib.sha256("kvg_ü".encode()).hexdigest() + "\n"),
    ("\n", 1, ""),
    ("", 1, ""),
])
def test_keys_hash_reads_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: str,
                                  status: int, out: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(["keys", "hash"]) == status
    captured = capsys.readouterr()
    assert captured.out == out
    assert ("no key on stdin" in captured.err) == (status == 1)


def test_policy_check_of_a_good_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(_policies(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"ok: 2 tenants, 1 pools, version \S+\n", out)


def test_policy_check_lists_each_problem_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _policies(tmp_path, cache={"isolation": "nobody"})
    (directory / "tenants" / "beta.yaml").write_text("tenant: beta\nkeys: 5\n")
    assert main(["policy", "check", str(directory)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(str(directory / "tenants" / "acme.yaml")) and "cache.isolation" in line for line in err)
    assert any(line.startswith(str(directory / "tenants" / "beta.yaml")) for line in err)


def test_policy_check_of_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(tmp_path / "absent")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_policy_check_warns_of_an_unset_pool_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    directory = PolicyDir(tmp_path / "p", {"main": {"upstreams": ["http://127.0.0.1:9"], "api_key_env": "UNSET_K"}})
    directory.add_tenant("acme")
    monkeypatch.delenv("UNSET_K", raising=False)
    assert main(["policy", "check", str(directory.write())]) == 0
    assert "warning: pools.main.api_key_env: $UNSET_K is not set here" in capsys.readouterr().err


# -- tenant forget --------------------------------------------------------------------------------------------


def _write_trace(state: Path) -> None:
    async def write() -> None:
        async with trace_store_for(None, state) as store:
            await store.write([rec(blocks("d", 2), tenant="acme"), rec(blocks("e", 2), tenant="acme"),
                               rec(blocks("f", 2), tenant="beta")])

    asyncio.run(write())


def test_tenant_forget_raises_the_epoch_and_erases_the_trace(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    directory = _policies(tmp_path, cache={"isolation": "tenant", "salt_epoch": 4})
    _write_trace(tmp_path / "state.sqlite3")
    assert main(["tenant", "forget", "acme", "--policies", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"acme: cache.salt_epoch 4 -> 5 in {directory / 'tenants' / 'acme.yaml'}" in out
    assert "erased 2 reuse-trace records of acme" in out
    assert yaml.safe_load((directory / "tenants" / "acme.yaml").read_text())["cache"]["salt_epoch"] == 5
    assert main(["tenant", "forget", "acme", "--policies", str(directory)]) == 0
    assert "acme: cache.salt_epoch 5 -> 6" in capsys.readouterr().out


def test_tenant_forget_without_a_store_erases_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tenant", "forget", "beta", "--policies", str(_policies(tmp_path))]) == 0
    assert "erased 0 reuse-trace records of beta" in capsys.readouterr().out
    assert not (tmp_path / "state.sqlite3").exists()


@pytest.mark.parametrize(("tenant", "sections", "message"), [
    ("nobody", {}, "no policy file for tenant 'nobody'"),
    ("acme", {"cache": {"isolation": "none"}}, "'acme' has cache.isolation: none"),
])
def test_tenant_forget_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str], tenant: str,
                                sections: dict[str, Any], message: str) -> None:
    directory = _policies(tmp_path, **sections)
    before = (directory / "tenants" / "acme.yaml").read_text()
    assert main(["tenant", "forget", tenant, "--policies", str(directory)]) == 1
    assert message in capsys.readouterr().err
    assert (directory / "tenants" / "acme.yaml").read_text() == before


# -- audit ----------------------------------------------------------------------------------------------------


def test_audit_of_an_unknown_tenant_or_a_broken_directory_is_1(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    directory = _policies(tmp_path)
    assert main(["audit", "--tenant", "nobody", "--policies", str(directory)]) == 1
    assert "unknown tenant 'nobody'" in capsys.readouterr().err
    assert main(["audit", "--policies", str(tmp_path / "absent")]) == 1
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_audit_of_a_fresh_store_in_each_format(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    directory = _policies(tmp_path)
    assert main(["audit", "--format", fmt, "--policies", str(directory)]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        report = json.loads(out)
        assert set(report["tenants"]) >= {"acme", "beta"} and report["gaps"] == []
    elif fmt == "csv":
        header = next(csv.reader(io.StringIO(out)))
        assert tuple(header) == audit_cli.COLUMNS
    else:
        assert out.startswith("policy version ") and out.splitlines()[1].split() == list(audit_cli.COLUMNS)


def test_audit_through_its_own_module_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_cli.main(["audit", "--format", "json", "--policies", str(_policies(tmp_path))]) == 0
    assert "tenants" in json.loads(capsys.readouterr().out)


def test_resetting_an_unknown_source_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "reset-source", "offload/9", "--medium", "cpu"]) == 1
    assert "unknown source 'offload/9'" in capsys.readouterr().err


def _view(stored: int, resident: int, drain: list[str], unknown: int = 0) -> dict[str, Any]:
    epoch = {"resident": resident, "unknown": unknown, "drain": {"reasons": drain}}
    return {"stored": stored, "removed": stored - resident, "resident": resident, "unknown": unknown,
            "lifetime_p50_s": 1.5, "lifetime_p99_s": None, "lifetime_max_s": 9.0, "oldest_resident_age_s": None,
            "violations": {"age": 0, "medium": 2}, "epochs": {"1": epoch}}


REPORT: dict[str, Any] = {
    "policy_version": "v9", "generated_at": "2026-12-01T12:00:00Z",
    "tenants": {"acme": {"GPU": _view(10, 0, ["a gap"]), "CPU": _view(4, 4, ["not shown"])},
                "old": {"not_auditable": "no policy"}},
    "gaps": [{"source": "offload/0", "missing_batches": 1, "restarts": 2, "restarts_presumed": 0, "lost": 0,
              "resets": 1, "clock_offset_s": None},
             {"source": "offload/1", "missing_batches": 0, "restarts": 0, "restarts_presumed": 1, "lost": 3,
              "resets": 0, "clock_offset_s": -0.25}],
    "judged_against_last_policy": {"gone": "v7"},
    "unobserved": {"main": ["no KV events yet"]},
}


def test_audit_csv_rows() -> None:
    rows = list(csv.reader(io.StringIO(audit_cli.render(REPORT, "csv"))))
    assert rows[1] == ["acme", "GPU", "10", "10", "0", "0", "1.5", "unknown", "9.0", "unknown", "0", "2"]  # never 0
    assert rows[3] == ["old", "no policy", *[""] * 10]
    assert len(rows) == 4


def test_audit_table_lines() -> None:
    lines = audit_cli.render(REPORT, "table").splitlines()
    assert lines[0] == "policy version v9, generated 2026-12-01T12:00:00Z"
    assert lines[2].split() == ["acme", "GPU", "10", "10", "0", "0", "1.5", "unknown", "9.0", "unknown", "0", "2"]
    assert ("source offload/0: 1 missing batches, 2 restarts (0 more presumed), 0 silences, 1 operator resets, "
            "clock offset not estimated yet") in lines
    assert "source offload/1: 0 missing batches, 0 restarts (1 more presumed), 3 silences, 0 operator resets, " \
           "clock offset -0.250 s" in lines
    assert "acme GPU epoch 1: drain not proven: a gap" in lines
    assert not any("acme CPU epoch" in line for line in lines)  # still resident, nothing unknown: not a drain
    assert "gone: no longer in the policy set; judged against policy version v7" in lines
    assert lines[-1] == "pool main: unobserved: no KV events yet"


def test_audit_json_is_the_report() -> None:
    assert json.loads(audit_cli.render(REPORT, "json")) == REPORT
