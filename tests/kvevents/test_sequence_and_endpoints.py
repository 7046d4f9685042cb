"""Sequence verdicts and source addresses (pure)."""

from __future__ import annotations

from gateway.kvevents.endpoints import SourceSpec, connect_address, plan_sources
from gateway.kvevents.sequence import Arrival, Cursor, SequenceTracker, Verdict
from gateway.policy.model import GatewayConfig


def test_verdicts() -> None:
    tracker = SequenceTracker()
    assert tracker.classify(0, 10.0) == Arrival(Verdict.NEXT)
    assert tracker.classify(3, 10.0) == Arrival(Verdict.GAP, 0, 2)
    for seq in range(5):
        tracker.accept(seq, 10.0 + seq)
    assert tracker.expected == 5
    assert tracker.classify(4, 14.0).verdict is Verdict.DUPLICATE  # the live copy of a replayed batch
    assert tracker.classify(2, 12.0).verdict is Verdict.DUPLICATE
    assert tracker.classify(0, 11.0).verdict is Verdict.RESTART  # seq 0 was another batch: a new process
    # A restarted publisher whose clock is behind: an earlier time is no reason to call it a duplicate.
    assert tracker.classify(1, 3.0).verdict is Verdict.RESTART
    # Below the cursor and no longer remembered (e.g. after a gateway restart): only replay can tell.
    assert SequenceTracker(Cursor(9, 1.0)).classify(3, 0.5).verdict is Verdict.UNCERTAIN
    assert SequenceTracker(Cursor(9, 1.0, b"a")).classify(10, 2.0, b"b").verdict is Verdict.RESTART


def test_the_tracker_remembers_a_bounded_number_of_batches() -> None:
    tracker = SequenceTracker(remembered=3)
    for seq in range(6):
        tracker.accept(seq, float(seq))
    assert tracker.same_batch(5, 5.0) and tracker.same_batch(3, 3.0)
    assert tracker.same_batch(2, 2.0) is None
    assert tracker.classify(2, 2.0).verdict is Verdict.UNCERTAIN
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
