"""Sequence verdicts and source addresses (pure)."""

from __future__ import annotations

from gateway.kvevents.endpoints import SourceSpec, connect_address, plan_sources
from gateway.kvevents.sequence import Arrival, Cursor, SequenceTracker, Verdict
from gateway.policy.model import GatewayConfig


def test_verdicts() -> None:
    tracker = SequenceTracker()
    assert tracker.classify(0, 10.0) == Arrival(Verdict.NEXT)
    assert tracker.classify(3, 10.0) == Arrival(Verdict.GAP, 0, 2)
    tracker.accept(4, 10.0)
    assert tracker.expected == 5
    assert tracker.classify(4, 10.0).verdict is Verdict.DUPLICATE  # the live copy of a replayed batch
    assert tracker.classify(2, 9.0).verdict is Verdict.DUPLICATE
    assert tracker.classify(0, 11.0).verdict is Verdict.RESTART  # lower seq, later time: a new process
    assert SequenceTracker(Cursor(9, 1.0, b"a")).classify(10, 2.0, b"b").verdict is Verdict.RESTART
    assert Arrival(Verdict.GAP, 3, 5).missing == 3


def test_sources_are_named_by_pool_and_index_and_replay_is_the_next_port() -> None:
    gateway = GatewayConfig.model_validate({
        "pools": {"offload": {"upstreams": ["http://a"], "kv_events": [
            "tcp://*:5557", {"endpoint": "tcp://10.0.0.5:6000", "replay": "tcp://10.0.0.5:7000"}, "ipc:///tmp/kv"]},
            "control": {"upstreams": ["http://b"]}},
        "default_pool": "offload"})
    assert plan_sources(gateway) == [
        SourceSpec("offload/0", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
        SourceSpec("offload/1", "tcp://10.0.0.5:6000", "tcp://10.0.0.5:7000"),
        SourceSpec("offload/2", "ipc:///tmp/kv", None),
    ]
    assert connect_address("tcp://[::1]:5557") == "tcp://[::1]:5557"
