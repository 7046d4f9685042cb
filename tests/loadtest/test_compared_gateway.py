"""The benchmark's second gateway (`proxy_overhead --compare-tree / --compare-env`): it runs the code of the tree
it is given, not this one's, with the settings it is given, and relays the benchmark's stream in full. A compared
gateway that silently ran this tree would report every change as free."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from loadtests.overhead_report import GATEWAY
from loadtests.proxy_overhead import COMPARED, expected_events, make_targets, parse_args, sanity_check, servers

REPO_ROOT = Path(__file__).resolve().parents[2]
MARK = "compared-tree-marker"


def test_compare_offload_is_read_as_a_json_object() -> None:
    config = parse_args(["--out", "x.json", "--compare-offload", '{"admission": "returning"}'])
    assert config.compare_offload == {"admission": "returning"}
    for wrong in ("[]", "admission"):
        with pytest.raises(SystemExit):
            parse_args(["--out", "x.json", "--compare-offload", wrong])


def test_compare_env_is_read_as_name_value_pairs() -> None:
    config = parse_args(["--out", "x.json", "--compare-env", "A=1", "--compare-env", "B=x=y"])
    assert config.compare_env == (("A", "1"), ("B", "x=y"))
    with pytest.raises(SystemExit):
        parse_args(["--out", "x.json", "--compare-env", "no-equals-sign"])


def test_the_compared_gateway_runs_the_given_tree_and_relays_the_whole_stream(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REPO_ROOT / "gateway", tree / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    with (tree / "gateway" / "__init__.py").open("a") as init:  # a trace only the given tree leaves in its log
        init.write(f"\nimport sys\nprint({MARK!r}, file=sys.stderr, flush=True)\n")
    own_log, compared_log = relay_through_both(tmp_path, "--compare-tree", str(tree),
                                               "--compare-env", "KVGATE_REUSE_TRACE=false")
    assert MARK in compared_log and MARK not in own_log
    assert '"reuse-trace"' in started_features(own_log) and '"reuse-trace"' not in started_features(compared_log)


def relay_through_both(tmp_path: Path, *compare: str) -> tuple[str, str]:
    """Start the benchmark's gateway and its compared gateway (`compare`: the options that shape the second), check
    that both relay the whole stream, and return their logs (the gateway's first)."""
    config = parse_args(["--out", str(tmp_path / "out.json"), "--no-nginx", "--no-router", "--tokens", "4",
                         "--ttft-ms", "1", "--token-ms", "0", *compare])
    work = tmp_path / "work"
    work.mkdir()
    with servers(config, work) as (_, proxies, key):
        urls = {name: proxies[name].url for name in (GATEWAY, COMPARED)}
        asyncio.run(sanity_check(make_targets(config, urls, key), expected_events(config)))
        return proxies[GATEWAY].log_text(), proxies[COMPARED].log_text()


def started_features(log: str) -> str:
    """The `features` list of a gateway's start line (its setting applied or not)."""
    line = next(line for line in log.splitlines() if '"event":"gateway_started"' in line)
    return line.split('"features":', 1)[1].split("]", 1)[0]


def test_the_benchmark_tenant_runs_with_its_offload_features_and_the_compared_one_without(tmp_path: Path) -> None:
    """Issue 15 asks every feature on in the benchmark: the gateway's requests pass offload admission (their log
    lines carry its decision); `--compare-offload '{}'` gives the second gateway the same tenant without it."""
    own_log, compared_log = relay_through_both(tmp_path, "--compare-offload", "{}")
    assert admission_decisions(own_log) == ["short"]  # the benchmark's prompt is shorter than one 64-token chunk
    assert admission_decisions(compared_log) == []


def admission_decisions(log: str) -> list[str]:
    lines = [json.loads(line) for line in log.splitlines() if '"event":"request"' in line]
    return sorted({line["admission"] for line in lines if "admission" in line}) if lines else ["no request line"]
