"""The per-source sequence state machine driven through whole streams (every verdict from every state), the
replay judgement of the subscriber's first replayed batch, and the source plan the policy set yields."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kvevents.endpoints import NoNextPortError, SourceSpec, connect_address, next_port, plan_sources
from gateway.kvevents.sequence import Arrival, Cursor, SequenceTracker, Verdict
from gateway.kvevents.subscriber import _judge_first
from gateway.kvevents.wire import Envelope, EventBatch
from gateway.policy.model import GatewayConfig

Step = tuple[int, float, bytes]


def run(steps: list[Step], remembered: int = 20_000) -> list[Verdict]:
    """Feed arrivals as the subscriber does: every verdict but DUPLICATE and UNCERTAIN is accepted (a RESTART
    after the tracker forgets)."""
    tracker = SequenceTracker(remembered=remembered)
    verdicts = []
    for seq, ts, publisher in steps:
        verdict = tracker.classify(seq, ts, publisher).verdict
        verdicts.append(verdict)
        if verdict is Verdict.RESTART:
            tracker.forget()
        if verdict not in (Verdict.DUPLICATE, Verdict.UNCERTAIN):
            tracker.accept(seq, ts, publisher)
    return verdicts


N, D, G, R, U = Verdict.NEXT, Verdict.DUPLICATE, Verdict.GAP, Verdict.RESTART, Verdict.UNCERTAIN


@pytest.mark.parametrize(("steps", "verdicts"), [
    ([], []),
    ([(0, 1.0, b"")], [N]),
    ([(0, 1.0, b""), (1, 1.0, b""), (2, 2.0, b"")], [N, N, N]),
    ([(3, 1.0, b"")], [G]),  # a subscriber that joins late sees 0..2 missing
    ([(0, 1.0, b""), (0, 1.0, b"")], [N, D]),  # the live copy of a replayed batch
    ([(0, 1.0, b""), (1, 2.0, b""), (0, 1.0, b"")], [N, N, D]),
    ([(0, 1.0, b""), (1, 2.0, b""), (0, 9.0, b"")], [N, N, R]),  # seq 0 again with another batch: a new process
    ([(0, 1.0, b""), (1, 2.0, b""), (0, 0.5, b"")], [N, N, R]),  # a new host's clock may be behind
    ([(0, 1.0, b""), (5, 2.0, b""), (6, 3.0, b"")], [N, G, N]),
    ([(0, 1.0, b"a"), (1, 2.0, b"b"), (2, 3.0, b"b"), (0, 1.0, b"b")], [N, R, N, U]),  # a new id: restart
    ([(0, 1.0, b"a"), (1, 2.0, b"a"), (2, 3.0, b"")], [N, N, N]),  # a batch without an id proves nothing
    ([(0, 1.0, b""), (1, 2.0, b"a"), (2, 3.0, b"b")], [N, N, R]),
])
def test_streams_of_arrivals_get_their_verdicts(steps: list[Step], verdicts: list[Verdict]) -> None:
    assert run(steps) == verdicts


def test_a_seq_pushed_out_of_memory_is_uncertain_not_a_duplicate() -> None:
    steps = [(seq, float(seq), b"") for seq in range(5)] + [(0, 0.0, b""), (3, 3.0, b""), (2, 99.0, b"")]
    assert run(steps, remembered=3) == [N] * 5 + [U, D, R]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=30))
def test_increasing_sequences_are_next_or_gaps_counting_exactly_the_skipped(steps: list[int]) -> None:
    tracker = SequenceTracker()
    seq, missing = -1, 0
    for step in steps:
        seq += step
        arrival = tracker.classify(seq, float(seq))
        assert arrival.verdict is (Verdict.NEXT if step == 1 else Verdict.GAP)
        missing += arrival.missing
        tracker.accept(seq, float(seq))
    assert missing == seq + 1 - len(steps)  # every number not delivered was reported missing, once


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 10))
def test_memory_holds_exactly_the_latest_batches(accepted: int, limit: int) -> None:
    tracker = SequenceTracker(remembered=limit)
    for seq in range(accepted):
        tracker.accept(seq, float(seq) + 0.5)
    for seq in range(accepted):
        remembered = seq >= accepted - limit
        assert tracker.same_batch(seq, float(seq) + 0.5) is (True if remembered else None)
        assert tracker.same_batch(seq, -1.0) is (False if remembered else None)


def test_a_resumed_cursor_is_remembered_and_expects_the_next_number() -> None:
    tracker = SequenceTracker(Cursor(41, 5.0, b"p"))
    assert (tracker.expected, tracker.same_batch(41, 5.0), tracker.same_batch(40, 5.0)) == (42, True, None)
    assert tracker.classify(41, 5.0, b"p") == Arrival(Verdict.DUPLICATE)
    assert tracker.classify(43, 6.0, b"p") == Arrival(Verdict.GAP, 42, 42)


def test_a_re_accepted_seq_moves_to_the_newest_end_of_memory() -> None:
    tracker = SequenceTracker(remembered=2)
    tracker.accept(0, 0.0)
    tracker.accept(1, 1.0)
    tracker.accept(0, 0.0)  # replay overlap handled again
    tracker.accept(2, 2.0)  # pushes out the oldest, which is now 1
    assert (tracker.same_batch(0, 0.0), tracker.same_batch(1, 1.0)) == (True, None)


# --- judging replay's first batch -----------------------------------------------------------------------------


CURSOR = Cursor(10, 100.0)


@pytest.mark.parametrize(("seq", "batch", "judged"), [
    (10, EventBatch(100.0, []), "proven"),  # the cursor's own batch: continuity
    (10, EventBatch(100.5, []), "restart"),  # another batch at the cursor's number
    (10, None, "restart"),  # undecodable at the cursor's number: not the batch handled
    (11, EventBatch(101.0, []), "presumed"),  # the cursor's batch is gone, later ones exist
    (11, None, "presumed"),
    (9, EventBatch(100.0, []), "presumed"),
])
def test_replays_first_batch_is_judged_against_the_cursor(seq: int, batch: EventBatch | None, judged: str) -> None:
    assert _judge_first(CURSOR, Envelope(seq, b""), batch) == judged


# --- sources the policy names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("endpoint", "address"), [
    ("tcp://*:5557", "tcp://127.0.0.1:5557"),
    ("tcp://0.0.0.0:5557", "tcp://127.0.0.1:5557"),
    ("tcp://[::]:5557", "tcp://127.0.0.1:5557"),
    ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5557"),
    ("tcp://[::1]:5557", "tcp://[::1]:5557"),
    ("tcp://vllm-0.pool.svc:5557", "tcp://vllm-0.pool.svc:5557"),
    ("ipc:///tmp/kv.sock", "ipc:///tmp/kv.sock"),
    ("*:5557", "*:5557"),  # no scheme: left as written (zmq will refuse it loudly)
    ("tcp://*", "tcp://*"),  # no port: nothing to rewrite
])
def test_bind_style_addresses_are_read_as_this_host(endpoint: str, address: str) -> None:
    assert connect_address(endpoint) == address


@pytest.mark.parametrize(("endpoint", "replay"), [
    ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
    ("tcp://127.0.0.1:65534", "tcp://127.0.0.1:65535"),
    ("tcp://[::1]:9", "tcp://[::1]:10"),
    ("tcp://host:0099", "tcp://host:100"),
    ("tcp://host:port", None),
    ("tcp://host:", None),
    ("tcp://host", None),
    ("ipc:///tmp/kv:5557", None),  # only tcp has a next port
])
def test_the_replay_port_is_the_next_one_when_it_can_be_derived(endpoint: str, replay: str | None) -> None:
    assert next_port(endpoint) == replay


@pytest.mark.parametrize("endpoint", ["tcp://h:65535", "tcp://[::1]:65535", "tcp://h:70000"])
def test_the_last_tcp_port_has_no_next_port(endpoint: str) -> None:
    """Wrong version: port + 1 = 65536, an address zmq cannot connect to, found only when replay is first asked."""
    with pytest.raises(NoNextPortError, match="no next port"):
        next_port(endpoint)


def gateway_with(pools: dict[str, object]) -> GatewayConfig:
    return GatewayConfig.model_validate({"pools": pools, "default_pool": next(iter(pools))})


@pytest.mark.parametrize(("pool", "expected"), [
    ({"upstreams": ["http://a"], "kv_events": ["tcp://*:1"]},
     [SourceSpec("p/0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "vllm")]),
    ({"upstreams": ["http://a"], "connector": "lmcache", "kv_events": ["tcp://h:1"]},
     [SourceSpec("p/0", "tcp://h:1", "tcp://h:2", "lmcache")]),
    ({"upstreams": ["http://a"], "connector": "lmcache-mp", "kv_events": ["tcp://h:1"]},
     [SourceSpec("p/0", "tcp://h:1", "tcp://h:2", "lmcache")]),
    ({"upstreams": ["http://a"], "connector": "lmcache", "kv_events": [{"endpoint": "tcp://h:1", "format": "vllm"}]},
     [SourceSpec("p/0", "tcp://h:1", "tcp://h:2", "vllm")]),  # a named format wins over the connector
    ({"upstreams": ["http://a"], "kv_events": [{"endpoint": "tcp://h:1", "format": "lmcache"}]},
     [SourceSpec("p/0", "tcp://h:1", "tcp://h:2", "lmcache")]),
    ({"upstreams": ["http://a"], "kv_events": [{"endpoint": "tcp://*:1", "replay": "tcp://*:9"}]},
     [SourceSpec("p/0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:9", "vllm")]),
    ({"upstreams": ["http://a"], "kv_events": [{"endpoint": "ipc:///x", "replay": "ipc:///y"}, "ipc:///z"]},
     [SourceSpec("p/0", "ipc:///x", "ipc:///y"), SourceSpec("p/1", "ipc:///z", None)]),
    ({"upstreams": ["http://a"]}, []),
])
def test_each_pool_entry_becomes_one_named_source(pool: dict[str, object], expected: list[SourceSpec]) -> None:
    assert plan_sources(gateway_with({"p": pool})) == expected


def test_sources_of_several_pools_keep_the_pools_order() -> None:
    gateway = gateway_with({"b": {"upstreams": ["http://b"], "kv_events": ["tcp://h:1", "tcp://h:3"]},
                            "a": {"upstreams": ["http://a"], "kv_events": ["tcp://h:5"]}})
    assert [spec.name for spec in plan_sources(gateway)] == ["b/0", "b/1", "a/0"]


@pytest.mark.parametrize("entry", [{"endpoint": "tcp://h:1", "format": "json"}, {"endpoint": "tcp://h:1", "x": 1},
                                   {"replay": "tcp://h:2"}])
def test_a_malformed_source_entry_is_refused_by_the_policy_model(entry: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="kv_events"):
        gateway_with({"p": {"upstreams": ["http://a"], "kv_events": [entry]}})


@pytest.mark.parametrize(("entry", "words"), [
    ("tcp://h:65535", "leaves no port \\+ 1 for replay"),
    ("tcp://*:65535", "leaves no port \\+ 1 for replay"),
    ({"endpoint": "tcp://h:65535"}, "leaves no port \\+ 1 for replay"),
    ("tcp://h:65536", "not a TCP port"),
])
def test_a_top_port_source_without_a_replay_endpoint_is_refused_by_the_policy_model(
    entry: str | dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        gateway_with({"p": {"upstreams": ["http://a"], "kv_events": [entry]}})


def test_a_top_port_source_with_its_own_replay_endpoint_is_accepted() -> None:
    pool = {"upstreams": ["http://a"], "kv_events": [{"endpoint": "tcp://h:65535", "replay": "tcp://h:65534"}]}
    assert plan_sources(gateway_with({"p": pool})) == [SourceSpec("p/0", "tcp://h:65535", "tcp://h:65534")]
