"""`kvgate demo` without its processes (gateway.devtools.demo.workload and .report): the traffic plan, the users
each arm gets, and the three tables from samples and an audit made by hand."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.devtools.demo.report import phase_table, retention_table, traffic_table
from gateway.devtools.demo.workload import (
    PREFIX_TOKENS,
    RETURNS,
    SPLIT_TENANT,
    Sample,
    owned_prefixes,
    plan,
    prefix,
    users_for,
)


def _draw(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") * 100.0 / 2**64


def test_prefixes_are_exactly_the_token_budget_and_distinct() -> None:
    texts = [prefix(owner, index) for owner in ("acme", "initech", "acme-noise0-1") for index in range(3)]
    assert all(len(text) == PREFIX_TOKENS and text.isascii() for text in texts)
    assert len(set(texts)) == len(texts)
    assert prefix("acme", 0) == prefix("acme", 0)


@pytest.mark.parametrize("count", [1, 2, 5, 6])
def test_users_alternate_between_inside_and_outside_the_rollout(count: int) -> None:
    users = users_for("initech", count)
    assert len(users) == count
    inside = [_draw(f"user:initech:{user}") < 50 for user in users]
    assert inside == [index % 2 == 0 for index in range(count)]


def test_a_full_rollout_has_no_outside_users_to_pair() -> None:
    assert users_for("acme", 4, percent=100.0) == []


def test_the_split_tenant_owns_more_prefixes() -> None:
    owned = owned_prefixes(["acme", SPLIT_TENANT])
    assert [(tenant, index) for tenant, _, index in owned] == [("acme", 0), ("acme", 1)] + \
        [(SPLIT_TENANT, index) for index in range(6)]


def test_the_plan_is_cold_repeat_then_pressure_and_return_rounds() -> None:
    rounds = plan(["acme", SPLIT_TENANT])
    assert len(rounds) == 2 + 2 * RETURNS
    assert [round_[0].phase for round_ in rounds] == ["cold", "repeat"] + ["pressure", "return"] * RETURNS
    assert all(len(round_) == 8 for round_ in rounds)
    cold, repeat, returns = rounds[0], rounds[1], rounds[3]
    for first, again, back in zip(cold, repeat, returns, strict=True):
        assert first.prompt[:PREFIX_TOKENS] == again.prompt[:PREFIX_TOKENS] == back.prompt[:PREFIX_TOKENS]
        assert first.user == again.user == back.user
        assert first.prompt != again.prompt  # a different question after the shared prefix
    pressure_prefixes = {step.prompt for step in rounds[2]}
    assert not pressure_prefixes & {step.prompt[:PREFIX_TOKENS] for step in cold}


def _sample(tenant: str, phase: str, pool: str, ttft: float | None, prompt: int = 100, cached: int = 0,
            status: int = 200) -> Sample:
    return Sample(tenant, phase, pool, status, ttft, prompt, cached)


SAMPLES = [
    _sample("acme", "cold", "offload", 0.4), _sample("acme", "return", "offload", 0.1, cached=90),
    _sample("acme", "return", "offload", 0.3, cached=90), _sample("acme", "repeat", "offload", None, status=500),
    _sample("initech", "cold", "control", 0.5), _sample("initech", "return", "control", 0.6),
    _sample("initech", "return", "offload", 0.2, cached=80), _sample("initech", "cold", "offload", 0.45),
]


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[2:]]


def test_traffic_per_tenant_and_pool() -> None:
    rows = _rows(traffic_table(SAMPLES))
    # acme/offload: TTFTs 0.4, 0.1, 0.3 -> p50 300 ms, p90 380 ms; returns 0.1, 0.3 -> 200 ms; 180 of 400 cached
    assert rows[0] == ["acme", "offload", "4", "300.000", "380.000", "200.000", "45", "%"]
    assert rows[1] == ["initech", "control", "2", "550.000", "590.000", "600.000", "0", "%"]
    assert rows[2] == ["initech", "offload", "2", "325.000", "425.000", "200.000", "40", "%"]


def test_a_group_without_prompt_tokens_or_returns_prints_dashes() -> None:
    rows = _rows(traffic_table([_sample("acme", "cold", "offload", None, prompt=0)]))
    assert rows == [["acme", "offload", "1", "-", "-", "-", "-"]]


def test_the_phase_table_compares_the_two_arms_of_one_tenant() -> None:
    lines = phase_table(SAMPLES, "initech").splitlines()
    assert lines[0].split() == ["phase", "control", "p50", "ms", "offload", "p50", "ms", "offload", "−", "control",
                                "ms"]
    rows = _rows(phase_table(SAMPLES, "initech"))
    assert rows[0] == ["cold", "500.000", "450.000", "-50.000"]
    assert rows[1] == ["repeat", "-", "-", "-"]
    assert rows[3] == ["return", "600.000", "200.000", "-400.000"]


def test_the_retention_table_skips_what_is_not_a_medium() -> None:
    audit: dict[str, Any] = {"tenants": {
        "zeta": {"GPU": {"stored": 1, "removed": 1, "resident": 0}},
        "acme": {"CPU": {"stored": 5, "removed": 2, "resident": 3, "lifetime_p50_s": 1.5,
                         "oldest_resident_age_s": 9.0, "violations": {"age": 1, "medium": 0}},
                 "not_auditable": "x", "GPU": {"resident": 4}},
    }}
    rows = _rows(retention_table(audit))
    assert rows == [["acme", "CPU", "5", "2", "3", "1.500", "9.000", "1", "0"],
                    ["zeta", "GPU", "1", "1", "0", "unknown", "unknown", "0", "0"]]
    assert _rows(retention_table({})) == []
