"""KV-event builders (pure) against the bytes real vLLM 0.25.0 sent: every captured message is rebuilt from its
decoded values with the simulator's builders and must re-encode to the identical msgpack payload (field order,
null fields, integer widths, salt placement), for the control, offload, CLI-offload and LMCache servers."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.sim import kv_events
from gateway.sim.kv_events import Event, NullSink
from tests.unit.sim.captures import decode_payload, kv_event_frames, replay_exchange

_encode = msgspec.msgpack.Encoder().encode


def rebuilt(event: dict[str, Any]) -> Event:
    """The simulator's builder for a captured event, fed only the captured values."""
    kind = event["type"]
    if kind == "AllBlocksCleared":
        return kv_events.all_cleared()
    medium: str = event["medium"]
    if kind == "BlockRemoved":
        if medium == "GPU" and len(event["block_hashes"]) == 1:
            return kv_events.gpu_removed(event["block_hashes"][0])
        return kv_events.removed(event["block_hashes"], medium)
    if medium == "GPU":
        root_keys = event["extra_keys"][0]
        salt = root_keys[0] if root_keys else None
        return kv_events.gpu_stored(event["block_hashes"], event["parent_block_hash"], event["token_ids"],
                                    event["block_size"], salt)
    if medium == "CPU" and event["block_size"] == 0:
        return kv_events.cpu_placeholder(event["block_hashes"][0])
    if medium == "CPU":
        return kv_events.cpu_self_describing(event["block_hashes"], event["parent_block_hash"], event["token_ids"],
                                             event["block_size"])
    (chunk_hash,) = event["block_hashes"]
    return kv_events.lmcache_stored(chunk_hash, event["parent_block_hash"], event["token_ids"], event["block_size"],
                                    medium)


@pytest.mark.parametrize("server", ["control", "offload", "cli", "lmcache"])
def test_every_captured_message_re_encodes_byte_for_byte(server: str) -> None:
    frames = kv_event_frames(server)
    assert len(frames) >= 4
    kinds: set[tuple[str, str | None]] = set()
    for topic, seq, payload in frames:
        assert topic == b"kv" and len(seq) == 8
        ts, events, rank = decode_payload(payload)
        kinds |= {(e["type"], e.get("medium")) for e in events}
        assert _encode([ts, [rebuilt(e) for e in events], rank]) == payload
    assert ("BlockStored", "GPU") in kinds  # every capture starts with a GPU store


def test_the_captures_cover_every_builder() -> None:
    seen: set[tuple[str, str | None, int]] = set()
    for server in ("control", "offload", "cli", "lmcache"):
        for _, _, payload in kv_event_frames(server):
            seen |= {(e["type"], e.get("medium"), e.get("block_size", -1)) for e in decode_payload(payload)[1]}
    assert {("BlockStored", "GPU", 16), ("BlockStored", "CPU", 0), ("BlockRemoved", "GPU", -1),
            ("BlockRemoved", "CPU", -1), ("BlockStored", "cpu", 256)} <= seen


def test_salted_gpu_stores_were_captured_and_re_encode() -> None:
    salted = [e for _, _, p in kv_event_frames("offload") for e in decode_payload(p)[1]
              if e["type"] == "BlockStored" and e["medium"] == "GPU" and e["extra_keys"][0]]
    assert salted
    for event in salted:
        assert event["parent_block_hash"] is None  # only a chain's root block carries the salt
        assert event["extra_keys"][1:] == [None] * (len(event["block_hashes"]) - 1)
        assert _encode(rebuilt(event)) == _encode(event)


def test_the_replayed_payloads_re_encode_too() -> None:
    """The replay exchange kept two whole payloads: a GPU removal and a batch of CPU placeholders."""
    replies = [r for r in replay_exchange("offload")["replies"] if r.get("payload_hex") and r["seq"] >= 0]
    assert len(replies) == 2
    for reply in replies:
        payload = bytes.fromhex(reply["payload_hex"])
        ts, events, rank = decode_payload(payload)
        assert _encode([ts, [rebuilt(e) for e in events], rank]) == payload


def test_gpu_stored_puts_the_salt_on_the_root_block_only() -> None:
    event = kv_events.gpu_stored([11, 12, 13], None, list(range(48)), 16, "tenant-a")
    assert event["extra_keys"] == [["tenant-a"], None, None]
    assert list(event) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                           "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"]
    assert (event["medium"], event["group_idx"], event["kv_cache_spec_kind"]) == ("GPU", 0, "full_attention")


@pytest.mark.parametrize(
    ("parent", "salt", "root_keys"),
    [(None, None, None), (None, "", None), (99, "tenant-a", None), (None, "t", ["t"])],
)
def test_gpu_stored_extra_keys(parent: int | None, salt: str | None, root_keys: list[str] | None) -> None:
    """A continuation (a parent) is not a chain root, so it carries no salt even when the request had one."""
    event = kv_events.gpu_stored([1, 2], parent, [0] * 32, 16, salt)
    assert event["extra_keys"] == [root_keys, None]
    assert event["parent_block_hash"] == parent


def test_cpu_events_never_carry_extra_keys() -> None:
    placeholder = kv_events.cpu_placeholder(7)
    assert placeholder == {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [],
                           "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0}
    described = kv_events.cpu_self_describing([1, 2, 3, 4], 9, list(range(64)), 16)
    assert "extra_keys" not in described
    assert (described["parent_block_hash"], described["block_size"], described["kv_cache_spec_kind"]) == (
        9, 16, "full_attention")


def test_lmcache_stored_has_only_the_base_fields() -> None:
    event = kv_events.lmcache_stored(5, None, [1, 2], 256, "disk")
    assert list(event) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                           "medium", "lora_name"]
    assert (event["block_hashes"], event["medium"], event["block_size"]) == ([5], "disk", 256)


def test_removed_and_cleared_shapes() -> None:
    assert kv_events.gpu_removed(3) == {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU", "group_idx": 0}
    assert kv_events.removed([1, 2], "CPU") == {"type": "BlockRemoved", "block_hashes": [1, 2], "medium": "CPU",
                                                "group_idx": 0}
    assert kv_events.all_cleared() == {"type": "AllBlocksCleared"}  # no medium, as vLLM sends it


def test_builders_copy_their_inputs() -> None:
    hashes, tokens = [1, 2], [5] * 32
    event = kv_events.gpu_stored(hashes, None, tokens, 16, None)
    hashes.append(3)
    tokens.clear()
    assert (event["block_hashes"], len(event["token_ids"])) == ([1, 2], 32)


def test_the_largest_uint64_hash_encodes_as_msgpack_uint64() -> None:
    encoded = _encode(kv_events.gpu_removed(2**64 - 1))
    assert b"\xcf" + b"\xff" * 8 in encoded
    assert decode_payload(_encode([0.0, [kv_events.gpu_removed(2**64 - 1)], 0]))[1][0]["block_hashes"] == [2**64 - 1]


def test_the_null_sink_is_disabled_and_accepts_anything() -> None:
    sink = NullSink()
    assert sink.enabled is False
    sink.publish([kv_events.all_cleared()], "owner")  # a no-op that must not raise
