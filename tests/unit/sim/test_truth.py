"""The emitted truth behind `GET /sim/kv-truth` (pure): who owns a stored block, what a removal or a clear ends,
and the per-salt, per-medium tallies a ledger is checked against."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim import kv_events
from gateway.sim.kv_events import Event
from gateway.sim.truth import NO_SALT, EmittedTruth


def gpu(*hashes: int) -> Event:
    return kv_events.gpu_stored(list(hashes), None, [0] * 16 * len(hashes), 16, None)


def cpu(key: int) -> Event:
    return kv_events.cpu_placeholder(key)


def tally(stored: int, removed: int) -> dict[str, int]:
    return {"stored": stored, "removed": removed, "resident": stored - removed}


def test_an_empty_truth() -> None:
    assert EmittedTruth().view() == {"batches_sent": 0, "by_salt": {}}


def test_a_stored_block_belongs_to_the_batch_owner_and_unowned_batches_to_no_salt() -> None:
    truth = EmittedTruth()
    truth.sent([gpu(1, 2)], "tenant-a")
    truth.sent([gpu(3)], None)
    assert truth.view()["by_salt"] == {NO_SALT: {"GPU": tally(1, 0)}, "tenant-a": {"GPU": tally(2, 0)}}
    assert truth.resident == {("GPU", 1): "tenant-a", ("GPU", 2): "tenant-a", ("GPU", 3): NO_SALT}


def test_a_re_announced_block_is_counted_once_and_keeps_its_first_owner() -> None:
    """vLLM re-sends a prompt's recomputed last block; the residence it reports has not changed."""
    truth = EmittedTruth()
    truth.sent([gpu(1)], "a")
    truth.sent([gpu(1)], "b")
    assert truth.view()["by_salt"] == {"a": {"GPU": tally(1, 0)}}


def test_a_removal_ends_the_owners_residence_whoever_sent_it() -> None:
    truth = EmittedTruth()
    truth.sent([gpu(1, 2)], "a")
    truth.sent([gpu(3), kv_events.gpu_removed(1)], "b")  # b's step evicted a's block
    assert truth.view()["by_salt"] == {"a": {"GPU": tally(2, 1)}, "b": {"GPU": tally(1, 0)}}
    truth.sent([gpu(1)], "b")  # the same hash stored again later is a new residence, now b's
    assert truth.view()["by_salt"]["b"]["GPU"] == tally(2, 0)


def test_removals_of_unknown_blocks_or_of_another_medium_change_nothing() -> None:
    truth = EmittedTruth()
    truth.sent([gpu(1)], "a")
    truth.sent([kv_events.gpu_removed(99), kv_events.removed([1], "CPU")], None)
    assert truth.view()["by_salt"] == {"a": {"GPU": tally(1, 0)}}
    assert truth.batches == 2


def test_one_hash_on_two_media_is_two_residences() -> None:
    truth = EmittedTruth()
    truth.sent([gpu(4), cpu(4)], "a")
    truth.sent([kv_events.removed([4], "CPU")], None)
    assert truth.view()["by_salt"] == {"a": {"CPU": tally(1, 1), "GPU": tally(1, 0)}}


def test_all_blocks_cleared_ends_every_gpu_residence_and_no_cpu_one() -> None:
    truth = EmittedTruth()
    truth.sent([gpu(1, 2), cpu(2)], "a")
    truth.sent([gpu(3)], "b")
    truth.sent([kv_events.all_cleared()], None)
    assert truth.view()["by_salt"] == {"a": {"CPU": tally(1, 0), "GPU": tally(2, 2)}, "b": {"GPU": tally(1, 1)}}
    assert list(truth.resident) == [("CPU", 2)]


def test_every_batch_counts_even_an_empty_one_and_unknown_events_are_ignored() -> None:
    truth = EmittedTruth()
    truth.sent([], "a")
    truth.sent([{"type": "SomethingNew", "block_hashes": [1], "medium": "GPU"}], "a")
    assert truth.view() == {"batches_sent": 2, "by_salt": {}}


def test_the_view_is_sorted_by_salt_then_medium() -> None:
    truth = EmittedTruth()
    truth.sent([cpu(1)], "z")
    truth.sent([gpu(2)], "a")
    truth.sent([cpu(3)], "a")
    view = truth.view()["by_salt"]
    assert list(view) == ["a", "z"]
    assert list(view["a"]) == ["CPU", "GPU"]


_STEPS = st.lists(
    st.tuples(st.sampled_from(["store-gpu", "store-cpu", "remove-gpu", "remove-cpu", "clear"]),
              st.lists(st.integers(0, 6), min_size=1, max_size=3), st.sampled_from([None, "a", "b"])),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_tallies_agree_with_a_hand_kept_set_of_residences(steps: list[tuple[str, list[int], str | None]]) -> None:
    truth = EmittedTruth()
    model: dict[tuple[str, int], str] = {}
    for action, hashes, owner in steps:
        if action == "clear":
            truth.sent([kv_events.all_cleared()], owner)
            model = {key: who for key, who in model.items() if key[0] != "GPU"}
            continue
        verb, medium = action.split("-")
        medium = medium.upper()
        if verb == "store":
            truth.sent([kv_events.gpu_stored(hashes, None, [], 16, None) if medium == "GPU"
                        else kv_events.cpu_self_describing(hashes, None, [], 16)], owner)
            for block in hashes:
                model.setdefault((medium, block), owner or NO_SALT)
        else:
            truth.sent([kv_events.removed(hashes, medium)], owner)
            for block in hashes:
                model.pop((medium, block), None)
    assert truth.resident == model
    view = truth.view()
    assert view["batches_sent"] == len(steps)
    for salt, media in view["by_salt"].items():
        for medium, counts in media.items():
            held = sum(1 for (where, _), who in model.items() if where == medium and who == salt)
            assert counts["resident"] == held >= 0
            assert counts["stored"] >= counts["removed"]
