"""`kvgate plan` replays the recorded trace with and without offload admission (issue: keep one-off documents
out of the RAM tier): hot documents that keep returning plus one-off documents at ten times their volume."""

from __future__ import annotations

import msgspec

from gateway.plan.admission_effect import admission_effect
from gateway.plan.build import PlanInputs, build_plan
from gateway.plan.render import render
from gateway.plan.replay import CacheShape
from gateway.reuse.admission import AdmissionRule
from gateway.reuse.record import TraceRecord
from tests.plan.test_build import BLOCK, SERVER, record

HOT_DOCS = 3
DOC_BLOCKS = 64  # 1,024 tokens: 16 offload chunks of 64 tokens


def hot_and_scan(rounds: int = 8) -> list[TraceRecord]:
    """Each round: the hot documents once, then ten one-off documents per hot one."""
    trace: list[TraceRecord] = []
    ts = 0.0
    for round_number in range(rounds):
        for hot in range(HOT_DOCS):
            trace.append(record(ts, f"hot{hot}", DOC_BLOCKS, f"q{round_number}-{hot}"))
            ts += 1.0
            for scan in range(10):
                trace.append(record(ts, f"once{round_number}-{hot}-{scan}", DOC_BLOCKS, "q"))
                ts += 1.0
    return trace


SHAPE = CacheShape(gpu_blocks=256, block_size=BLOCK, offload_block_tokens=64)
TIER_CHUNKS = 2 * HOT_DOCS * DOC_BLOCKS * BLOCK // 64  # twice the hot set


def test_admission_keeps_the_hot_set_in_a_tier_twice_its_size() -> None:
    effect = admission_effect(hot_and_scan(), SHAPE, TIER_CHUNKS, honour_max_load=True)
    assert effect["requests"] == 8 * 33
    # every one-off and each hot document's first sighting store nothing; later hot returns store
    assert effect["requests_storing_nothing_with_admission"] == 8 * 30 + HOT_DOCS
    assert effect["without"]["cpu_share"] == 0.0  # one-offs evict the hot set before it returns
    assert effect["with"]["cpu_share"] > 0.05
    assert effect["with"]["chunks_stored"] * 10 < effect["without"]["chunks_stored"]


def test_min_seen_delays_admission_and_a_policy_zero_is_left_out() -> None:
    trace = hot_and_scan()
    twice = admission_effect(trace, SHAPE, TIER_CHUNKS, True, AdmissionRule(mode="returning", min_seen=2))
    assert twice["requests_storing_nothing_with_admission"] == 8 * 30 + 2 * HOT_DOCS
    capped = [msgspec.structs.replace(r, tenant="zero", max_offload_tokens=0) for r in trace[:5]]
    effect = admission_effect([*trace, *capped], SHAPE, TIER_CHUNKS, True)
    assert effect["left_out_requests"] == 5


def test_the_plan_shows_the_admission_effect() -> None:
    plan = build_plan(hot_and_scan(), PlanInputs(server=SERVER))
    assert plan["admission"]["rule"]["mode"] == "returning"
    assert plan["admission"]["with"]["chunks_stored"] < plan["admission"]["without"]["chunks_stored"]
    assert "Offload admission on this traffic" in render(plan, "table")
    assert "| with |" in render(plan, "md")
