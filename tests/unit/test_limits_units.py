"""Tenant `limits` in policy files, the per-minute arithmetic (GCRA) and the JSON shape scan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import BadRequest
from gateway.limits.rate import LocalRateLimiter
from gateway.policy.loader import PolicyLoadError, load_policy_set
from gateway.proxy.shape import (
    JsonLimits,
    _escapes_removed,
    _skeleton_without_escapes,
    backslashes_before,
    check_json_shape,
    json_skeleton,
    structure_outside_strings,
)

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def with_limits(tmp_path: Path, limits: object) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, target)
    path = target / "tenants" / "acme.yaml"
    data = yaml.safe_load(path.read_text())
    data["limits"] = limits
    path.write_text(yaml.safe_dump(data))
    return target


def test_limits_load() -> None:
    assert load_policy_set(REPO_POLICIES).tenants["acme"].limits.max_in_flight is None


def test_valid_limits_load(tmp_path: Path) -> None:
    policies = load_policy_set(with_limits(tmp_path, {"max_in_flight": 4, "requests_per_minute": 600}))
    assert policies.tenants["acme"].limits.requests_per_minute == 600


@pytest.mark.parametrize("limits", [{"max_in_flight": 0}, {"requests_per_minute": -1}, {"max_in_flight": True},
                                    {"requests_per_minute": "60"}, {"requests_per_minute": 1.5}, {"burst": 3}])
def test_invalid_limits_name_the_field(tmp_path: Path, limits: dict[str, object]) -> None:
    with pytest.raises(PolicyLoadError) as raised:
        load_policy_set(with_limits(tmp_path, limits))
    (problem,) = raised.value.problems
    assert "limits." in problem


def test_gcra_admits_the_budget_then_one_per_interval() -> None:
    limiter = LocalRateLimiter()
    assert [limiter.acquire_now("t", 3, 0.0) for _ in range(3)] == [None, None, None]
    wait = limiter.acquire_now("t", 3, 0.0)
    assert wait == pytest.approx(20.0)  # one request per 20 s after a burst of 3
    assert limiter.acquire_now("t", 3, 19.9) is not None
    assert limiter.acquire_now("t", 3, 20.0) is None
    assert limiter.acquire_now("other", 3, 20.0) is None


def test_structure_ignores_strings_and_escapes() -> None:
    body = json.dumps({"a": 'x\\"[[[{\\\\', "b\\": ["\"]", 1]}).encode()
    assert structure_outside_strings(body) == b"{,[,]}"


SKELETON_TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "[", "{", ",", "a", "é", "\n"]), max_size=40)
SKELETON_VALUES = st.recursive(
    st.none() | st.integers() | SKELETON_TEXT,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(SKELETON_TEXT, children, max_size=4),
    max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(value=SKELETON_VALUES, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]),
       cut=st.floats(min_value=0.0, max_value=1.0))
def test_the_quote_walk_reads_the_structure_as_the_replacing_pass_does(
    value: object, ascii_only: bool, indent: int | None, cut: float
) -> None:
    """Both ways of finding the structure outside strings agree on whole texts and on every cut of them (where a
    cut text ends inside a string or not); the walk is taken for texts with few quotes, the pass for the rest."""
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    for piece in (text, text[: int(cut * len(text))]):
        assert json_skeleton(piece) == _skeleton_without_escapes(_escapes_removed(piece))


def test_many_quotes_take_the_replacing_pass_and_read_the_same() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": 'say "' * 5000}] * 3}).encode()
    assert structure_outside_strings(body) == b"{[{,},{,},{,}]}"


def test_a_long_run_of_backslashes_is_counted_only_up_to_the_callers_limit() -> None:
    """The quote walk gives up past its budget; a run of backslashes inside one string must not be walked whole
    first (a body of megabytes of backslashes before one quote)."""
    run = b'["' + b"\\" * 400_000 + b'"]'
    assert backslashes_before(run, len(run) - 2, 10) == 11
    assert backslashes_before(run, len(run) - 2, 10**9) == 400_000
    assert backslashes_before(b'"a"', 2, 5) == 0
    assert json_skeleton(run) == (b"[]", False)


@pytest.mark.parametrize(("depth", "refused"), [(64, False), (65, True), (5000, True)])
def test_depth_bound(depth: int, refused: bool) -> None:
    body = b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b',"s":"' + b"[" * 500 + b'"}'
    if refused:
        with pytest.raises(BadRequest):
            check_json_shape(body, JsonLimits(64, 10_000))
    else:
        check_json_shape(body, JsonLimits(64, 10_000))


def test_items_bound() -> None:
    check_json_shape(json.dumps(list(range(99))).encode(), JsonLimits(64, 100))
    with pytest.raises(BadRequest):
        check_json_shape(json.dumps(list(range(101))).encode(), JsonLimits(64, 100))
