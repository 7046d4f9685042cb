"""`kvgate shadow report` run in-process against a real policy directory and a real SQLite state file: the table
and JSON forms, one tenant or all, and a broken policy set refused with its problems on stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml

from gateway.shadow.cli import add_arguments
from gateway.shadow.compare import PairRecord
from gateway.shadow.store import open_shadow_store
from gateway.storage import Storage


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate shadow")
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("KVGATE_"):
            monkeypatch.delenv(name)
    state = tmp_path / "state.sqlite3"
    monkeypatch.setenv("KVGATE_STATE_PATH", str(state))
    policies = tmp_path / "policies"
    (policies / "tenants").mkdir(parents=True)
    (policies / "gateway.yaml").write_text(yaml.safe_dump({"pools": {"p": {"upstreams": ["http://a"]}},
                                                           "default_pool": "p"}))
    for tenant in ("acme", "beta"):
        (policies / "tenants" / f"{tenant}.yaml").write_text(yaml.safe_dump({"tenant": tenant}))

    async def seed() -> None:
        storage = await Storage.open(None, state)
        store = await open_shadow_store(storage)
        pairs = [PairRecord("acme", f"r{n}", "p", "q", -0.010 - n / 1000, 0.1, 8, True, n == 0, float(n))
                 for n in range(25)]
        await store.write(pairs, {("acme", "compared"): 25, ("acme", "dropped"): 2})
        await storage.close()

    asyncio.run(seed())
    return policies


def test_the_json_report_summarises_each_tenant(setup: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("report", "--policies", str(setup), "--format", "json")
    assert args.command(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["tenants"]) == {"acme", "beta"} and len(report["policy_version"]) == 16
    acme, beta = report["tenants"]["acme"], report["tenants"]["beta"]
    assert (acme["pairs"], acme["dropped"], acme["mismatches"], acme["conclusive"]) == (25, 2, 1, True)
    assert acme["verdict"].startswith("primary is faster")
    assert (beta["pairs"], beta["ttft_delta_p50_s"], beta["conclusive"]) == (0, None, False)


def test_one_tenant_as_a_table(setup: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("report", "--policies", str(setup), "--tenant", "beta")
    assert args.command(args) == 0
    header, rule, row = capsys.readouterr().out.splitlines()
    assert header.split()[:2] == ["tenant", "pairs"] and set(rule.replace(" ", "")) == {"-"}
    assert row.split()[:5] == ["beta", "0", "-", "-", "[-,"]


def test_a_broken_policy_set_is_refused_with_its_problems(setup: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (setup / "tenants" / "acme.yaml").write_text("tenant: Acme\n")
    args = parse("report", "--policies", str(setup))
    assert args.command(args) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "acme.yaml: tenant: " in captured.err
