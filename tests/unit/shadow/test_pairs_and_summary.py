"""The shadow's pure parts: how a pair is formed from its two arms, how an arm's answer becomes a result, the
text an arm generated in each body shape, quantiles and the bootstrap interval, the per-tenant summary and
verdict, the report table, and the sampling and per-tenant cap of the runner."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, ShadowPolicy, TenantPolicy
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.upstream import UpstreamClient
from gateway.shadow.client import ShadowAnswer, ShadowClient
from gateway.shadow.compare import ArmResult, PairRecord, generated_text, pair_record
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.runner import ShadowCall, ShadowRunner, arm_result
from gateway.shadow.stats import bootstrap_median_ci, quantile, tenant_summary, verdict
from gateway.shadow.store import SqliteShadowStore
from gateway.shadow.table import shadow_table
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor


def arm(request_id: str = "r", status: int = 200, ttft: float | None = 0.5, duration: float = 2.0,
        cached: int | None = 16, text: str | None = "hello") -> ArmResult:
    return ArmResult(request_id, status, ttft, duration, cached, text)


def test_a_pair_subtracts_shadow_from_primary() -> None:
    record = pair_record("acme", ("offload", "control"), arm("r1", ttft=0.25, duration=1.0, cached=48),
                         arm("r1-shadow", ttft=0.75, duration=1.5, cached=16), deterministic=True, at=9.0)
    assert record == PairRecord("acme", "r1", "offload", "control", -0.5, -0.5, 32, True, False, 9.0)


@pytest.mark.parametrize(("primary_ttft", "shadow_ttft", "delta"), [
    (None, 0.5, None), (0.5, None, None), (None, None, None), (0.0, 0.0, 0.0), (0.0, 0.5, -0.5),
])
def test_a_ttft_delta_needs_both_ttfts(primary_ttft: float | None, shadow_ttft: float | None,
                                       delta: float | None) -> None:
    record = pair_record("t", ("a", "b"), arm(ttft=primary_ttft), arm(ttft=shadow_ttft), False, 0.0)
    assert record.ttft_delta_s == delta


@pytest.mark.parametrize(("primary_cached", "shadow_cached", "delta"), [
    (None, 5, None), (5, None, None), (0, 0, 0), (0, 16, -16),
])
def test_a_cached_delta_needs_both_counts(primary_cached: int | None, shadow_cached: int | None,
                                          delta: int | None) -> None:
    record = pair_record("t", ("a", "b"), arm(cached=primary_cached), arm(cached=shadow_cached), False, 0.0)
    assert record.cached_delta == delta


@pytest.mark.parametrize(("deterministic", "primary_text", "shadow_text", "compared", "mismatch"), [
    (True, "a", "a", True, False),
    (True, "a", "b", True, True),
    (True, "", "", True, False),
    (True, None, "a", False, False),  # an unreadable arm is not compared
    (True, "a", None, False, False),
    (False, "a", "b", False, False),  # sampled output may differ: never a mismatch
])
def test_outputs_are_compared_only_for_deterministic_readable_pairs(deterministic: bool, primary_text: str | None,
                                                                    shadow_text: str | None, compared: bool,
                                                                    mismatch: bool) -> None:
    record = pair_record("t", ("a", "b"), arm(text=primary_text), arm(text=shadow_text), deterministic, 0.0)
    assert (record.compared_output, record.mismatch) == (compared, mismatch)


@pytest.mark.parametrize(("raw", "text"), [
    (b'{"choices":[{"text":"a"},{"text":"b"}]}', "ab"),
    (b'{"choices":[{"message":{"content":"hi"}}]}', "hi"),
    (b'{"choices":[{"delta":{"content":"d"}}]}', "d"),
    (b'{"choices":[{"message":{"content":null}}]}', ""),
    (b'{"choices":[]}', ""),
    (b'{"choices":null}', ""),
    (b'{"output_text":"resp"}', "resp"),
    (b'{"output_text":5,"choices":[{"text":"c"}]}', "c"),
    (b'  \n{"choices":[{"text":"x"}]}', "x"),
    (b'{"choices":[{"text":"\\u00fcn\\u00efcode \\u2713"}]}', "ünïcode ✓"),
    (b"[1, 2]", None),  # JSON, but not an object
    (b'"text"', None),
    (b"not json", None),
    (b"", None),
    (b"[" * 5000 + b"]" * 5000, None),  # too deep to read: unreadable, not a crash
    (b'data: {"choices":[{"text":"s"}]}\n\ndata: {"choices":[{"text":"t"}]}\n\ndata: [DONE]\n\n', "st"),
    (b': keep-alive\n\ndata: {"choices":[{"delta":{"content":"c"}}]}\n\n', "c"),
])
def test_the_generated_text_of_each_body_shape(raw: bytes, text: str | None) -> None:
    assert generated_text(raw) == text


def call(streamed: bool) -> ShadowCall:
    return ShadowCall(tenant="acme", primary_pool="offload", path="/v1/completions", request_id="r-shadow",
                      headers={}, body=b"{}", streamed=streamed, deterministic=True, affinity="a")


STREAM = (b'data: {"choices":[{"text":"hi"}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,'
          b'"prompt_tokens_details":{"cached_tokens":3}}}\n\ndata: [DONE]\n\n')
JSON_BODY = (b'{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,'
             b'"prompt_tokens_details":{"cached_tokens":2}}}')


@pytest.mark.parametrize(("streamed", "answer", "expected"), [
    (True, ShadowAnswer(200, STREAM, 10.25), ArmResult("r-shadow", 200, 0.25, 1.0, 3, "hi")),
    (True, ShadowAnswer(200, STREAM, None), ArmResult("r-shadow", 200, None, 1.0, 3, "hi")),
    (False, ShadowAnswer(200, JSON_BODY, 10.25), ArmResult("r-shadow", 200, None, 1.0, 2, "hi")),
    (False, ShadowAnswer(200, b'{"choices":[{"text":"hi"}]}', None), ArmResult("r-shadow", 200, None, 1.0, None,
                                                                                  "hi")),
    (True, ShadowAnswer(503, b"overloaded", 10.25), ArmResult("r-shadow", 503, None, 1.0, None, None)),
    (False, ShadowAnswer(400, JSON_BODY, None), ArmResult("r-shadow", 400, None, 1.0, None, None)),
])
def test_an_arms_result_is_read_from_its_answer(streamed: bool, answer: ShadowAnswer, expected: ArmResult) -> None:
    assert arm_result(call(streamed), answer, started=10.0, ended=11.0) == expected


# --- statistics ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 0.5, None),
    ([3.0], 0.0, 3.0), ([3.0], 0.5, 3.0), ([3.0], 1.0, 3.0),
    ([1.0, 2.0], 0.5, 1.5),
    ([4.0, 1.0, 3.0, 2.0], 0.5, 2.5),  # unsorted input
    ([1.0, 2.0, 3.0, 4.0, 5.0], 0.9, 4.6),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 0.0, 1.0),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 1.0, 5.0),
    ([-1.0, 1.0], 0.25, -0.5),
])
def test_quantiles_interpolate_linearly(values: list[float], q: float, expected: float | None) -> None:
    assert quantile(values, q) == (None if expected is None else pytest.approx(expected))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), st.floats(0, 1), st.floats(0, 1))
def test_quantiles_stay_within_the_data_and_rise_with_q(values: list[float], q1: float, q2: float) -> None:
    low, high = sorted((q1, q2))
    a, b = quantile(values, low), quantile(values, high)
    assert a is not None and b is not None
    assert min(values) - 1e-6 <= a <= b + 1e-6 and b <= max(values) + 1e-6


@pytest.mark.parametrize("values", [[], [1.0]])
def test_no_interval_from_fewer_than_two_values(values: list[float]) -> None:
    assert bootstrap_median_ci(values) is None


def test_the_interval_of_identical_values_is_that_value_and_is_reproducible() -> None:
    assert bootstrap_median_ci([0.2] * 5) == [0.2, 0.2]
    values = [0.01 * n for n in range(40)]
    assert bootstrap_median_ci(values) == bootstrap_median_ci(values)  # a fixed seed: same report twice


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=40))
def test_the_interval_is_ordered_and_within_the_data(values: list[float]) -> None:
    ci = bootstrap_median_ci(values, rounds=200)
    assert ci is not None
    assert min(values) <= ci[0] <= ci[1] <= max(values)


@pytest.mark.parametrize(("pairs", "ci", "mismatches", "text"), [
    (5, [-0.1, -0.05], 0, "too few pairs to conclude (5 with TTFT, need 20)"),
    (25, None, 0, "too few pairs to conclude (25 with TTFT, need 20)"),
    (25, [-0.0125, -0.0025], 0, "primary is faster: median ΔTTFT CI [-12.5, -2.5] ms"),
    (25, [0.001, 0.002], 0, "primary is slower: median ΔTTFT CI [1.0, 2.0] ms"),
    (25, [-0.001, 0.002], 0, "no clear difference: median ΔTTFT CI [-1.0, 2.0] ms spans 0"),
    (25, [0.0, 0.002], 0, "no clear difference: median ΔTTFT CI [0.0, 2.0] ms spans 0"),  # 0 is not above 0
    (25, [-0.002, 0.0], 1, "no clear difference: median ΔTTFT CI [-2.0, 0.0] ms spans 0; 1 deterministic output "
                           "mismatch(es): check the connector"),
    (3, None, 2, "too few pairs to conclude (3 with TTFT, need 20); 2 deterministic output mismatch(es): check "
                 "the connector"),
])
def test_the_verdict_text(pairs: int, ci: list[float] | None, mismatches: int, text: str) -> None:
    assert verdict(pairs, ci, mismatches) == text


def test_a_summary_counts_what_it_was_given() -> None:
    pairs = [PairRecord("t", f"r{n}", "a", "b", None if n == 0 else -0.1 * n, 1.0, None if n < 2 else n,
                        n % 2 == 0, n == 2, 0.0) for n in range(4)]
    summary = tenant_summary(pairs, {"dropped": 3, "error": 1, "compared": 4})
    assert {key: summary[key] for key in ("pairs", "dropped", "errors", "ttft_pairs", "compared_outputs",
                                          "mismatches", "mismatch_rate", "cached_tokens_delta_mean",
                                          "conclusive")} == {
        "pairs": 4, "dropped": 3, "errors": 1, "ttft_pairs": 3, "compared_outputs": 2, "mismatches": 1,
        "mismatch_rate": 0.5, "cached_tokens_delta_mean": 2.5, "conclusive": False}
    assert summary["ttft_delta_p50_s"] == pytest.approx(-0.2)
    assert summary["duration_delta_p50_s"] == 1.0


def test_an_empty_summary_is_unknown_not_zero() -> None:
    summary = tenant_summary([], {})
    assert summary["ttft_delta_p50_s"] is None and summary["ttft_delta_ci95_s"] is None
    assert summary["mismatch_rate"] is None and summary["cached_tokens_delta_mean"] is None
    assert summary["duration_delta_p50_s"] is None
    assert (summary["pairs"], summary["dropped"], summary["errors"]) == (0, 0, 0)


def test_the_report_table() -> None:
    report: dict[str, Any] = {"tenants": {
        "zeta": {"pairs": 0, "ttft_delta_p50_s": None, "ttft_delta_p90_s": None, "ttft_delta_ci95_s": None,
                 "mismatches": 0, "verdict": "too few"},
        "acme": {"pairs": 25, "ttft_delta_p50_s": -0.0123, "ttft_delta_p90_s": 0.5,
                 "ttft_delta_ci95_s": [-0.02, -0.01], "mismatches": 1, "verdict": "faster"},
    }}
    assert shadow_table(report).splitlines() == [
        "tenant  pairs  ΔTTFT p50 ms  ΔTTFT p90 ms  95% CI ms           mismatches  note   ",
        "------  -----  ------------  ------------  ------------------  ----------  -------",
        "acme    25     -12.300       500.000       [-20.000, -10.000]  1           faster ",
        "zeta    0      -             -             [-, -]              0           too few",
    ]


def test_a_report_without_tenants_is_a_header_only() -> None:
    assert len(shadow_table({}).splitlines()) == 2


# --- the runner's sampling and cap ---------------------------------------------------------------------------------


GATEWAY = GatewayConfig.model_validate({"pools": {"offload": {"upstreams": ["http://127.0.0.1:9"]},
                                                  "control": {"upstreams": ["http://127.0.0.1:9"]}},
                                        "default_pool": "offload"})


def tenant(pool: str | None = "control", sample: float = 1.0, max_in_flight: int = 4) -> TenantPolicy:
    return TenantPolicy(tenant="acme", shadow=ShadowPolicy(pool=pool, sample=sample, max_in_flight=max_in_flight))


async def runner_on(storage: Storage) -> ShadowRunner:
    recorder = ShadowRecorder(await SqliteShadowStore.open(storage.sqlite_worker()), flush_interval_s=60.0)
    client = ShadowClient(UpstreamClient(8, connect_timeout_s=1.0, read_timeout_s=5.0))
    return ShadowRunner(client, GatewayMetrics(CollectorRegistry()), recorder,
                        TaskSupervisor("test-shadow"), UpstreamHealth(), timeout_s=5.0)


@pytest.mark.parametrize(("policy", "primary_pool", "sampled"), [
    (tenant(pool=None, sample=0.0), "offload", False),
    (tenant(sample=0.0), "offload", False),
    (tenant(), "control", False),  # the request already went to the shadow pool
    (tenant(), "offload", True),
])
def test_who_is_sampled(tmp_path: Any, policy: TenantPolicy, primary_pool: str, sampled: bool) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        runner = await runner_on(storage)
        assert all(runner.sampled(policy, f"req-{n}", primary_pool) is sampled for n in range(20))
        await storage.close()

    asyncio.run(run())


def test_a_sample_rate_samples_that_share_of_request_ids(tmp_path: Any) -> None:
    async def run() -> int:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        runner = await runner_on(storage)
        hits = sum(runner.sampled(tenant(sample=0.25), f"req-{n}", "offload") for n in range(4000))
        assert runner.sampled(tenant(sample=0.25), "fixed", "offload") == runner.sampled(tenant(sample=0.25),
                                                                                        "fixed", "offload")
        await storage.close()
        return hits

    assert 800 < asyncio.run(run()) < 1200  # 1000 expected; a deterministic hash of fixed ids, so no flake


def test_shadows_over_the_tenants_cap_are_dropped_and_counted(tmp_path: Any) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        runner = await runner_on(storage)
        policies = PolicySet(gateway=GATEWAY, tenants={}, keys={}, version="v", pool_credentials={})
        assert runner.mirror(policies, tenant(max_in_flight=0), call(False)) is None
        assert runner.mirror(policies, tenant(max_in_flight=0), call(False)) is None
        await runner.recorder.flush()
        assert (await runner.recorder.store.results("acme")).counts == {"dropped": 2}
        dropped = runner.metrics.registry.get_sample_value("kvgate_shadow_requests_total",
                                                           {"tenant": "acme", "outcome": "dropped"})
        assert dropped == 2
        await runner.close()
        await storage.close()

    asyncio.run(run())
