"""The plan's text and Markdown renderings (gateway.plan.render): the figures of the hand trace as they print,
"unknown" wherever a figure is missing, window names, and the two table formats."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.plan.build import PlanInputs, build_plan
from gateway.plan.render import render
from tests.unit.plan.traces import ONE_BLOCK_GPU, doc_twice


def _plan(**inputs: Any) -> dict[str, Any]:
    return build_plan(doc_twice(), PlanInputs(**{"server": ONE_BLOCK_GPU, **inputs}))


def _section(text: str, title: str) -> list[str]:
    """The lines of one section of a rendering (sections are separated by a blank line)."""
    for block in text.split("\n\n"):
        if block.lstrip("# ").startswith(title):
            return block.splitlines()
    raise AssertionError(f"no section {title!r} in:\n{text}")


def test_the_header_names_the_pool_tenant_and_trace() -> None:
    text = render(_plan(tenant="acme"), "table")
    assert text.startswith("kvgate plan — pool main, tenant acme\n"
                           "trace: 2 requests (every prefix chain) over 30.0 min, observed cached share 6.2 %\n")
    assert "all tenants" in render(_plan(), "table")


def test_the_recommendation_prints_the_bytes_and_every_reason() -> None:
    lines = _section(render(_plan(), "table"), "Recommendation")
    assert lines[1] == "cpu_bytes_to_use: 128000  (0.00 GB)"
    assert lines[2].startswith("- the tier serves 43.8% of prompt tokens")
    assert lines[-1] == "- not checked against host RAM (unknown: give --host-ram)"


def test_markdown_keeps_headings_and_pipes_and_text_drops_them() -> None:
    md = render(_plan(), "md")
    text = render(_plan(), "table")
    assert "### KV cache\n|  | value | source |\n|---|---|---|\n| KV bytes per token | 1,000 |" in md
    assert "###" not in text and "| KV bytes per token" not in text
    assert "KV bytes per token  1,000" in text
    assert md.endswith("\n") and text.endswith("\n")


def test_curve_rows_show_tokens_bytes_and_shares() -> None:
    rows = _section(render(_plan(), "md"), "Predicted hit rates")
    knee = next(row for row in rows if row.startswith("| knee"))
    assert knee.startswith("| knee | 128 tok / 0.00 GB | 6.2 % | 43.8 % | 50.0 % |")
    assert len([row for row in rows if row.startswith("| ")]) == 1 + 4  # header and 4 points


def test_a_sampled_plan_prints_plus_minus_bounds() -> None:
    plan = _plan()
    knee = next(point for point in plan["curve"] if point["label"] == "knee")
    knee["error_bound"] = {"gpu_share": 0.01, "cpu_share": 0.05, "sampled": True}
    plan["trace"]["sample_rate"] = 0.25
    text = render(plan, "md")
    assert "| knee | 128 tok / 0.00 GB | 6.2 % ±1.0 | 43.8 % ±5.0 |" in text
    assert "(sampled at 0.25)" in text


def test_unknown_figures_print_as_unknown() -> None:
    plan = build_plan(doc_twice(), PlanInputs(gpu_kv_tokens=16, block_size=16))
    text = render(plan, "table")
    assert _section(text, "Budgets")[3:] == [
        f"{name.ljust(42)}  unknown" for name in (
            "host RAM", "weights held in host RAM", "headroom (OS, tokenizers, buffers)", "cache process RSS",
            "active requests (GPU KV cache, GPU memory)", "reusable blocks (tier at the knee)",
            "RAM left for the tier")]
    assert "cpu_bytes_to_use: unknown" in text
    assert "offloading backend  unknown" in text


def test_without_a_curve_the_sections_say_so() -> None:
    text = render(build_plan(doc_twice(), PlanInputs()), "md")
    assert "### Predicted hit rates\nunknown (see warnings)" in text
    assert "### Recommendation\nnone (see warnings)" in text
    assert "Offload admission" not in text


def test_warnings_then_notes_are_listed_last() -> None:
    plan = _plan()
    plan["warnings"], plan["notes"] = ["w1", "w2"], ["n1"]
    assert render(plan, "table").endswith("Warnings and notes\n- WARNING: w1\n- WARNING: w2\n- note: n1\n")
    plan["warnings"], plan["notes"] = [], []
    assert "Warnings and notes" not in render(plan, "table")


@pytest.mark.parametrize(("seconds", "name"), [
    (600.0, "10m"), (3600.0, "1h"), (86400.0, "24h"), (172800.0, "2d"), (90.0, "90s"), (5400.0, "90m"),
    (45.5, "46s"), (7200.0, "2h"),
])
def test_windows_are_named_in_the_largest_whole_unit(seconds: float, name: str) -> None:
    rows = _section(render(_plan(windows_s=(seconds,)), "md"), "Working set")
    assert rows[3].startswith(f"| {name} |")


def test_the_admission_section_counts_refused_requests() -> None:
    lines = _section(render(_plan(), "table"), "Offload admission")
    assert lines[0] == ("Offload admission on this traffic (tier at the knee; `returning`, window 1h, min_seen 1): "
                        "1 of 2 requests would store nothing")
    assert [line.split()[0] for line in lines[3:]] == ["without", "with"]


def test_the_offloading_size_is_shown_when_the_server_says_it() -> None:
    server = type(ONE_BLOCK_GPU)(**{**ONE_BLOCK_GPU.__dict__, "offloading_size_gib": 12.0})
    assert "kv_offloading_size 12.0 GiB" in render(_plan(server=server), "table")
    assert "kv_offloading_size not set" in render(_plan(), "table")
