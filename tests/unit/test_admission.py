"""The admission doorkeeper, its replay API for `kvgate plan`, the recompute choice, and the policy fields."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gateway.policy.loader import PolicyLoadError, load_policy_set
from gateway.proxy.misspath import honours_max_load_tokens, recompute_body
from gateway.reuse.admission import (
    COUNTER_MAX,
    AdmissionEvent,
    AdmissionRule,
    Doorkeeper,
    admission_key,
    prefix_span,
    prompt_key,
    simulate_admission,
)
from gateway.reuse.fingerprint import canonical_parts, fingerprints, tenant_trace_key

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"
RETURNING = AdmissionRule("returning", window_s=100.0, min_seen=1, prefix_chunks=4)
KEY = tenant_trace_key(b"secret", "acme")


def chain(doc: int, chunks: int = 8) -> list[bytes]:
    tokens = [(doc * 1000 + i) % 30000 + 3 for i in range(chunks * 64)]
    return fingerprints(KEY, tokens, 64, 4.0)


def test_the_key_is_the_fingerprint_at_prefix_chunks_and_ignores_what_follows() -> None:
    long, short = chain(1, 8), chain(1, 2)
    assert admission_key(long, 4) == long[3]
    assert admission_key(short, 4) == short[1]  # shorter prompts: their last whole chunk
    assert admission_key([], 4) is None
    tokens = [(1000 + i) % 30000 + 3 for i in range(8 * 64)]
    assert prompt_key(KEY, tokens, 4) == long[3]
    assert prompt_key(KEY, [*tokens[:256], 5, 6, 7], 4) == long[3]


@pytest.mark.parametrize("request_body", [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "é" * 600 + "x" * 900}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 500}, {"text": "b" * 700}]}, "no"]},
    {"messages": [{"role": "user", "content": "x" * 1023}, {"role": "assistant", "content": "y" * 5}]},
    {"messages": [{"role": "user", "content": "short"}]},
    {"prompt": "p" * 5000},
    {"prompt": list(range(3, 1000))},
    {"prompt": list(range(3, 100))},
])
@pytest.mark.parametrize("prefix_chunks", [1, 4, 7])
def test_the_key_from_the_leading_span_is_the_key_from_the_whole_prompt(
    request_body: dict[str, object], prefix_chunks: int
) -> None:
    parts = canonical_parts(request_body)
    assert parts is not None
    whole = prompt_key(KEY, parts.whole(), prefix_chunks)
    assert prompt_key(KEY, prefix_span(parts, prefix_chunks), prefix_chunks) == whole


def test_new_then_returning_and_the_window_forgets() -> None:
    events = [AdmissionEvent(t, "acme", chain(1)) for t in (0.0, 10.0, 20.0)]
    events.append(AdmissionEvent(500.0, "acme", chain(1)))  # more than a window later
    decisions = simulate_admission(events, RETURNING)
    assert [d.decision if d else None for d in decisions] == ["new", "returning", "returning", "new"]
    assert [d.seen if d else None for d in decisions] == [0, 1, 2, 0]


def test_a_count_survives_one_generation_roll() -> None:
    # Generations are half a window: seen at 40 s, the count is still there at 60 s (next generation).
    decisions = simulate_admission([AdmissionEvent(40.0, "acme", chain(2)), AdmissionEvent(60.0, "acme", chain(2))],
                                   RETURNING)
    assert [d.decision if d else None for d in decisions] == ["new", "returning"]


def test_min_seen_short_prompts_and_tenants_left_at_all() -> None:
    rules = {"acme": AdmissionRule("returning", 100.0, 2, 4), "globex": AdmissionRule()}
    events = [AdmissionEvent(float(t), "acme", chain(3)) for t in range(3)]
    events += [AdmissionEvent(5.0, "acme", []), AdmissionEvent(6.0, "globex", chain(3))]
    decisions = simulate_admission(events, rules)
    assert [d.decision if d else None for d in decisions] == ["new", "new", "returning", "short", None]


def test_tenants_and_documents_do_not_mix() -> None:
    other_tenant = fingerprints(tenant_trace_key(b"secret", "globex"), [(1000 + i) % 30000 + 3 for i in range(512)],
                                64, 4.0)
    events = [AdmissionEvent(0.0, "acme", chain(1)), AdmissionEvent(1.0, "acme", chain(9)),
              AdmissionEvent(2.0, "globex", other_tenant)]
    assert [d.decision if d else None for d in simulate_admission(events, RETURNING)] == ["new", "new", "new"]


def test_counters_saturate_and_memory_is_fixed() -> None:
    keeper = Doorkeeper(1024)
    key = chain(4)[3]
    for _ in range(COUNTER_MAX + 20):
        keeper.observe(key, 0.0, 100.0)
    assert keeper.observe(key, 0.0, 100.0) == COUNTER_MAX
    assert keeper.memory_bytes == 2 * 4 * 1024
    for doc in range(2000):
        keeper.observe(chain(doc, 1)[0], 1.0, 100.0)
    assert keeper.memory_bytes == 2 * 4 * 1024
    with pytest.raises(ValueError):
        Doorkeeper(1000)


def test_replay_matches_live_decisions_of_one_keeper() -> None:
    keeper = Doorkeeper()
    docs = [1, 2, 1, 3, 2, 1, 4]
    live = []
    for step, doc in enumerate(docs):
        seen = keeper.observe(admission_key(chain(doc), 4) or b"", float(step), 100.0)
        live.append("returning" if seen >= 1 else "new")
    replayed = simulate_admission([AdmissionEvent(float(i), "acme", chain(d)) for i, d in enumerate(docs)], RETURNING)
    assert [d.decision if d else None for d in replayed] == live == [
        "new", "new", "returning", "new", "returning", "returning", "new"]


def test_versions_that_honour_max_load_tokens() -> None:
    assert not honours_max_load_tokens("0.25.0")
    assert honours_max_load_tokens("0.32.0") and honours_max_load_tokens("v0.33.1rc1")
    assert not honours_max_load_tokens("main") and not honours_max_load_tokens("")


def test_recompute_bodies() -> None:
    body = b'{"prompt":"x","cache_salt":"s","kv_transfer_params":{"max_offload_tokens":64}}'
    assert recompute_body(body, "max_load_tokens", "t") == (
        b'{"prompt":"x","cache_salt":"s","kv_transfer_params":{"max_offload_tokens":64,"max_load_tokens":0}}')
    assert recompute_body(body, "salt", "t") == (
        b'{"prompt":"x","cache_salt":"t","kv_transfer_params":{"max_offload_tokens":0}}')


def _load_with(tmp_path: Path, tenant: str, offload: dict[str, object], pool: dict[str, object] | None = None) -> None:
    target = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, target)
    path = target / "tenants" / f"{tenant}.yaml"
    data = yaml.safe_load(path.read_text())
    data["offload"] = {**data.get("offload", {}), **offload}
    path.write_text(yaml.safe_dump(data))
    if pool is not None:
        gateway_path = target / "gateway.yaml"
        gateway = yaml.safe_load(gateway_path.read_text())
        first = next(iter(gateway["pools"]))
        gateway["pools"][first].update(pool)
        gateway_path.write_text(yaml.safe_dump(gateway))
    load_policy_set(target)


def test_policy_fields_validate(tmp_path: Path) -> None:
    _load_with(tmp_path / "a", "acme", {"admission": "returning", "miss_path": "retry"}, {"recompute": "salt"})
    _load_with(tmp_path / "b", "acme", {"admission": {"mode": "returning", "window_s": 60, "min_seen": 3}})
    broken: list[tuple[dict[str, object], str]] = [
        ({"admission": "sometimes"}, "admission"),
        ({"admission": {"mode": "returning", "min_seen": 0}}, "min_seen"),
        ({"admission": {"mode": "returning", "window_s": -1}}, "window_s"),
        ({"miss_path": "always"}, "miss_path"),
    ]
    for index, (offload, field) in enumerate(broken):
        with pytest.raises(PolicyLoadError) as raised:
            _load_with(tmp_path / f"bad{index}", "acme", offload)
        assert any(field in problem and "acme.yaml" in problem for problem in raised.value.problems)
    with pytest.raises(PolicyLoadError) as raised:
        _load_with(tmp_path / "badpool", "acme", {}, {"recompute": "maybe"})
    assert any("recompute" in problem for problem in raised.value.problems)
