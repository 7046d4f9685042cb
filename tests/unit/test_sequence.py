"""Sequence tracking per KV-event source, every verdict and its boundary (pure)."""

from __future__ import annotations

from gateway.kvevents.sequence import Arrival, Cursor, SequenceTracker, Verdict


def test_a_fresh_tracker_wants_batch_zero() -> None:
    tracker = SequenceTracker()
    assert tracker.expected == 0
    assert tracker.classify(0, 1.0) == Arrival(Verdict.NEXT)
    assert tracker.classify(1, 1.0) == Arrival(Verdict.GAP, 0, 0)
    assert tracker.classify(5, 1.0) == Arrival(Verdict.GAP, 0, 4)


def test_next_gap_and_duplicate_after_a_cursor() -> None:
    tracker = SequenceTracker(Cursor(4, 10.0))
    assert tracker.expected == 5
    assert tracker.classify(5, 10.0) == Arrival(Verdict.NEXT)
    assert tracker.classify(6, 10.0) == Arrival(Verdict.GAP, 5, 5)
    assert tracker.classify(9, 11.0) == Arrival(Verdict.GAP, 5, 8)
    assert tracker.classify(4, 10.0) == Arrival(Verdict.DUPLICATE)  # same seq, same time: the live copy
    # Below the cursor and not remembered (only the cursor's batch is): replay must prove what it is.
    assert tracker.classify(3, 9.0) == Arrival(Verdict.UNCERTAIN)
    tracker.accept(5, 10.0)
    assert tracker.classify(5, 10.0) == Arrival(Verdict.DUPLICATE)  # remembered: replay overlap


def test_a_remembered_seq_with_another_time_is_a_restart_whatever_the_clock() -> None:
    tracker = SequenceTracker(Cursor(4, 10.0))
    assert tracker.classify(4, 10.5) == Arrival(Verdict.RESTART)
    assert tracker.classify(4, 3.0) == Arrival(Verdict.RESTART)  # a new host's clock may be behind
    assert tracker.classify(0, 10.5) == Arrival(Verdict.UNCERTAIN)  # not remembered: proven through replay
    assert tracker.classify(5, 10.5) == Arrival(Verdict.NEXT)  # a higher seq is never a restart by time


def test_a_new_publisher_id_is_a_restart_whatever_the_numbers() -> None:
    tracker = SequenceTracker(Cursor(4, 10.0, b"old"))
    assert tracker.classify(5, 10.0, b"new") == Arrival(Verdict.RESTART)
    assert tracker.classify(5, 10.0, b"old") == Arrival(Verdict.NEXT)
    assert tracker.classify(5, 10.0, b"") == Arrival(Verdict.NEXT)  # publishers without an id
    assert SequenceTracker(Cursor(4, 10.0, b"")).classify(5, 10.0, b"new") == Arrival(Verdict.NEXT)


def test_accept_and_forget_move_the_cursor() -> None:
    tracker = SequenceTracker()
    tracker.accept(7, 3.0, b"p")
    assert tracker.cursor == Cursor(7, 3.0, b"p")
    assert tracker.expected == 8
    tracker.forget()
    assert tracker.cursor is None
    assert tracker.expected == 0
    assert tracker.classify(0, 1.0) == Arrival(Verdict.NEXT)  # a forgotten cursor sees no restart


def test_missing_counts_the_batches_of_a_gap() -> None:
    assert Arrival(Verdict.GAP, 3, 5).missing == 3
    assert Arrival(Verdict.GAP, 5, 5).missing == 1
    assert Arrival(Verdict.NEXT).missing == 0
    assert Arrival(Verdict.GAP, 6, 2).missing == 0
    assert Arrival(Verdict.DUPLICATE) == Arrival(Verdict.DUPLICATE, 0, -1)


def test_without_a_publisher_id_no_restart_is_inferred_from_the_id() -> None:
    assert SequenceTracker(Cursor(4, 10.0, b"old")).classify(5, 10.0) == Arrival(Verdict.NEXT)
    tracker = SequenceTracker()
    tracker.accept(1, 2.0)
    assert tracker.cursor == Cursor(1, 2.0, b"")
